/*
 * fi_rma: one-sided operations through libfabric directly (no MPI), for
 * any provider: the libfabric half of the RMA rows of scripts/bench-mpi.
 *
 * One command, two processes: the program forks after making a socket
 * pair, before either side touches libfabric; the parent is the initiator,
 * the child the target, each pinned to a core of its own (-c). The socket
 * carries the addresses, the target's key and base, and the data checks;
 * the target only drives its progress (fi_cq_read) while it waits, as an
 * MPI rank does in a window epoch, so a provider whose one-sided path needs
 * no target action is not helped and one that needs it is not starved.
 *
 * Operations (-o):
 *   put_lat, get_lat  one fi_write / fi_read, then its completion; µs
 *   inject_lat        one fi_inject_write (up to the provider's inject
 *                     size, fi_write above), then the write counter reaching
 *                     it: what MPICH does for MPI_Put + MPI_Win_flush; µs
 *   put_bw, get_bw    a window (-W, 64) of them, then every completion;
 *                     MB/s (10^6 bytes per second)
 *   atomic            a window of 8-byte FI_SUM fi_atomic, then the
 *                     completions; operations per second (size column 8)
 *   fetch             one 8-byte FI_SUM fi_fetch_atomic, then its
 *                     completion; operations per second
 * Per size (powers of two up to -m), a warm-up, then a timed loop of about
 * -t seconds (at least 10 iterations). Data are checked after every size:
 * the target compares its memory with the pattern written, the initiator
 * what it read, and the atomics' final sum is compared with the count.
 *
 *   fi_rma -o OP [-p PROVIDER] [-m MAX] [-t SECONDS] [-W WINDOW] [-c CPU0,CPU1]
 *
 * Output: "# provider: NAME" (what fi_getinfo chose), then "SIZE VALUE"
 * lines, as the MPI programs print.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

enum op { PUT_LAT, GET_LAT, INJECT_LAT, PUT_BW, GET_BW, ATOMIC, FETCH, OPS };
static const char *const op_names[] = {"put_lat", "get_lat", "inject_lat", "put_bw", "get_bw", "atomic", "fetch"};
static const char *const op_titles[] = {
    "fi_write + its completion, latency (us)",
    "fi_read + its completion, latency (us)",
    "fi_inject_write + the write counter, latency (us)",
    "window of fi_write + the completions, bandwidth (MB/s)",
    "window of fi_read + the completions, bandwidth (MB/s)",
    "window of 8-byte FI_SUM fi_atomic + the completions, rate (ops/s)",
    "8-byte FI_SUM fi_fetch_atomic + its completion, rate (ops/s)",
};

static struct {
    enum op op;
    const char *provider;
    size_t max_size;
    double budget;
    int window;
    int cpu[2];
} opt = {PUT_LAT, NULL, 4u << 20, 0.25, 64, {0, 1}};

static const char *role = "initiator";

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fi_rma (%s): ", role);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

#define CHECK_FI(call)                                                         \
    do {                                                                       \
        int rc_ = (int)(call);                                                 \
        if (rc_) die("%s: %s (%d)", #call, fi_strerror(-rc_), rc_);            \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- the socket between the two processes ------------------------------ */

static int sock;

