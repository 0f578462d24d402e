/*
 * mpi-suite flood: many messages at once.
 *
 *   1. 500 Isend and 500 Irecv outstanding each way around the ring, mixed
 *      sizes (mostly inline and eager, some rendezvous), several tags;
 *      receives completed with MPI_Waitany, sends with MPI_Testsome;
 *   2. 1200 small messages outstanding each way (beyond the provider's
 *      1024-entry transmit and receive queues), MPI_Waitall;
 *   3. unexpected bursts between every pair: the sender floods 400
 *      messages of four size classes before the receiver, asleep, has
 *      posted anything; the receiver then takes the classes in a different
 *      order (each class in send order);
 *   4. all ranks flood rank 0 at once; rank 0 sleeps, then receives them
 *      source by source, tags in reverse order, with MPI_Waitsome;
 *   5. mixed traffic between all ranks at once: rounds in which every rank
 *      sends every other rank a few messages of pseudo-random sizes (up to
 *      600 KB, so several rendezvous transfers from several peers overlap),
 *      half the receives posted before the sends and half after.
 */
#define NAME "flood"
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

/* Isend into req[*k]. Where avoid_am_bugs is set (see there), a long message
 * goes with a blocking MPI_Send instead (req[*k] becomes MPI_REQUEST_NULL):
 * one long message in flight per rank, and none in flight while short ones
 * are posted (MPICH 5.0.2 crashes on that too, in mixed traffic). Every
 * receiver here either has its receives posted or takes the messages in an
 * order that lets such a send complete. */
static void isend_or_send(const void *buf, int n, int dst, int tag, MPI_Request *req, int *k)
{
    if (avoid_am_bugs && is_am_long((size_t)n)) {
        MPI_Send(buf, n, MPI_BYTE, dst, tag, MPI_COMM_WORLD);
        req[(*k)++] = MPI_REQUEST_NULL;
        return;
    }
    MPI_Isend(buf, n, MPI_BYTE, dst, tag, MPI_COMM_WORLD, &req[(*k)++]);
}

/* Offsets of n messages of sizes size(i) laid end to end. */
static size_t *layout(int n, int (*size)(int))
{
    size_t *off = xmalloc(((size_t)n + 1) * sizeof *off);
    off[0] = 0;
    for (int i = 0; i < n; i++)
        off[i + 1] = off[i] + (size_t)size(i);
    return off;
}

/* ---- 1: 500 outstanding each way ---- */

#define MANY 500
static int many_size(int i)
{
    static const int small[] = {0, 1, 6, 7, 14, 15, 22, 23, 64, 200, 1500, 4000, 9000, 16384};
    static const int big[] = {16385, 70000, 262145, MiB + 1};
    if (i % 50 == 49)
        return big[(i / 50) % 4];
    return small[i % 14];
}
static int many_tag(int i)
{
    return i % 5;
}

