/*
 * mpi-suite backlog: sends to a rank that is busy computing.
 *
 * In pairs (0 -> 1, 2 -> 3): the sender posts 100 MPI_Isend of 100 B,
 * then 100 more of mixed sizes (inline, eager, up to 16000 B) on
 * alternating tags, while the receiver is in a compute phase (it sleeps
 * 300 ms without an MPI call) before it posts its receives. The provider
 * accepts every send at once, whatever the receiver's eager credits: the
 * Isend loop never waits for the receiver (what its credits cannot take
 * waits in the sender's provider). Then the receiver posts its receives
 * in send order and checks every message (same source and tag: they
 * match in send order). Rank 0 prints how long its first Isend loop took
 * (a note, never checked: a bound on time would be a benchmark;
 * scripts/bench-sendq sets MPI_SUITE_COMPUTE_MS for a longer compute phase).
 */
#define NAME "backlog"
#define _POSIX_C_SOURCE 200809L
#include "suite.h"

#define FIRST 100
#define FIRST_SIZE 100
#define MIXED 100
#define COMPUTE_MS 300

static const int mixed_sizes[] = {8, 100, 2000, 16000, 700};
#define NMIXED_SIZES (int)(sizeof mixed_sizes / sizeof mixed_sizes[0])

static int size_of(int i)
{
    return i < FIRST ? FIRST_SIZE : mixed_sizes[i % NMIXED_SIZES];
}

static int tag_of(int i)
{
    return i < FIRST ? 1 : 2 + i % 2;
}

int main(int argc, char **argv)
{
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    int n = FIRST + MIXED;
    int partner = rank % 2 == 0 ? rank + 1 : rank - 1;
    int sender = rank % 2 == 0;
    size_t *off = xmalloc(((size_t)n + 1) * sizeof *off);
    off[0] = 0;
    for (int i = 0; i < n; i++)
        off[i + 1] = off[i] + (size_t)size_of(i);
    unsigned char *buf = xmalloc(off[n]);
    MPI_Request *req = xmalloc((size_t)n * sizeof *req);
    phase("ready");
    MPI_Barrier(MPI_COMM_WORLD);
    if (partner < nranks && sender) {
        phase("Isend to rank %d, which computes", partner);
        for (int i = 0; i < n; i++)
            fill(buf + off[i], (size_t)size_of(i), seed_of((uint64_t)rank, (uint64_t)partner, (uint64_t)i, 0));
        double start = MPI_Wtime();
        for (int i = 0; i < FIRST; i++)
            MPI_Isend(buf + off[i], size_of(i), MPI_BYTE, partner, tag_of(i), MPI_COMM_WORLD, &req[i]);
        double took = MPI_Wtime() - start;
        for (int i = FIRST; i < n; i++)
            MPI_Isend(buf + off[i], size_of(i), MPI_BYTE, partner, tag_of(i), MPI_COMM_WORLD, &req[i]);
        if (rank == 0) {
            printf("mpi-suite %s: note: %d MPI_Isend of %d B to a computing rank took %.3f ms\n", NAME,
                   FIRST, FIRST_SIZE, took * 1e3);
            fflush(stdout);
        }
        phase("Isend to rank %d: MPI_Waitall", partner);
        MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
    } else if (partner < nranks) {
        phase("compute");
        const char *ms = getenv("MPI_SUITE_COMPUTE_MS");
        sleep_ms(ms ? atoi(ms) : COMPUTE_MS);
        phase("receive from rank %d", partner);
        memset(buf, 0, off[n]);
        for (int i = 0; i < n; i++)
            MPI_Irecv(buf + off[i], size_of(i), MPI_BYTE, partner, tag_of(i), MPI_COMM_WORLD, &req[i]);
        MPI_Status *st = xmalloc((size_t)n * sizeof *st);
        MPI_Waitall(n, req, st);
        for (int i = 0; i < n; i++) {
            check_status(__LINE__, "backlog", &st[i], partner, tag_of(i), size_of(i));
            check_fill(__LINE__, buf + off[i], (size_t)size_of(i),
                       seed_of((uint64_t)partner, (uint64_t)rank, (uint64_t)i, 0),
                       "message %d from rank %d", i, partner);
        }
        free(st);
    }
    free(req);
    free(buf);
    free(off);
    suite_pass();
    return 0;
}