static void put_bytes(const void *p, size_t n) {
    for (const char *c = p; n;) {
        ssize_t w = write(sock, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("socket write: %s", strerror(errno));
        c += w, n -= (size_t)w;
    }
}

static void get_bytes(void *p, size_t n) {
    for (char *c = p; n;) {
        ssize_t r = read(sock, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("socket read: %s", r ? strerror(errno) : "peer gone");
        c += r, n -= (size_t)r;
    }
}

static void put_u64(uint64_t v) { put_bytes(&v, sizeof v); }
static uint64_t get_u64(void) {
    uint64_t v;
    get_bytes(&v, sizeof v);
    return v;
}

/* --- libfabric objects -------------------------------------------------- */

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_av *av;
static struct fid_cq *cq;
static struct fid_cntr *write_cntr;
static uint64_t writes_posted;
static struct fid_ep *ep;
static struct fid_mr *mr;
static void *desc;
static fi_addr_t peer;
static size_t inflight;

static unsigned char *buf;   /* local buffer: source of writes, sink of reads */
static size_t buf_len;
static uint64_t remote_base, remote_key;

static void open_fabric(void) {
    struct fi_info *hints = fi_allocinfo();
    if (!hints) die("fi_allocinfo");
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_ATOMIC;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    if (opt.provider) hints->fabric_attr->prov_name = strdup(opt.provider);
    CHECK_FI(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
    fi_freeinfo(hints);
    CHECK_FI(fi_fabric(info->fabric_attr, &fabric, NULL));
    CHECK_FI(fi_domain(fabric, info, &domain, NULL));
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    CHECK_FI(fi_av_open(domain, &av_attr, &av, NULL));
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 1024};
    CHECK_FI(fi_cq_open(domain, &cq_attr, &cq, NULL));
    CHECK_FI(fi_endpoint(domain, info, &ep, NULL));
    CHECK_FI(fi_ep_bind(ep, &av->fid, 0));
    CHECK_FI(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    if (opt.op == INJECT_LAT) {
        struct fi_cntr_attr cntr_attr = {.events = FI_CNTR_EVENTS_COMP};
        CHECK_FI(fi_cntr_open(domain, &cntr_attr, &write_cntr, NULL));
        CHECK_FI(fi_ep_bind(ep, &write_cntr->fid, FI_WRITE));
    }
    CHECK_FI(fi_enable(ep));

    /* At least 1 MiB: above the dmable heap's threshold, whatever -m. */
    buf_len = opt.max_size > (1u << 20) ? opt.max_size : (1u << 20);
    if (posix_memalign((void **)&buf, 4096, buf_len)) die("posix_memalign of %zu bytes", buf_len);
    memset(buf, 0, buf_len);
    CHECK_FI(fi_mr_reg(domain, buf, buf_len, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE,
                       0, 1, 0, &mr, NULL));
    if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
        CHECK_FI(fi_mr_bind(mr, &ep->fid, 0));
        CHECK_FI(fi_mr_enable(mr));
    }
    desc = fi_mr_desc(mr);
}

/* Each side sends its address, key and base, and inserts the other's. */
static void exchange(void) {
    char addr[256];
    size_t len = sizeof addr;
    CHECK_FI(fi_getname(&ep->fid, addr, &len));
    put_u64(len);
    put_bytes(addr, len);
    put_u64(fi_mr_key(mr));
    put_u64(info->domain_attr->mr_mode & FI_MR_VIRT_ADDR ? (uint64_t)(uintptr_t)buf : 0);
    uint64_t peer_len = get_u64();
    if (peer_len > sizeof addr) die("peer address of %" PRIu64 " bytes", peer_len);
    get_bytes(addr, peer_len);
    remote_key = get_u64();
    remote_base = get_u64();
    if (fi_av_insert(av, addr, 1, &peer, 0, NULL) != 1) die("fi_av_insert");
}

/* Reads completions; returns how many. */
static size_t progress(void) {
    struct fi_cq_entry entries[64];
    ssize_t n = fi_cq_read(cq, entries, 64);
    if (n > 0) return (size_t)n;
    if (n == -FI_EAGAIN) return 0;
    if (n == -FI_EAVAIL) {
        struct fi_cq_err_entry err = {0};
        fi_cq_readerr(cq, &err, 0);
        die("completion error: %s (%d), prov_errno %d", fi_strerror(err.err), err.err, err.prov_errno);
    }
    die("fi_cq_read: %s", fi_strerror((int)-n));
    return 0;
}

static void wait_all(void) {
    if (opt.op == INJECT_LAT) {
        /* Completions of fi_write above the inject size go to the CQ too. */
        while (fi_cntr_read(write_cntr) < writes_posted) inflight -= progress();
        while (inflight) inflight -= progress();
        return;
    }
    while (inflight) inflight -= progress();
}

static struct fi_context ctx[1024];
static uint64_t one = 1, fetched;

/* Posts one operation of `size` bytes, retrying on -FI_EAGAIN. */
static void post(size_t size, size_t slot) {
    for (;;) {
        ssize_t rc;
        void *c = &ctx[slot % 1024];
        switch (opt.op) {
        case INJECT_LAT:
            if (size <= info->tx_attr->inject_size) {
                rc = fi_inject_write(ep, buf, size, peer, remote_base, remote_key);
                if (rc == 0) {
                    writes_posted++;
                    return;
                }
                break;
            }
            rc = fi_write(ep, buf, size, desc, peer, remote_base, remote_key, c);
            if (rc == 0) writes_posted++;
            break;
        case PUT_LAT:
        case PUT_BW:
            rc = fi_write(ep, buf, size, desc, peer, remote_base, remote_key, c);
            break;
        case GET_LAT:
        case GET_BW:
            rc = fi_read(ep, buf, size, desc, peer, remote_base, remote_key, c);
            break;
        case ATOMIC:
            rc = fi_atomic(ep, &one, 1, desc, peer, remote_base, remote_key, FI_INT64, FI_SUM, c);
            break;
        default:
            rc = fi_fetch_atomic(ep, &one, 1, desc, &fetched, desc, peer, remote_base, remote_key,
                                 FI_INT64, FI_SUM, c);
            break;
        }
        if (rc == 0) {
            inflight++;
            return;
        }
        if (rc != -FI_EAGAIN) die("%s of %zu bytes: %s", op_names[opt.op], size, fi_strerror((int)-rc));
        inflight -= progress();
    }
}

/* One round of the timed loop: 1 operation, or a window. */
static void round_of(size_t size) {
    int window = (opt.op == PUT_BW || opt.op == GET_BW || opt.op == ATOMIC) ? opt.window : 1;
    for (int i = 0; i < window; i++) post(size, (size_t)i);
    wait_all();
}

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)(i * 7 + seed); }

