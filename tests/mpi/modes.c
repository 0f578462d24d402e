/*
 * mpi-suite modes: send modes and messages to self.
 *
 *   1. MPI_Ssend between every pair, both directions, every protocol size;
 *   2. MPI_Issend must not complete before the matching receive is posted
 *      (checked with MPI_Test for a while), and completes after it;
 *   3. MPI_Rsend and MPI_Irsend around the ring, the receive posted before
 *      a barrier and the ready send after it;
 *   4. MPI_Bsend and MPI_Ibsend with a buffer from MPI_Buffer_attach sized
 *      with MPI_Pack_size + MPI_BSEND_OVERHEAD; the receiver comes late;
 *      MPI_Buffer_detach waits for the buffered messages;
 *   5. messages to self: Isend + Recv, Issend + Recv, Sendrecv, all sizes;
 *      MPI_Sendrecv_replace around the ring.
 */
#define NAME "modes"
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

static const int msizes[] = {0, 1, 6, 7, 14, 15, 22, 23, 1000, 16320, 16352, 16384, 16385,
                             65536, 262144, 262145, MiB + 1, 4 * MiB};
#define NMSIZES ((int)(sizeof msizes / sizeof msizes[0]))
#define MMAX (4 * MiB)

/* 1: Ssend between every pair */
static void ssend_pairs(void)
{
    unsigned char *sbuf = xmalloc(MMAX), *rbuf = xmalloc(MMAX);
    int slots = nranks % 2 == 0 ? nranks : nranks + 1;
    for (int r = 0; r < slots - 1; r++) {
        int p = round_partner(rank, r, slots);
        if (p >= nranks)
            continue;
        for (int s = 0; s < NMSIZES; s++) {
            int n = msizes[s];
            MPI_Status st;
            fill(sbuf, (size_t)n, seed_of(rank, p, n, 50));
            if (rank < p) {
                MPI_Ssend(sbuf, n, MPI_BYTE, p, s, MPI_COMM_WORLD);
                MPI_Recv(rbuf, MMAX, MPI_BYTE, p, s, MPI_COMM_WORLD, &st);
            } else {
                MPI_Recv(rbuf, MMAX, MPI_BYTE, p, s, MPI_COMM_WORLD, &st);
                MPI_Ssend(sbuf, n, MPI_BYTE, p, s, MPI_COMM_WORLD);
            }
            check_status(__LINE__, "Ssend", &st, p, s, n);
            check_fill(__LINE__, rbuf, (size_t)n, seed_of(p, rank, n, 50), "Ssend from rank %d", p);
        }
    }
    free(sbuf);
    free(rbuf);
}