static void many_outstanding(void)
{
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    size_t *off = layout(MANY, many_size);
    unsigned char *sbuf = xmalloc(off[MANY]), *rbuf = xmalloc(off[MANY]);
    MPI_Request rreq[MANY], sreq[MANY];
    int sidx[MANY], done[MANY] = {0};
    /* in restricted mode everything is posted before the (gated) sends */
    int early = avoid_am_bugs ? MANY : MANY / 2;
    for (int i = 0; i < early; i++)
        MPI_Irecv(rbuf + off[i], many_size(i), MPI_BYTE, prev, many_tag(i), MPI_COMM_WORLD, &rreq[i]);
    int k = 0;
    for (int i = 0; i < MANY; i++) {
        fill(sbuf + off[i], (size_t)many_size(i), seed_of(rank, next, i, 40));
        isend_or_send(sbuf + off[i], many_size(i), next, many_tag(i), sreq, &k);
    }
    for (int i = early; i < MANY; i++)
        MPI_Irecv(rbuf + off[i], many_size(i), MPI_BYTE, prev, many_tag(i), MPI_COMM_WORLD, &rreq[i]);

    int recvs_left = MANY, sends_left = MANY;
    for (int i = 0; i < MANY; i++)
        if (sreq[i] == MPI_REQUEST_NULL)
            sends_left--; /* sent with MPI_Send */
    while (recvs_left > 0 || sends_left > 0) {
        if (recvs_left > 0) {
            int idx;
            MPI_Status st;
            MPI_Waitany(MANY, rreq, &idx, &st);
            CHECK(idx != MPI_UNDEFINED && !done[idx], "MPI_Waitany returned %d", idx);
            done[idx] = 1;
            recvs_left--;
            check_status(__LINE__, "Waitany", &st, prev, many_tag(idx), many_size(idx));
            check_fill(__LINE__, rbuf + off[idx], (size_t)many_size(idx), seed_of(prev, rank, idx, 40),
                       "message %d of %d outstanding from rank %d", idx, MANY, prev);
        }
        if (sends_left > 0) {
            int outcount;
            MPI_Testsome(MANY, sreq, &outcount, sidx, MPI_STATUSES_IGNORE);
            CHECK(outcount != MPI_UNDEFINED, "MPI_Testsome found no active send, %d left", sends_left);
            sends_left -= outcount;
        }
    }
    free(off);
    free(sbuf);
    free(rbuf);
}

/* ---- 2: beyond the queue depths ---- */

#define DEEP 1200
static void deep_queues(void)
{
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    uint64_t *out = xmalloc(DEEP * sizeof *out), *in = xmalloc(DEEP * sizeof *in);
    MPI_Request *req = xmalloc(2 * DEEP * sizeof *req);
    for (int i = 0; i < DEEP; i++)
        MPI_Irecv(&in[i], 8, MPI_BYTE, prev, 9, MPI_COMM_WORLD, &req[i]);
    for (int i = 0; i < DEEP; i++) {
        out[i] = seed_of(rank, next, i, 41);
        MPI_Isend(&out[i], 8, MPI_BYTE, next, 9, MPI_COMM_WORLD, &req[DEEP + i]);
    }
    MPI_Waitall(2 * DEEP, req, MPI_STATUSES_IGNORE);
    for (int i = 0; i < DEEP; i++)
        CHECK(in[i] == seed_of(prev, rank, i, 41), "deep queue: message %d of %d from rank %d is "
              "wrong or out of order", i, DEEP, prev);
    free(out);
    free(in);
    free(req);
}

/* ---- 3: unexpected bursts between pairs ---- */

#define BURST 400
/* class c of message i, and its size and tag */
static int burst_class(int i)
{
    if (i % 100 == 57)
        return 3; /* rendezvous: 4 in a burst */
    if (i % 7 == 3)
        return 2; /* eager, up to eager_size */
    return i % 2; /* 0: inline, 1: small eager */
}
static int burst_size(int i)
{
    switch (burst_class(i)) {
    case 0:
        return i % 23;
    case 1:
        return 100 + (i * 37) % 4000;
    case 2:
        return (avoid_am_bugs ? AM_LONG : 16384) - (i % 5) * 8;
    default:
        return 100000 + i * 512;
    }
}

static void burst_send(int p)
{
    size_t *off = layout(BURST, burst_size);
    unsigned char *buf = xmalloc(off[BURST]);
    MPI_Request req[BURST];
    int k = 0;
    for (int i = 0; i < BURST; i++) {
        fill(buf + off[i], (size_t)burst_size(i), seed_of(rank, p, i, 42));
        isend_or_send(buf + off[i], burst_size(i), p, 60 + burst_class(i), req, &k);
    }
    MPI_Waitall(k, req, MPI_STATUSES_IGNORE);
    free(off);
    free(buf);
}

