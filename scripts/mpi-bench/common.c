/*
 * Shared part of the MPI point-to-point benchmarks in this directory
 * (latency.c, bw.c, bibw.c, mbw_mr.c). Each benchmark #includes this file,
 * so that every program is one translation unit; it is not built alone.
 *
 * Method (the one of the OSU micro-benchmarks): per message size, warm-up
 * iterations that are not timed, then a timed loop measured with MPI_Wtime
 * on rank 0; buffers are page-aligned and written before use; large
 * messages (> 8 KiB) get fewer iterations. In addition, the iteration
 * counts adapt to how slow one iteration is: a probe at the start of the
 * warm-up times some iterations on rank 0, and the warm-up and the timed
 * loop are cut so that the timed loop lasts about -t seconds (0.25 s by
 * default), but never fewer than a minimum. That keeps a sweep bounded on
 * slow transports (the modeled Unimem hardware moves 1 GB/s) without
 * changing fast ones much. -i fixes the iteration count (no time limit).
 *
 * The window tests reuse one send and one receive buffer, as OSU does
 * (cache-friendly: the data stay in cache from one window to the next);
 * with -B N their messages go from N distinct send buffers into N
 * distinct receive buffers, each allocated on its own, as an application
 * moving distinct arrays does.
 *
 * Received data are checked after every size: the receive buffers of the
 * timed loop must hold the sent patterns, and an untimed check pass sends
 * one more window (up to 16 MiB) in which every message has a pattern of
 * its own and a receive buffer of its own, so that a lost, misplaced or
 * mixed-up message is seen too.
 */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LARGE_MESSAGE (8u << 10) /* sizes above it count as "large" */
#define ACK_BYTES 4              /* the ack closing a window */
#define CHECK_BYTES (16u << 20)  /* the check pass's bytes per direction */
#define CHECK_TAG 99
/* What a benchmark's command line offers besides the common options. */
#define OPT_WINDOW 1 /* -W, -S: a window of messages */
#define OPT_BUFS 2   /* -B: distinct buffers for the window's messages */
#define MAX_BUFS 1024
/* Parts some benchmarks do not use (the one-sided ones check otherwise). */
#define MAYBE_UNUSED __attribute__((unused))

/* Iteration counts of one benchmark. */
struct policy {
    long iters_small, iters_large; /* timed iterations (at most) */
    long skip_small, skip_large;   /* warm-up iterations (at most) */
    long iters_min;                /* timed iterations at least */
    size_t default_min;            /* smallest size of the default range */
};

/* Command line. */
struct options {
    size_t min_size, max_size;
    long iters;    /* -i: fixed timed iterations; 0: by size and time */
    long skip;     /* -x: fixed warm-up iterations; -1: by size and time */
    double budget; /* -t: seconds a timed loop aims at; 0: no limit */
    int window;    /* -W: messages in flight per window (window tests) */
    size_t serial; /* -S: sizes above it use a window of 1 (0: none) */
    int bufs;      /* -B: send and receive buffers per rank (1: one, reused) */
    int full;      /* -f: print the iteration count too */
};

static int rank, nranks;
/* Page-aligned, max_size bytes each, opt.bufs of each kind, each
 * allocated on its own; sbuf and rbuf are the first ones. */
static unsigned char **sbufs, **rbufs;
static unsigned char *sbuf, *rbuf;
static unsigned char *csend, *crecv; /* the check pass's, CHECK_BYTES or more */
static MPI_Request *creqs;
static struct options opt;

static void usage(const char *prog, int features)
{
    int windowed = features & OPT_WINDOW;
    if (rank != 0)
        return;
    fprintf(stderr,
            "usage: %s [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS]%s%s [-f]\n"
            "  -m  message sizes, bytes (k, m suffixes: KiB, MiB); default %s:4m\n"
            "  -i  timed iterations per size (default: %ld, %ld above 8 KiB,\n"
            "      fewer if a loop would last longer than -t)\n"
            "  -x  warm-up iterations per size (default: %ld, %ld above 8 KiB)\n"
            "  -t  seconds a timed loop aims at, when -i is not given (default 0.25;\n"
            "      0: no limit)\n"
            "%s%s"
            "  -f  also print the number of timed iterations\n",
            prog, windowed ? " [-W WINDOW] [-S BYTES]" : "", features & OPT_BUFS ? " [-B BUFS]" : "",
            windowed ? "1" : "0",
            windowed ? 100L : 10000L, windowed ? 20L : 1000L,
            windowed ? 10L : 100L, windowed ? 2L : 10L,
            windowed ? "  -W  messages per window (default 64)\n"
                       "  -S  sizes above BYTES use a window of 1: one message in flight\n"
                       "      (MPICH 5.0.2's active-message mode without RMA breaks when a\n"
                       "      rank has two messages of more than ~16 KiB in flight)\n"
                     : "",
            features & OPT_BUFS
                ? "  -B  messages go from BUFS distinct send buffers into BUFS distinct\n"
                  "      receive buffers, in turn (default 1: one of each, reused)\n"
                : "");
}