/* --- the two roles ------------------------------------------------------- */

enum { CMD_DONE, CMD_CHECK_WRITE, CMD_FILL, CMD_SUM };

/* The target: drives progress; answers the initiator's commands. */
static void target(void) {
    for (;;) {
        uint64_t cmd;
        ssize_t r = recv(sock, &cmd, sizeof cmd, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            for (int i = 0; i < 256; i++) progress();
            sched_yield();
            continue;
        }
        if (r != (ssize_t)sizeof cmd) die("command: %s", r ? strerror(errno) : "initiator gone");
        if (cmd == CMD_DONE) return;
        uint64_t size = get_u64(), seed = get_u64();
        uint64_t answer = 0;
        if (cmd != CMD_SUM && size > buf_len) die("size %" PRIu64, size);
        /* An initiator's completion may come before the data are visible
         * here (FI_TRANSMIT_COMPLETE, the default, allows it): the checks
         * progress for up to 2 s while what they look for is not there. */
        double deadline = now() + 2.0;
        if (cmd == CMD_CHECK_WRITE) {
            do {
                answer = 0;
                for (size_t i = 0; i < size; i++)
                    if (buf[i] != pattern(i, (unsigned)seed)) {
                        answer = i + 1;
                        progress();
                        break;
                    }
            } while (answer && now() < deadline);
        } else if (cmd == CMD_FILL) {
            for (size_t i = 0; i < size; i++) buf[i] = pattern(i, (unsigned)seed);
        } else if (cmd == CMD_SUM) {
            /* size: the sum expected. */
            for (;;) {
                memcpy(&answer, buf, sizeof answer);
                if (answer == size || now() >= deadline) break;
                progress();
            }
            memset(buf, 0, 8);
        }
        put_u64(answer);
    }
}

static uint64_t ask(uint64_t cmd, uint64_t size, uint64_t seed) {
    put_u64(cmd);
    put_u64(size);
    put_u64(seed);
    return get_u64();
}

