/*
 * mpi-suite threads: MPI_THREAD_MULTIPLE (required: the program fails if
 * MPI_Init_thread does not provide it), 4 threads per rank, all in MPI at
 * once:
 *
 *   1. tagged point-to-point on MPI_COMM_WORLD, the thread number as the
 *      tag: each thread sends a run of mixed sizes (inline to rendezvous)
 *      to the next rank and receives the run of its namesake on the
 *      previous rank, in order;
 *   2. wildcard receives on per-thread duplicates of MPI_COMM_WORLD: each
 *      thread exchanges with every other rank, receiving with
 *      MPI_ANY_SOURCE / MPI_ANY_TAG; nothing may cross communicators and
 *      each source's messages come in order;
 *   3. collectives (Allreduce, Bcast, Allgather, Barrier) on the per-thread
 *      communicators, concurrently.
 */
#define NAME "threads"
#define _POSIX_C_SOURCE 200809L
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

/* ---- suite helpers (each suite program is self-contained) ---- */

#define UNUSED __attribute__((unused))
#define KiB 1024
#define MiB (1024 * 1024)

static int rank, nranks;

/* Reports a failure of this rank and aborts the whole job. */
static UNUSED void fail(int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "mpi-suite %s: rank %d: FAIL (%s:%d): ", NAME, rank, __FILE__, line);
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
        fail(__LINE__, "out of memory (%zu B)", n);
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
 * (scripts/mpirun-unimem --am); MPI RMA always rides on active messages on
 * unimem, which has no FI_RMA. Messages over ~16 KiB take MPICH's AM
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
 * at most one long message in flight per sending rank, such structs under
 * 16 KiB, threads with messages under 16 KiB; `avoid_rma_bugs` keeps one
 * long RMA operation in flight per rank in both modes. MPI_SUITE_AM_FULL=1
 * lifts all of it, to see whether MPICH still fails. */
#define AM_LONG 16320
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
    avoid_rma_bugs = !unrestricted;
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

/* ---- end of suite helpers ---- */
#include <pthread.h>

#define THREADS 4
#define ITER_A 64
#define ITER_B 16
#define ITER_C 12

static MPI_Comm comms[THREADS];

/* Message sizes; where avoid_am_bugs is set (active-message mode) all stay
 * under MPICH's AM pipeline (MPICH 5.0.2 defect 3). */
static const int cycle[] = {0, 7, 15, 100, 16384, 16385, 70000, 300001};
static const int am_cycle[] = {0, 7, 15, 100, 1000, 4000, 9000, 16000};
#define NCYCLE 8
#define CMAX 300001

static int msg_size(int t, int it)
{
    return (avoid_am_bugs ? am_cycle : cycle)[(t + it) % NCYCLE];
}

static void send_bytes(const void *buf, int n, int dst, int tag, MPI_Comm comm, MPI_Request *req)
{
    MPI_Isend(buf, n, MPI_BYTE, dst, tag, comm, req);
}

static void check_status(int line, int t, const char *what, MPI_Status *st, int src, int tag, int n)
{
    int count;
    MPI_Get_count(st, MPI_BYTE, &count);
    if (st->MPI_SOURCE != src || st->MPI_TAG != tag || count != n)
        fail(line, "thread %d, %s: status says %d B from rank %d tag %d, expected %d B from rank %d "
             "tag %d", t, what, count, st->MPI_SOURCE, st->MPI_TAG, n, src, tag);
}

/* 1: tagged, thread number as tag */
static void tagged(int t)
{
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    unsigned char *in = xmalloc((size_t)ITER_A * CMAX), *out = xmalloc((size_t)ITER_A * CMAX);
    MPI_Request rreq[ITER_A], sreq[ITER_A];
    MPI_Status st[ITER_A];
    for (int it = 0; it < ITER_A; it++)
        MPI_Irecv(in + (size_t)it * CMAX, CMAX, MPI_BYTE, prev, t, MPI_COMM_WORLD, &rreq[it]);
    for (int it = 0; it < ITER_A; it++) {
        unsigned char *b = out + (size_t)it * CMAX;
        fill(b, (size_t)msg_size(t, it), seed_of(rank, next, t, it));
        send_bytes(b, msg_size(t, it), next, t, MPI_COMM_WORLD, &sreq[it]);
    }
    MPI_Waitall(ITER_A, sreq, MPI_STATUSES_IGNORE);
    MPI_Waitall(ITER_A, rreq, st);
    for (int it = 0; it < ITER_A; it++) {
        check_status(__LINE__, t, "tagged receive", &st[it], prev, t, msg_size(t, it));
        check_fill(__LINE__, in + (size_t)it * CMAX, (size_t)msg_size(t, it), seed_of(prev, rank, t, it),
                   "thread %d: message %d from rank %d", t, it, prev);
    }
    free(in);
    free(out);
}