/* A byte count with an optional k/m/g suffix (powers of 1024). */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *s == '-')
        return -1;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (*end != '\0' || v > (unsigned long long)INT_MAX)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_long(const char *s, long *out, long min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min)
        return -1;
    *out = v;
    return 0;
}

/* Parses the command line (on every rank alike); exits on a bad one.
 * `features`: OPT_* flags. */
static void parse_options(int argc, char **argv, const struct policy *pol, int features)
{
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    int c, bad = 0, help = 0;
    opt.min_size = pol->default_min;
    opt.max_size = 4u << 20;
    opt.iters = 0;
    opt.skip = -1;
    opt.budget = 0.25;
    opt.window = 64;
    opt.serial = 0;
    opt.bufs = 1;
    opt.full = 0;
    const char *optstring = features & OPT_BUFS     ? "m:i:x:t:W:S:B:fh"
                            : features & OPT_WINDOW ? "m:i:x:t:W:S:fh"
                                                    : "m:i:x:t:fh";
    while (!bad && !help && (c = getopt(argc, argv, optstring)) != -1) {
        long v;
        char *colon, *end;
        switch (c) {
        case 'm':
            colon = strchr(optarg, ':');
            if (colon) {
                *colon = '\0';
                bad = parse_size(optarg, &opt.min_size) || parse_size(colon + 1, &opt.max_size);
            } else {
                bad = parse_size(optarg, &opt.max_size);
            }
            bad = bad || opt.min_size > opt.max_size;
            break;
        case 'i': bad = parse_long(optarg, &opt.iters, 1); break;
        case 'x': bad = parse_long(optarg, &opt.skip, 0); break;
        case 't':
            errno = 0;
            opt.budget = strtod(optarg, &end);
            bad = errno != 0 || end == optarg || *end != '\0' || opt.budget < 0;
            break;
        case 'W':
            bad = parse_long(optarg, &v, 1) || v > 65536;
            opt.window = (int)v;
            break;
        case 'S': bad = parse_size(optarg, &opt.serial); break;
        case 'B':
            bad = parse_long(optarg, &v, 1) || v > MAX_BUFS;
            opt.bufs = (int)v;
            break;
        case 'f': opt.full = 1; break;
        case 'h': help = 1; break;
        default: bad = 1; break;
        }
    }
    if (help || bad || optind != argc) {
        usage(prog, features);
        MPI_Finalize();
        exit(help ? 0 : 2);
    }
}

