/*
 * Helpers shared by the MPI suite programs (the .c files in tests/mpi): failure
 * reports that abort the job, byte patterns that depend on who sent what
 * where, a per-phase watchdog, and the active-message workarounds. Each
 * program defines NAME (its name in PASS/FAIL lines) before including this.
 * Everything is static: each program is one translation unit.
 */
#ifndef UNIMEM_MPI_SUITE_H
#define UNIMEM_MPI_SUITE_H

#ifndef NAME
#error "define NAME (the program's name) before including suite.h"
#endif

#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#define UNUSED __attribute__((unused))
#define KiB 1024
#define MiB (1024 * 1024)

static int rank, nranks;

/* Reports a failure of this rank and aborts the whole job. */
static UNUSED void fail(int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "mpi-suite %s: rank %d: FAIL (%s:%d): ", NAME, rank, __BASE_FILE__, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}
#define CHECK(cond, ...) do { if (!(cond)) fail(__LINE__, __VA_ARGS__); } while (0)

static UNUSED uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* A pattern seed from up to four numbers (sender, receiver, size, step...). */
static UNUSED uint64_t seed_of(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return mix64(mix64(mix64(mix64(a + 0x51) ^ b) ^ c) ^ d);
}

static UNUSED uint64_t pattern_word(uint64_t seed, size_t w)
{
    return mix64(seed + (uint64_t)w * 0x9e3779b97f4a7c15ULL);
}

/* Fills buf with the pattern of `seed`: every byte depends on seed and offset. */
static UNUSED void fill(void *buf, size_t n, uint64_t seed)
{
    unsigned char *p = buf;
    size_t w = 0;
    for (; (w + 1) * 8 <= n; w++) {
        uint64_t v = pattern_word(seed, w);
        memcpy(p + w * 8, &v, 8);
    }
    if (w * 8 < n) {
        uint64_t v = pattern_word(seed, w);
        memcpy(p + w * 8, &v, n - w * 8);
    }
}

/* Checks buf[0..n) against the pattern of `seed`; on a difference, fails
 * with the offset and the context given as printf arguments. */
static UNUSED void check_fill(int line, const void *buf, size_t n, uint64_t seed, const char *fmt, ...)
{
    const unsigned char *p = buf;
    for (size_t w = 0; w * 8 < n; w++) {
        uint64_t v = pattern_word(seed, w);
        unsigned char e[8];
        size_t len = n - w * 8 < 8 ? n - w * 8 : 8;
        memcpy(e, &v, 8);
        if (memcmp(p + w * 8, e, len) == 0)
            continue;
        size_t i = 0;
        while (p[w * 8 + i] == e[i])
            i++;
        char what[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        fail(line, "%s: %zu B, byte %zu is 0x%02x, expected 0x%02x", what, n, w * 8 + i,
             p[w * 8 + i], e[i]);
    }
}

/* Watchdog: phase() names what the rank does now and gives it
 * MPI_SUITE_WATCHDOG seconds (default 60); a rank still in the same phase
 * then reports it and exits, so a hang shows where it is. */
static char watchdog_msg[320];
static size_t watchdog_len;
static unsigned watchdog_s = 60;

static void on_watchdog(int sig)
{
    (void)sig;
    ssize_t r = write(STDERR_FILENO, watchdog_msg, watchdog_len);
    (void)r;
    _exit(3);
}

static UNUSED void phase(const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    alarm(0);
    int len = snprintf(watchdog_msg, sizeof watchdog_msg,
                       "mpi-suite %s: rank %d: FAIL: no progress for %u s in phase: %s\n", NAME,
                       rank, watchdog_s, what);
    watchdog_len = len < 0 ? 0 : (size_t)len < sizeof watchdog_msg ? (size_t)len : sizeof watchdog_msg - 1;
    alarm(watchdog_s);
}

static UNUSED void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fail(__LINE__, "suite.h: out of memory (%zu B)", n);
    return p;
}