static void initiator(void) {
    printf("# fi_rma %s: %s; provider %s, libfabric %u.%u, %s, -t %g", op_names[opt.op],
           op_titles[opt.op], info->fabric_attr->prov_name, FI_MAJOR(fi_version()),
           FI_MINOR(fi_version()), info->domain_attr->mr_mode & FI_MR_VIRT_ADDR ? "virtual addresses"
                                                                              : "offsets",
           opt.budget);
    if (opt.op == PUT_BW || opt.op == GET_BW || opt.op == ATOMIC) printf(", window %d", opt.window);
    printf("\n# provider: %s\n", info->fabric_attr->prov_name);
    int atomic = opt.op == ATOMIC || opt.op == FETCH;
    printf("# %-10s %s\n", "size", atomic ? "ops/s" : (opt.op <= INJECT_LAT ? "us" : "MB/s"));
    fflush(stdout);
    size_t first = atomic ? 8 : 1, last = atomic ? 8 : opt.max_size;
    for (size_t size = first; size <= last; size *= 2) {
        unsigned seed = (unsigned)(size * 2654435761u >> 7);
        if (opt.op == PUT_LAT || opt.op == INJECT_LAT || opt.op == PUT_BW)
            for (size_t i = 0; i < size; i++) buf[i] = pattern(i, seed);
        if (opt.op == GET_LAT || opt.op == GET_BW) {
            ask(CMD_FILL, size, seed);
            memset(buf, 0, size);
        }
        /* Warm-up: a tenth of the budget. */
        double start = now();
        long rounds = 0;
        while (rounds < 3 || now() - start < opt.budget / 10) round_of(size), rounds++;
        long warm = rounds;
        rounds = 0;
        start = now();
        double elapsed;
        for (;;) {
            round_of(size);
            rounds++;
            /* The clock every 8 rounds: reading it costs as much as a small op. */
            if ((rounds & 7) == 0 && rounds >= 10) {
                elapsed = now() - start;
                if (rounds >= 10 && elapsed >= opt.budget) break;
            }
        }
        int window = (opt.op == PUT_BW || opt.op == GET_BW || opt.op == ATOMIC) ? opt.window : 1;
        double ops = (double)rounds * window;
        double value = opt.op <= INJECT_LAT ? elapsed * 1e6 / ops
                       : atomic          ? ops / elapsed
                                         : ops * (double)size / elapsed / 1e6;
        /* Checks. */
        if (opt.op == PUT_LAT || opt.op == INJECT_LAT || opt.op == PUT_BW) {
            uint64_t bad = ask(CMD_CHECK_WRITE, size, seed);
            if (bad) die("size %zu: the target's byte %" PRIu64 " differs from what was written", size, bad - 1);
        } else if (opt.op == GET_LAT || opt.op == GET_BW) {
            for (size_t i = 0; i < size; i++)
                if (buf[i] != pattern(i, seed)) die("size %zu: byte %zu read wrong", size, i);
        } else {
            uint64_t expect = (uint64_t)(warm + rounds) * (uint64_t)window;
            uint64_t sum = ask(CMD_SUM, expect, 0);
            if (sum != expect) die("the target's sum is %" PRIu64 ", expected %" PRIu64, sum, expect);
            if (opt.op == FETCH && fetched != expect - 1)
                die("the last fetch saw %" PRIu64 ", expected %" PRIu64, fetched, expect - 1);
        }
        printf("%-12zu %.2f\n", size, value);
        fflush(stdout);
    }
    put_u64(CMD_DONE);
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set)) fprintf(stderr, "fi_rma: cannot pin to cpu %d\n", cpu);
}

static void usage(void) {
    fprintf(stderr, "usage: fi_rma -o put_lat|get_lat|inject_lat|put_bw|get_bw|atomic|fetch [-p PROVIDER] "
                    "[-m MAX] [-t SECONDS] [-W WINDOW] [-c CPU0,CPU1]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int c;
    while ((c = getopt(argc, argv, "o:p:m:t:W:c:")) != -1) {
        switch (c) {
        case 'o': {
            int found = -1;
            for (int i = 0; i < OPS; i++)
                if (!strcmp(optarg, op_names[i])) found = i;
            if (found < 0) usage();
            opt.op = (enum op)found;
            break;
        }
        case 'p': opt.provider = optarg; break;
        case 'm': opt.max_size = strtoull(optarg, NULL, 0); break;
        case 't': opt.budget = atof(optarg); break;
        case 'W': opt.window = atoi(optarg); break;
        case 'c':
            if (sscanf(optarg, "%d,%d", &opt.cpu[0], &opt.cpu[1]) != 2) usage();
            break;
        default: usage();
        }
    }
    if (opt.max_size == 0 || opt.window < 1 || opt.window > 1024 || opt.budget <= 0) usage();

    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair)) die("socketpair: %s", strerror(errno));
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) die("fork: %s", strerror(errno));
    int is_target = child == 0;
    sock = pair[is_target ? 1 : 0];
    close(pair[is_target ? 0 : 1]);
    if (is_target) role = "target";
    pin(opt.cpu[is_target]);

    open_fabric();
    exchange();
    if (is_target)
        target();
    else
        initiator();
    /* Both sides close only when neither has operations left. */
    put_u64(0);
    get_u64();
    fi_close(&ep->fid);
    if (write_cntr) fi_close(&write_cntr->fid);
    fi_close(&mr->fid);
    fi_close(&cq->fid);
    fi_close(&av->fid);
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
    fi_freeinfo(info);
    free(buf);
    if (is_target) return 0;
    int status;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
        die("the target failed (status %d)", status);
    return 0;
}