static unsigned char *page_alloc(size_t len)
{
    void *p = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (len == 0)
        len = 1;
    if (posix_memalign(&p, page > 0 ? (size_t)page : 4096, len) != 0) {
        fprintf(stderr, "rank %d: cannot allocate %zu bytes\n", rank, len);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(p, 0, len); /* touch every page before any timing */
    return p;
}

static void alloc_buffers(void)
{
    size_t check = opt.max_size > CHECK_BYTES ? opt.max_size : CHECK_BYTES;
    sbufs = malloc(sizeof *sbufs * (size_t)opt.bufs);
    rbufs = malloc(sizeof *rbufs * (size_t)opt.bufs);
    if (!sbufs || !rbufs)
        MPI_Abort(MPI_COMM_WORLD, 1);
    /* One allocation each: with the dmable heap preloaded, each is a heap
     * block of its own (dmable from 64 KiB on). */
    for (int b = 0; b < opt.bufs; b++) {
        sbufs[b] = page_alloc(opt.max_size);
        rbufs[b] = page_alloc(opt.max_size);
    }
    sbuf = sbufs[0];
    rbuf = rbufs[0];
    csend = page_alloc(check);
    crecv = page_alloc(check);
    creqs = malloc(sizeof *creqs * 2 * (size_t)opt.window);
    if (!creqs)
        MPI_Abort(MPI_COMM_WORLD, 1);
}

static void free_buffers(void)
{
    for (int b = 0; b < opt.bufs; b++) {
        free(sbufs[b]);
        free(rbufs[b]);
    }
    free(sbufs);
    free(rbufs);
    free(csend);
    free(crecv);
    free(creqs);
}

/* The window tests' iteration counts (the OSU bandwidth tests'). */
static const struct policy window_policy = {
    .iters_small = 100, .iters_large = 20,
    .skip_small = 10, .skip_large = 2,
    .iters_min = 2, .default_min = 1,
};

/* The window tests' requests (see start). */
static MPI_Request *reqs;

/* Starts benchmark `name`: MPI, options (`features`: OPT_* flags),
 * buffers, and `request_windows` windows' worth of requests in `reqs` (0:
 * none). It needs at least two ranks, an even number with `even_ranks`;
 * otherwise it ends with status 2. */
static void start(int *argc, char ***argv, const char *name, const struct policy *pol,
                  int features, int even_ranks, int request_windows)
{
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    parse_options(*argc, *argv, pol, features);
    if (nranks < 2 || (even_ranks && nranks % 2 != 0)) {
        if (rank == 0)
            fprintf(stderr, "%s: needs %s\n", name,
                    even_ranks ? "an even number of ranks" : "at least 2 ranks");
        MPI_Finalize();
        exit(2);
    }
    alloc_buffers();
    if (request_windows > 0) {
        reqs = malloc(sizeof *reqs * (size_t)request_windows * (size_t)opt.window);
        if (!reqs)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static void finish(void)
{
    free(reqs);
    free_buffers();
    MPI_Finalize();
}

/* Byte i of a message with pattern `seed`. */
static unsigned char pattern(size_t i, unsigned seed)
{
    return (unsigned char)(i % 251 + seed * 37u + 1);
}

static void fill(unsigned char *buf, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern(i, seed);
}

static void verify(const unsigned char *buf, size_t len, unsigned seed, const char *what, int index)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != pattern(i, seed)) {
            fprintf(stderr, "rank %d: wrong data in %s %d of size %zu: byte %zu is %u, expected %u\n",
                    rank, what, index, len, i, buf[i], pattern(i, seed));
            MPI_Abort(MPI_COMM_WORLD, 3);
            exit(3); /* MPICH's MPI_Abort returned when both ranks aborted at once */
        }
    }
}

/* Messages per window at `size` (window tests). */
static inline int window_at(size_t size)
{
    return opt.serial && size > opt.serial ? 1 : opt.window;
}

/* The pattern of send buffer `b` at `size` (buffer 0: the size's). */
static unsigned buffer_seed(size_t size, int b)
{
    return (unsigned)size + (unsigned)b;
}

/* Before a size: each send buffer gets its pattern, the receive buffers
 * something else. */
static void prepare_buffers(size_t size)
{
    for (int b = 0; b < opt.bufs; b++) {
        fill(sbufs[b], size, buffer_seed(size, b));
        memset(rbufs[b], 0, size);
    }
}

/* The buffer of message `w` of window `i` (-B: the buffers in turn; the
 * same index on both sides, as messages match in order). */
static inline int buffer_of(long i, int w, int window)
{
    return (int)(((long long)i * window + w) % opt.bufs);
}

/* After a timed loop of `iters` windows, on a rank that received messages
 * of that size: every receive buffer the loop wrote holds the pattern of
 * its send buffer. */
static MAYBE_UNUSED void check_received(size_t size, long iters)
{
    long long messages = (long long)iters * window_at(size);
    int used = messages < opt.bufs ? (int)messages : opt.bufs;
    for (int b = 0; b < used; b++)
        verify(rbufs[b], size, buffer_seed(size, b), "the timed loop's receive buffer", b);
}

/*
 * The check pass (untimed): up to `window` messages of `size` (at most
 * CHECK_BYTES together), each from a buffer of its own with a pattern of
 * its own, sent to rank `to` and received from rank `from` into buffers of
 * their own (-1: none), then checked. Both sides compute the same count.
 */