static void burst_recv(int p)
{
    static const int order[] = {3, 1, 0, 2};
    size_t *off = layout(BURST, burst_size);
    unsigned char *buf = xmalloc(off[BURST]);
    /* Not a synchronisation: the receiver "asleep" while the burst comes
     * in is the case tested (messages unexpected). The checks hold whatever
     * the timing; a slow machine only makes fewer of them unexpected. */
    sleep_ms(50);
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < BURST; i++) {
            if (burst_class(i) != order[c])
                continue;
            MPI_Status st;
            MPI_Recv(buf + off[i], burst_size(i), MPI_BYTE, p, 60 + order[c], MPI_COMM_WORLD, &st);
            check_status(__LINE__, "unexpected burst", &st, p, 60 + order[c], burst_size(i));
            check_fill(__LINE__, buf + off[i], (size_t)burst_size(i), seed_of(p, rank, i, 42),
                       "burst message %d (class %d) from rank %d", i, order[c], p);
        }
    }
    free(off);
    free(buf);
}

static void bursts(void)
{
    int slots = nranks % 2 == 0 ? nranks : nranks + 1;
    for (int r = 0; r < slots - 1; r++) {
        int p = round_partner(rank, r, slots);
        if (p < nranks && rank < p) {
            burst_send(p);
            burst_recv(p);
        } else if (p < nranks) {
            burst_recv(p);
            burst_send(p);
        }
    }
}

/* ---- 4: everybody floods rank 0 ---- */

#define FAN 100
static int fan_size(int i)
{
    return i == 50 ? 200000 : (i * 331) % 16000;
}

static void fan_in(void)
{
    size_t *off = layout(FAN, fan_size);
    if (rank != 0) {
        unsigned char *buf = xmalloc(off[FAN]);
        MPI_Request req[FAN];
        for (int i = 0; i < FAN; i++) {
            fill(buf + off[i], (size_t)fan_size(i), seed_of(rank, 0, i, 43));
            MPI_Isend(buf + off[i], fan_size(i), MPI_BYTE, 0, 1000 + i, MPI_COMM_WORLD, &req[i]);
        }
        MPI_Waitall(FAN, req, MPI_STATUSES_IGNORE);
        free(buf);
    } else {
        unsigned char *buf = xmalloc(off[FAN]);
        MPI_Request req[FAN];
        MPI_Status st[FAN];
        int idx[FAN];
        /* Not a synchronisation: rank 0 late while everybody floods it is
         * the case tested; the checks hold whatever the timing. */
        sleep_ms(50);
        for (int src = nranks - 1; src > 0; src--) {
            for (int i = FAN - 1; i >= 0; i--)
                MPI_Irecv(buf + off[i], fan_size(i), MPI_BYTE, src, 1000 + i, MPI_COMM_WORLD,
                          &req[FAN - 1 - i]);
            int left = FAN;
            while (left > 0) {
                int outcount;
                MPI_Waitsome(FAN, req, &outcount, idx, st);
                CHECK(outcount > 0 && outcount != MPI_UNDEFINED, "MPI_Waitsome gave %d", outcount);
                for (int j = 0; j < outcount; j++) {
                    int i = FAN - 1 - idx[j];
                    check_status(__LINE__, "fan-in", &st[j], src, 1000 + i, fan_size(i));
                    check_fill(__LINE__, buf + off[i], (size_t)fan_size(i), seed_of(src, 0, i, 43),
                               "fan-in message %d from rank %d", i, src);
                }
                left -= outcount;
            }
        }
        free(buf);
    }
    free(off);
}

/* ---- 5: mixed traffic between all ranks ---- */

#define ROUNDS 30
#define PER_PEER 6

/* Size of message k from src to dst in round r: mostly small, some eager,
 * some rendezvous. */
static int mixed_size(int src, int dst, int r, int k)
{
    uint64_t x = seed_of(src, dst, r, k);
    switch (x % 8) {
    case 0:
    case 1:
    case 2:
        return (int)((x >> 8) % 33);
    case 3:
    case 4:
    case 5:
        return 33 + (int)((x >> 8) % 16352);
    default:
        return 16385 + (int)((x >> 8) % 600000);
    }
}