/* 2: wildcards on the thread's own communicator */
static void wildcards(int t)
{
    MPI_Comm comm = comms[t];
    int nrecv = (nranks - 1) * ITER_B;
    unsigned char *in = xmalloc((size_t)nrecv * CMAX), *out = xmalloc((size_t)nrecv * CMAX);
    MPI_Request *rreq = xmalloc((size_t)nrecv * sizeof *rreq), *sreq = xmalloc((size_t)nrecv * sizeof *sreq);
    MPI_Status *st = xmalloc((size_t)nrecv * sizeof *st);
    for (int j = 0; j < nrecv; j++)
        MPI_Irecv(in + (size_t)j * CMAX, CMAX, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &rreq[j]);
    int k = 0;
    for (int it = 0; it < ITER_B; it++)
        for (int d = 0; d < nranks; d++) {
            if (d == rank)
                continue;
            int n = msg_size(t + d, it);
            unsigned char *b = out + (size_t)k * CMAX;
            fill(b, (size_t)n, seed_of(rank, d, 100 + t, it));
            send_bytes(b, n, d, it, comm, &sreq[k++]);
        }
    MPI_Waitall(k, sreq, MPI_STATUSES_IGNORE);
    MPI_Waitall(nrecv, rreq, st);
    int *next_it = calloc((size_t)nranks, sizeof *next_it);
    for (int j = 0; j < nrecv; j++) {
        int s = st[j].MPI_SOURCE;
        CHECK(s >= 0 && s < nranks && s != rank, "thread %d: wildcard receive from rank %d", t, s);
        int it = next_it[s]++;
        check_status(__LINE__, t, "wildcard receive (per-source order)", &st[j], s, it,
                     msg_size(t + rank, it));
        check_fill(__LINE__, in + (size_t)j * CMAX, (size_t)msg_size(t + rank, it),
                   seed_of(s, rank, 100 + t, it), "thread %d: wildcard message %d from rank %d", t, it, s);
    }
    free(next_it);
    free(in);
    free(out);
    free(rreq);
    free(sreq);
    free(st);
}

/* 3: collectives on the thread's own communicator */
static int cv(int r, int t, int64_t i, int it)
{
    return (int)(mix64(((uint64_t)r << 48) ^ ((uint64_t)t << 40) ^ ((uint64_t)it << 32) ^ (uint64_t)i) & 0xffffff);
}

static void collectives(int t)
{
    static const int native_counts[] = {1, 4100, 70000}, restricted_counts[] = {1, 250, 1000};
    const int *counts = avoid_am_bugs ? restricted_counts : native_counts;
    MPI_Comm comm = comms[t];
    int *mine = xmalloc(70000 * sizeof(int)), *res = xmalloc((size_t)70000 * nranks * sizeof(int));
    for (int it = 0; it < ITER_C; it++) {
        int cnt = counts[it % 3], root = (it + t) % nranks;
        for (int i = 0; i < cnt; i++)
            mine[i] = cv(rank, t, i, it);
        MPI_Allreduce(mine, res, cnt, MPI_INT, MPI_SUM, comm);
        for (int i = 0; i < cnt; i++) {
            int want = 0;
            for (int q = 0; q < nranks; q++)
                want += cv(q, t, i, it);
            CHECK(res[i] == want, "thread %d: Allreduce of %d ints: element %d is %d, expected %d", t,
                  cnt, i, res[i], want);
        }
        if (rank == root)
            memcpy(res, mine, (size_t)cnt * sizeof(int));
        MPI_Bcast(res, cnt, MPI_INT, root, comm);
        for (int i = 0; i < cnt; i++)
            CHECK(res[i] == cv(root, t, i, it), "thread %d: Bcast of %d ints from %d: element %d is %d",
                  t, cnt, root, i, res[i]);
        MPI_Allgather(mine, cnt, MPI_INT, res, cnt, MPI_INT, comm);
        for (int q = 0; q < nranks; q++)
            for (int i = 0; i < cnt; i++)
                CHECK(res[(size_t)q * cnt + i] == cv(q, t, i, it),
                      "thread %d: Allgather of %d ints: block %d element %d is %d", t, cnt, q, i,
                      res[(size_t)q * cnt + i]);
        MPI_Barrier(comm);
    }
    free(mine);
    free(res);
}

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    tagged(t);
    wildcards(t);
    collectives(t);
    return NULL;
}

int main(int argc, char **argv)
{
    suite_init(&argc, &argv, MPI_THREAD_MULTIPLE);
    int provided;
    MPI_Query_thread(&provided);
    CHECK(provided == MPI_THREAD_MULTIPLE, "MPI_Query_thread says %d, not MPI_THREAD_MULTIPLE", provided);
    for (int t = 0; t < THREADS; t++)
        MPI_Comm_dup(MPI_COMM_WORLD, &comms[t]);
    if (avoid_am_bugs)
        suite_note = "active-message mode: messages and collectives under 16 KiB (MPICH 5.0.2 "
                     "defect)";
    phase("%d threads: point-to-point and collectives", THREADS);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        CHECK(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0, "pthread_create failed");
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++)
        MPI_Comm_free(&comms[t]);
    suite_pass();
    return 0;
}