static MAYBE_UNUSED void check_pass(size_t size, int window, int to, int from)
{
    int slots = window, n = 0;
    if (size == 0 || (to < 0 && from < 0))
        return;
    if ((size_t)slots * size > CHECK_BYTES)
        slots = size >= CHECK_BYTES ? 1 : (int)(CHECK_BYTES / size);
    if (from >= 0) {
        memset(crecv, 0, (size_t)slots * size);
        for (int w = 0; w < slots; w++)
            MPI_Irecv(crecv + (size_t)w * size, (int)size, MPI_BYTE, from, CHECK_TAG, MPI_COMM_WORLD,
                      &creqs[n++]);
    }
    if (to >= 0) {
        for (int w = 0; w < slots; w++) {
            fill(csend + (size_t)w * size, size, (unsigned)(size * 7 + (size_t)w * 3 + (size_t)rank * 101));
            MPI_Isend(csend + (size_t)w * size, (int)size, MPI_BYTE, to, CHECK_TAG, MPI_COMM_WORLD,
                      &creqs[n++]);
        }
    }
    MPI_Waitall(n, creqs, MPI_STATUSES_IGNORE);
    if (from >= 0)
        for (int w = 0; w < slots; w++)
            verify(crecv + (size_t)w * size, size, (unsigned)(size * 7 + (size_t)w * 3 + (size_t)from * 101),
                   "check-pass message", w);
}

static size_t next_size(size_t size)
{
    return size == 0 ? 1 : size * 2;
}

/* One benchmark step: `n` iterations of the kernel at `size`, on every
 * rank (ranks without a part return at once). */
typedef void (*kernel_fn)(size_t size, long n);

/*
 * Warm-up for one size; returns the number of timed iterations, the same
 * on every rank. Collective over MPI_COMM_WORLD.
 *
 * Without -i and with a time budget, the warm-up starts with a probe: one
 * iteration that pays one-time costs, then 1, 2, 4, ... iterations timed
 * on rank 0 until a batch lasts 5% of the budget (or the iteration count
 * is reached); the last batch gives the time of one iteration, averaged
 * over enough iterations that one preemption does not dominate. Probe
 * iterations count as warm-up.
 */
static long warm_up(const struct policy *pol, kernel_fn kernel, size_t size)
{
    int large = size > LARGE_MESSAGE;
    long iters = opt.iters ? opt.iters : large ? pol->iters_large : pol->iters_small;
    long skip = opt.skip >= 0 ? opt.skip : large ? pol->skip_large : pol->skip_small;
    long plan[2] = {skip, iters};

    MPI_Barrier(MPI_COMM_WORLD);
    if (!opt.iters && opt.budget > 0) {
        long done = 0, batch = 1;
        double t = 0;
        kernel(size, 1);
        done++;
        for (;;) {
            double t0 = MPI_Wtime();
            kernel(size, batch);
            t = MPI_Wtime() - t0;
            done += batch;
            int more = rank == 0 && t < 0.05 * opt.budget && done + 2 * batch <= iters;
            MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (!more)
                break;
            batch *= 2;
        }
        if (rank == 0) {
            double one = t / (double)batch;
            if (one < 1e-9)
                one = 1e-9;
            double fit = opt.budget / one;
            if (fit < (double)iters)
                iters = fit > (double)pol->iters_min ? (long)fit : pol->iters_min;
            if (opt.skip < 0) {
                fit = 0.2 * opt.budget / one; /* rest of the warm-up: a fifth of the budget */
                if (fit < (double)skip)
                    skip = (long)fit;
            }
            plan[0] = skip > done ? skip - done : 0;
            plan[1] = iters;
        }
        MPI_Bcast(plan, 2, MPI_LONG, 0, MPI_COMM_WORLD);
    }
    if (plan[0] > 0)
        kernel(size, plan[0]);
    return plan[1];
}

/* The timed loop: seconds this rank spent in `n` iterations, after a
 * barrier. */
static double timed(kernel_fn kernel, size_t size, long n)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    kernel(size, n);
    return MPI_Wtime() - t0;
}

static void print_header(const char *title, const char *columns)
{
    if (rank != 0)
        return;
    printf("# %s\n", title);
    if (opt.serial)
        printf("# window of 1 above %zu bytes (-S)\n", opt.serial);
    if (opt.bufs > 1)
        printf("# messages from %d distinct send buffers into %d distinct receive buffers (-B)\n",
               opt.bufs, opt.bufs);
    printf("%s%s\n", columns, opt.full ? "          Iterations" : "");
    fflush(stdout);
}

static void print_iters(long iters)
{
    if (opt.full)
        printf("%20ld", iters);
    printf("\n");
    fflush(stdout);
}