static void mixed_traffic(void)
{
    int n = (nranks - 1) * PER_PEER;
    size_t *soff = xmalloc(((size_t)n + 1) * sizeof *soff), *roff = xmalloc(((size_t)n + 1) * sizeof *roff);
    MPI_Request *rreq = xmalloc((size_t)n * sizeof *rreq), *sreq = xmalloc((size_t)n * sizeof *sreq);
    MPI_Status *st = xmalloc((size_t)n * sizeof *st);
    for (int r = 0; r < ROUNDS; r++) {
        /* message j: peer j / PER_PEER (skipping this rank), number j % PER_PEER */
        soff[0] = roff[0] = 0;
        for (int j = 0; j < n; j++) {
            int peer = j / PER_PEER >= rank ? j / PER_PEER + 1 : j / PER_PEER, k = j % PER_PEER;
            soff[j + 1] = soff[j] + (size_t)mixed_size(rank, peer, r, k);
            roff[j + 1] = roff[j] + (size_t)mixed_size(peer, rank, r, k);
        }
        unsigned char *sbuf = xmalloc(soff[n]), *rbuf = xmalloc(roff[n]);
        int early = avoid_am_bugs ? n : n / 2, ks = 0;
        for (int j = 0; j < n; j++) {
            int peer = j / PER_PEER >= rank ? j / PER_PEER + 1 : j / PER_PEER, k = j % PER_PEER;
            if (j < early || j % 2 == 0) /* the rest after the sends */
                MPI_Irecv(rbuf + roff[j], mixed_size(peer, rank, r, k), MPI_BYTE, peer, 2000 + k,
                          MPI_COMM_WORLD, &rreq[j]);
            else
                rreq[j] = MPI_REQUEST_NULL;
        }
        for (int j = 0; j < n; j++) {
            int peer = j / PER_PEER >= rank ? j / PER_PEER + 1 : j / PER_PEER, k = j % PER_PEER;
            fill(sbuf + soff[j], (size_t)mixed_size(rank, peer, r, k), seed_of(rank, peer, r, 100 + k));
            isend_or_send(sbuf + soff[j], mixed_size(rank, peer, r, k), peer, 2000 + k, sreq, &ks);
        }
        for (int j = 0; j < n; j++) {
            int peer = j / PER_PEER >= rank ? j / PER_PEER + 1 : j / PER_PEER, k = j % PER_PEER;
            if (rreq[j] == MPI_REQUEST_NULL)
                MPI_Irecv(rbuf + roff[j], mixed_size(peer, rank, r, k), MPI_BYTE, peer, 2000 + k,
                          MPI_COMM_WORLD, &rreq[j]);
        }
        MPI_Waitall(n, rreq, st);
        MPI_Waitall(ks, sreq, MPI_STATUSES_IGNORE);
        for (int j = 0; j < n; j++) {
            int peer = j / PER_PEER >= rank ? j / PER_PEER + 1 : j / PER_PEER, k = j % PER_PEER;
            check_status(__LINE__, "mixed traffic", &st[j], peer, 2000 + k, mixed_size(peer, rank, r, k));
            check_fill(__LINE__, rbuf + roff[j], (size_t)mixed_size(peer, rank, r, k),
                       seed_of(peer, rank, r, 100 + k), "mixed traffic round %d, message %d from rank %d",
                       r, k, peer);
        }
        free(sbuf);
        free(rbuf);
    }
    free(soff);
    free(roff);
    free(rreq);
    free(sreq);
    free(st);
}

int main(int argc, char **argv)
{
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    if (avoid_am_bugs)
        suite_note = "active-message mode: long messages sent with blocking MPI_Send (MPICH 5.0.2 "
                     "defect)";
    phase("500 outstanding each way");
    many_outstanding();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("%d outstanding each way (beyond the queue depths)", DEEP);
    deep_queues();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("unexpected bursts between pairs");
    bursts();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("fan-in to rank 0");
    fan_in();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("mixed traffic between all ranks");
    mixed_traffic();
    suite_pass();
    return 0;
}