/* 2: Issend completes only once the receive is there */
static void issend_sync(void)
{
    static const int sizes[] = {0, 10, 16385, MiB};
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    unsigned char *sbuf = xmalloc(MiB), *rbuf = xmalloc(MiB);
    for (int s = 0; s < 4; s++) {
        int n = sizes[s], flag = 0;
        MPI_Request req;
        MPI_Status st;
        fill(sbuf, (size_t)n, seed_of(rank, next, n, 51));
        MPI_Issend(sbuf, n, MPI_BYTE, next, 70 + s, MPI_COMM_WORLD, &req);
        /* nobody has posted the receive yet */
        double until = MPI_Wtime() + 0.05;
        while (MPI_Wtime() < until) {
            MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
            CHECK(!flag, "MPI_Issend of %d B completed before its receive was posted", n);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Recv(rbuf, n, MPI_BYTE, prev, 70 + s, MPI_COMM_WORLD, &st);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        check_status(__LINE__, "Issend", &st, prev, 70 + s, n);
        check_fill(__LINE__, rbuf, (size_t)n, seed_of(prev, rank, n, 51), "Issend from rank %d", prev);
    }
    free(sbuf);
    free(rbuf);
}

/* 3: ready sends, the receive posted before a barrier */
static void rsend_ring(void)
{
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    unsigned char *sbuf = xmalloc(MMAX), *rbuf = xmalloc(MMAX);
    for (int s = 0; s < NMSIZES; s++) {
        int n = msizes[s];
        MPI_Request rreq, sreq;
        MPI_Status st;
        fill(sbuf, (size_t)n, seed_of(rank, next, n, 52));
        MPI_Irecv(rbuf, n, MPI_BYTE, prev, 80 + s, MPI_COMM_WORLD, &rreq);
        MPI_Barrier(MPI_COMM_WORLD);
        if (s % 2 == 0) {
            MPI_Rsend(sbuf, n, MPI_BYTE, next, 80 + s, MPI_COMM_WORLD);
        } else {
            MPI_Irsend(sbuf, n, MPI_BYTE, next, 80 + s, MPI_COMM_WORLD, &sreq);
            MPI_Wait(&sreq, MPI_STATUS_IGNORE);
        }
        MPI_Wait(&rreq, &st);
        check_status(__LINE__, s % 2 ? "Irsend" : "Rsend", &st, prev, 80 + s, n);
        check_fill(__LINE__, rbuf, (size_t)n, seed_of(prev, rank, n, 52), "%s from rank %d",
                   s % 2 ? "Irsend" : "Rsend", prev);
    }
    free(sbuf);
    free(rbuf);
}

/* 4: buffered sends */
static void bsend_ring(void)
{
    static const int all[] = {0, 7, 100, 16000, 16385, 300000, MiB + 1};
    int sizes[7], count = 0, have_long = 0;
    for (int i = 0; i < 7; i++) {
        /* restricted active-message mode: one long message in flight */
        if (avoid_am_bugs && is_am_long((size_t)all[i]) && have_long++)
            continue;
        sizes[count++] = all[i];
    }
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    int bufsize = 0;
    for (int i = 0; i < count; i++) {
        int packed;
        MPI_Pack_size(sizes[i], MPI_BYTE, MPI_COMM_WORLD, &packed);
        bufsize += packed + MPI_BSEND_OVERHEAD;
    }
    char *attached = xmalloc((size_t)bufsize);
    MPI_Buffer_attach(attached, bufsize);
    unsigned char *sbuf = xmalloc(MiB + 1), *rbuf = xmalloc(MiB + 1);
    for (int i = 0; i < count; i++) {
        /* the same send buffer every time: Bsend copies it out at once */
        fill(sbuf, (size_t)sizes[i], seed_of(rank, next, i, 53));
        if (i % 3 == 2) {
            MPI_Request req;
            MPI_Ibsend(sbuf, sizes[i], MPI_BYTE, next, 90, MPI_COMM_WORLD, &req);
            MPI_Wait(&req, MPI_STATUS_IGNORE);
        } else {
            MPI_Bsend(sbuf, sizes[i], MPI_BYTE, next, 90, MPI_COMM_WORLD);
        }
        memset(sbuf, 0xee, (size_t)sizes[i]);
    }
    /* Not a synchronisation: a pause before receiving, so that the messages
     * are likely to arrive unexpected. The checks below hold whatever the
     * timing (on a slow machine they just test the posted path more). */
    sleep_ms(20);
    for (int i = 0; i < count; i++) {
        MPI_Status st;
        MPI_Recv(rbuf, MiB + 1, MPI_BYTE, prev, 90, MPI_COMM_WORLD, &st);
        check_status(__LINE__, "Bsend", &st, prev, 90, sizes[i]);
        check_fill(__LINE__, rbuf, (size_t)sizes[i], seed_of(prev, rank, i, 53),
                   "Bsend message %d from rank %d", i, prev);
    }
    void *detached;
    int detached_size;
    MPI_Buffer_detach(&detached, &detached_size);
    CHECK(detached == attached && detached_size == bufsize,
          "MPI_Buffer_detach gave %p/%d, attached %p/%d", detached, detached_size, (void *)attached,
          bufsize);
    free(attached);
    free(sbuf);
    free(rbuf);
}

/* 5: messages to self */
static void self_messages(void)
{
    unsigned char *sbuf = xmalloc(MMAX), *rbuf = xmalloc(MMAX);
    for (int s = 0; s < NMSIZES; s++) {
        int n = msizes[s];
        MPI_Request req;
        MPI_Status st;

        fill(sbuf, (size_t)n, seed_of(rank, rank, n, 54));
        MPI_Isend(sbuf, n, MPI_BYTE, rank, 100 + s, MPI_COMM_WORLD, &req);
        MPI_Recv(rbuf, MMAX, MPI_BYTE, rank, 100 + s, MPI_COMM_WORLD, &st);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        check_status(__LINE__, "Isend to self", &st, rank, 100 + s, n);
        check_fill(__LINE__, rbuf, (size_t)n, seed_of(rank, rank, n, 54), "Isend to self");

        fill(sbuf, (size_t)n, seed_of(rank, rank, n, 55));
        MPI_Issend(sbuf, n, MPI_BYTE, rank, 200 + s, MPI_COMM_WORLD, &req);
        MPI_Recv(rbuf, MMAX, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        check_status(__LINE__, "Issend to self", &st, rank, 200 + s, n);
        check_fill(__LINE__, rbuf, (size_t)n, seed_of(rank, rank, n, 55), "Issend to self");

        fill(sbuf, (size_t)n, seed_of(rank, rank, n, 56));
        MPI_Sendrecv(sbuf, n, MPI_BYTE, rank, 300 + s, rbuf, MMAX, MPI_BYTE, rank, 300 + s,
                     MPI_COMM_WORLD, &st);
        check_status(__LINE__, "Sendrecv with self", &st, rank, 300 + s, n);
        check_fill(__LINE__, rbuf, (size_t)n, seed_of(rank, rank, n, 56), "Sendrecv with self");
    }
    /* A rank that is through with its messages to self must not send to
     * one still at them: a receive there from any source may match it
     * (MPI orders messages per sender only), and the Issend to self then
     * waits forever. MPICH happened to match its own message first; Intel
     * MPI, in about a third of the runs, did not. */
    MPI_Barrier(MPI_COMM_WORLD);
    /* Sendrecv_replace: the buffer goes to next and comes back from prev */
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    for (int s = 0; s < NMSIZES; s++) {
        int n = msizes[s];
        MPI_Status st;
        fill(sbuf, (size_t)n, seed_of(rank, next, n, 57));
        MPI_Sendrecv_replace(sbuf, n, MPI_BYTE, next, 400, prev, 400, MPI_COMM_WORLD, &st);
        check_status(__LINE__, "Sendrecv_replace", &st, prev, 400, n);
        check_fill(__LINE__, sbuf, (size_t)n, seed_of(prev, rank, n, 57),
                   "Sendrecv_replace from rank %d", prev);
    }
    free(sbuf);
    free(rbuf);
}

int main(int argc, char **argv)
{
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    phase("Ssend between pairs");
    ssend_pairs();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("Issend waits for its receive");
    issend_sync();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("Rsend around the ring");
    rsend_ring();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("Bsend around the ring");
    bsend_ring();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("messages to self");
    self_messages();
    suite_pass();
    return 0;
}