static UNUSED void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* MPICH 5.0.2 defects of its active-message (AM) mode, seen with every
 * provider (tcp and shm too). AM mode is MPIR_CVAR_CH4_OFI_ENABLE_TAGGED=0
 * (scripts/mpirun-unimem --am), which also turns MPICH's native RMA off:
 * MPI RMA then rides on active messages. (In native mode MPICH runs RMA on
 * unimem's FI_RMA and FI_ATOMIC, and needs no workaround.) Messages over
 * ~16 KiB take MPICH's AM
 * rendezvous and pipeline, where:
 *  1. a rank must not have two such messages in flight, to one peer or to
 *     two (and in busy all-to-all traffic not even one while it posts
 *     short ones): the receiver gets a segment without its request
 *     ("Assertion failed in mpidig_pt2pt_callbacks.c: rreq", or a crash);
 *  2. a derived datatype whose basic elements straddle the segment
 *     boundaries (a struct of char, int, 3 doubles, short) fails
 *     "Assertion failed in ofi_am_impl.h: packed_size == seg_sz";
 *  3. with MPI_THREAD_MULTIPLE, such messages fail even one at a time per
 *     rank (crashes; a message overtaking an earlier one of the same
 *     thread).
 * Where `avoid_am_bugs` is set (AM mode) the programs keep clear of these:
 * at most one long message in flight per sending rank, such structs not
 * long, threads with messages under 16 KiB; `avoid_rma_bugs` keeps one
 * long RMA operation in flight per rank in AM mode. MPI_SUITE_AM_FULL=1
 * lifts all of it, to see whether MPICH still fails.
 *
 * "Long" starts below 16 KiB: a message's data and MPICH's own headers
 * (24 B plus up to 248 B) share one 16 KiB buffer, and an eager send that
 * has to wait for a buffer or behind a deferred send goes by the pipeline
 * instead. A 16318-byte MPI_Isend in mixed traffic crashed MPICH 5.0.2
 * that way (a segment's payload taken for a request pointer) over
 * libfabric's tcp (2 runs in 60) as over unimem (1 in 40), with 16320 here. */
#define AM_LONG (16384 - 24 - 248)
static int am_mode, avoid_am_bugs, avoid_rma_bugs;
/* Printed before the PASS line when set. */
static const char *suite_note;

static UNUSED int is_am_long(size_t bytes)
{
    return bytes > AM_LONG;
}

/* Whether this job runs in MPICH's active-message mode and whether the
 * workarounds are on (readable before MPI_Init). */
static UNUSED void suite_mode(void)
{
    const char *tagged = getenv("MPIR_CVAR_CH4_OFI_ENABLE_TAGGED");
    const char *full = getenv("MPI_SUITE_AM_FULL");
    int unrestricted = full && strcmp(full, "1") == 0;
    am_mode = tagged && strcmp(tagged, "0") == 0;
    avoid_am_bugs = am_mode && !unrestricted;
    avoid_rma_bugs = am_mode && !unrestricted;
}

static UNUSED void suite_init(int *argc, char ***argv, int thread_level)
{
    int provided = MPI_THREAD_SINGLE;
    suite_mode();
    if (thread_level == MPI_THREAD_SINGLE)
        MPI_Init(argc, argv);
    else
        MPI_Init_thread(argc, argv, thread_level, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    const char *wd = getenv("MPI_SUITE_WATCHDOG");
    if (wd && atoi(wd) > 0)
        watchdog_s = (unsigned)atoi(wd);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_watchdog;
    sigaction(SIGALRM, &sa, NULL);
    phase("start");
    CHECK(provided >= thread_level, "MPI_Init_thread gave thread level %d, asked for %d", provided,
          thread_level);
    CHECK(nranks >= 2, "needs at least 2 ranks, got %d", nranks);
    if (avoid_am_bugs && !suite_note)
        suite_note = "active-message mode: at most one long message in flight per sending rank "
                     "(MPICH 5.0.2 defect)";
}

static UNUSED void suite_pass(void)
{
    phase("final barrier and MPI_Finalize");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        if (suite_note)
            printf("mpi-suite %s: note: %s\n", NAME, suite_note);
        printf("mpi-suite %s: PASS (%d ranks)\n", NAME, nranks);
        fflush(stdout);
    }
    MPI_Finalize();
    alarm(0);
}

/* Checks a receive's status: source, tag and byte count. */
static UNUSED void check_status(int line, const char *what, MPI_Status *st, int src, int tag,
                                int n)
{
    int count;
    MPI_Get_count(st, MPI_BYTE, &count);
    if (st->MPI_SOURCE != src || st->MPI_TAG != tag || count != n)
        fail(line, "%s: status says %d B from rank %d tag %d, expected %d B from rank %d tag %d",
             what, count, st->MPI_SOURCE, st->MPI_TAG, n, src, tag);
}

/* Round-robin pairing (the circle method): rank `me`'s partner in round
 * `r` of `slots` (even) positions; a partner >= nranks is a bye. Over
 * slots-1 rounds every pair meets exactly once, and all ranks work in
 * every round. */
static UNUSED int round_partner(int me, int r, int slots)
{
    int m = slots - 1;
    if (me == m)
        return r;
    if (me == r)
        return m;
    return ((2 * r - me) % m + m) % m;
}

#endif /* UNIMEM_MPI_SUITE_H */
