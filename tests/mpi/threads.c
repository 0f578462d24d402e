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

#include "suite.h"
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

static void check_thread_status(int line, int t, const char *what, MPI_Status *st, int src, int tag, int n)
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
        check_thread_status(__LINE__, t, "tagged receive", &st[it], prev, t, msg_size(t, it));
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
        check_thread_status(__LINE__, t, "wildcard receive (per-source order)", &st[j], s, it,
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
