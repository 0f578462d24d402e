/*
 * mpi-suite p2p: point-to-point transfers from 0 B to 64 MiB across every
 * protocol boundary of the unimem provider (inline 22/14/6 B, eager 16 KiB,
 * rendezvous segment 256 KiB, window 4 segments, staging 8 segments) and of
 * MPICH (16 KiB buffered-send limit, less its headers in active-message
 * mode), with exact data checks:
 *
 *   1. blocking Send/Recv between every pair of ranks, both directions,
 *      into oversized receive buffers (status, count and guard bytes);
 *   2. Isend/Irecv with both ring neighbours at once, one size at a time,
 *      receives posted before or after the sends;
 *   3. every size up to 4 MiB in flight at once, both ring directions;
 *   4. 64 MiB to the next rank with Sendrecv.
 *
 * Payload bytes depend on sender, receiver, size, offset and phase, so a
 * misplaced, truncated, stale or foreign byte is reported with its offset.
 */
#define NAME "p2p"
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

#define GUARD 64
#define GUARD_BYTE 0xA5
#define EAGER (16 * KiB)
#define SEG (256 * KiB)

static const size_t sizes[] = {
    0, 1, 2, 5, 6, 7, 8, 13, 14, 15, 16, 21, 22, 23, 24, 25, 31, 32, 33, 63, 64, 65,
    100, 255, 256, 257, 1023, 1024, 4095, 4096, 8191, 8192, 8193,
    EAGER - 160, EAGER - 96, EAGER - 64, EAGER - 56, EAGER - 48, EAGER - 40, EAGER - 33,
    EAGER - 32, EAGER - 31, EAGER - 30, EAGER - 28, EAGER - 25, EAGER - 24, EAGER - 16,
    EAGER - 8, EAGER - 1, EAGER, EAGER + 1, EAGER + 8, EAGER + 64, 2 * EAGER,
    64 * KiB - 1, 64 * KiB, 64 * KiB + 1,
    SEG - 1, SEG, SEG + 1, 2 * SEG - 1, 2 * SEG + 1, 4 * SEG - 1, 4 * SEG, 4 * SEG + 1,
    8 * SEG - 1, 8 * SEG, 8 * SEG + 1, 3 * MiB + 5, 4 * MiB + 7, 16 * MiB + 3,
};
#define NSIZES ((int)(sizeof sizes / sizeof sizes[0]))
/* Larger sizes go only around the ring (phase 2), not between every pair. */
#define PAIR_LIMIT (4 * MiB + 7)

static unsigned char *alloc_guarded(size_t n)
{
    return xmalloc(n + GUARD);
}

static void prepare_recv(unsigned char *buf, size_t n)
{
    memset(buf, 0, n);
    memset(buf + n, GUARD_BYTE, GUARD);
}

/* Checks a completed receive: status, data and the guard bytes after it. */
static void check_recv(int line, const char *what, MPI_Status *st, const unsigned char *buf,
                       size_t n, int src, int tag, uint64_t seed)
{
    int count;
    MPI_Get_count(st, MPI_BYTE, &count);
    if ((size_t)count != n || st->MPI_SOURCE != src || st->MPI_TAG != tag)
        fail(line, "%s: status says %d B from rank %d tag %d, expected %zu B from rank %d tag %d",
             what, count, st->MPI_SOURCE, st->MPI_TAG, n, src, tag);
    check_fill(line, buf, n, seed, "%s from rank %d tag %d", what, src, tag);
    for (size_t i = 0; i < GUARD; i++)
        if (buf[n + i] != GUARD_BYTE)
            fail(line, "%s from rank %d, %zu B: byte %zu after the message was overwritten", what,
                 src, n, n + i);
}

/* 1: blocking Send/Recv between every pair, both directions. */
static void pairwise_blocking(void)
{
    unsigned char *sbuf = alloc_guarded(PAIR_LIMIT), *rbuf = alloc_guarded(PAIR_LIMIT);
    int slots = nranks % 2 == 0 ? nranks : nranks + 1;
    for (int r = 0; r < slots - 1; r++) {
        int p = round_partner(rank, r, slots);
        if (p >= nranks)
            continue;
        for (int s = 0; s < NSIZES; s++) {
            size_t n = sizes[s];
            if (n > PAIR_LIMIT)
                continue;
            MPI_Status st;
            fill(sbuf, n, seed_of(rank, p, n, 1));
            prepare_recv(rbuf, n);
            if (rank < p) {
                MPI_Send(sbuf, (int)n, MPI_BYTE, p, s, MPI_COMM_WORLD);
                MPI_Recv(rbuf, (int)n + GUARD, MPI_BYTE, p, s, MPI_COMM_WORLD, &st);
            } else {
                MPI_Recv(rbuf, (int)n + GUARD, MPI_BYTE, p, s, MPI_COMM_WORLD, &st);
                MPI_Send(sbuf, (int)n, MPI_BYTE, p, s, MPI_COMM_WORLD);
            }
            check_recv(__LINE__, "blocking Recv", &st, rbuf, n, p, s, seed_of(p, rank, n, 1));
        }
    }
    free(sbuf);
    free(rbuf);
}

/* One message to `dst` and one from `src` (direction d of the ring). */
struct leg {
    int dst, src, tag;
    unsigned char *sbuf, *rbuf;
};

/* 2: Isend/Irecv with both ring neighbours at once, one size at a time;
 * on odd steps the sends are posted first, so messages may come unexpected. */
static void ring_nonblocking(void)
{
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    size_t max = sizes[NSIZES - 1];
    struct leg leg[2] = {
        {next, prev, 0, alloc_guarded(max), alloc_guarded(max)},
        {prev, next, 0, alloc_guarded(max), alloc_guarded(max)},
    };
    for (int s = 0; s < NSIZES; s++) {
        size_t n = sizes[s];
        for (int d = 0; d < 2; d++) {
            leg[d].tag = 2 * s + d;
            fill(leg[d].sbuf, n, seed_of(rank, leg[d].dst, n, 2 + d));
            prepare_recv(leg[d].rbuf, n);
        }
        int one_at_a_time = avoid_am_bugs && is_am_long(n);
        for (int first = 0; first < 2; first += one_at_a_time ? 1 : 2) {
            int count = one_at_a_time ? 1 : 2;
            MPI_Request rreq[2], sreq[2];
            MPI_Status rst[2];
            if (s % 2 == 0)
                for (int i = 0; i < count; i++)
                    MPI_Irecv(leg[first + i].rbuf, (int)n + GUARD, MPI_BYTE, leg[first + i].src,
                              leg[first + i].tag, MPI_COMM_WORLD, &rreq[i]);
            for (int i = 0; i < count; i++)
                MPI_Isend(leg[first + i].sbuf, (int)n, MPI_BYTE, leg[first + i].dst,
                          leg[first + i].tag, MPI_COMM_WORLD, &sreq[i]);
            if (s % 2 == 1)
                for (int i = 0; i < count; i++)
                    MPI_Irecv(leg[first + i].rbuf, (int)n + GUARD, MPI_BYTE, leg[first + i].src,
                              leg[first + i].tag, MPI_COMM_WORLD, &rreq[i]);
            MPI_Waitall(count, sreq, MPI_STATUSES_IGNORE);
            MPI_Waitall(count, rreq, rst);
            for (int i = 0; i < count; i++) {
                struct leg *l = &leg[first + i];
                check_recv(__LINE__, s % 2 ? "Irecv posted after Isend" : "Irecv posted before Isend",
                           &rst[i], l->rbuf, n, l->src, l->tag,
                           seed_of(l->src, rank, n, 2 + first + i));
            }
        }
    }
    for (int d = 0; d < 2; d++) {
        free(leg[d].sbuf);
        free(leg[d].rbuf);
    }
}

/* 3: every size up to PAIR_LIMIT in flight at once, both ring directions
 * (in restricted active-message mode the long ones go one at a time). */
static void ring_all_at_once(void)
{
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    int count = 0;
    size_t off[NSIZES + 1];
    off[0] = 0;
    for (int s = 0; s < NSIZES && sizes[s] <= PAIR_LIMIT; s++, count++)
        off[s + 1] = off[s] + sizes[s] + GUARD;
    struct leg leg[2] = {
        {next, prev, 1000, alloc_guarded(off[count]), alloc_guarded(off[count])},
        {prev, next, 2000, alloc_guarded(off[count]), alloc_guarded(off[count])},
    };
    MPI_Request *req = xmalloc(4 * (size_t)count * sizeof *req);
    MPI_Status *st = xmalloc(4 * (size_t)count * sizeof *st);
    int k = 0;
    /* the receives, then the sends in reverse size order, so that big
     * rendezvous transfers overlap small messages */
    for (int s = 0; s < count; s++) {
        if (avoid_am_bugs && is_am_long(sizes[s]))
            continue;
        for (int d = 0; d < 2; d++) {
            prepare_recv(leg[d].rbuf + off[s], sizes[s]);
            MPI_Irecv(leg[d].rbuf + off[s], (int)sizes[s] + GUARD, MPI_BYTE, leg[d].src,
                      leg[d].tag + s, MPI_COMM_WORLD, &req[k++]);
        }
    }
    int nrecv = k;
    for (int s = count - 1; s >= 0; s--) {
        if (avoid_am_bugs && is_am_long(sizes[s]))
            continue;
        for (int d = 0; d < 2; d++) {
            fill(leg[d].sbuf + off[s], sizes[s], seed_of(rank, leg[d].dst, sizes[s], 4 + d));
            MPI_Isend(leg[d].sbuf + off[s], (int)sizes[s], MPI_BYTE, leg[d].dst, leg[d].tag + s,
                      MPI_COMM_WORLD, &req[k++]);
        }
    }
    MPI_Waitall(k, req, st);
    for (int s = 0, i = 0; s < count && i < nrecv; s++) {
        if (avoid_am_bugs && is_am_long(sizes[s]))
            continue;
        for (int d = 0; d < 2; d++, i++)
            check_recv(__LINE__, "all sizes at once", &st[i], leg[d].rbuf + off[s], sizes[s],
                       leg[d].src, leg[d].tag + s, seed_of(leg[d].src, rank, sizes[s], 4 + d));
    }
    /* restricted mode: the long ones, one message per pair at a time */
    for (int s = 0; avoid_am_bugs && s < count; s++) {
        if (!is_am_long(sizes[s]))
            continue;
        for (int d = 0; d < 2; d++) {
            size_t n = sizes[s];
            prepare_recv(leg[d].rbuf + off[s], n);
            fill(leg[d].sbuf + off[s], n, seed_of(rank, leg[d].dst, n, 4 + d));
            MPI_Sendrecv(leg[d].sbuf + off[s], (int)n, MPI_BYTE, leg[d].dst, leg[d].tag + s,
                         leg[d].rbuf + off[s], (int)n + GUARD, MPI_BYTE, leg[d].src,
                         leg[d].tag + s, MPI_COMM_WORLD, &st[0]);
            check_recv(__LINE__, "all sizes, one long at a time", &st[0], leg[d].rbuf + off[s], n,
                       leg[d].src, leg[d].tag + s, seed_of(leg[d].src, rank, n, 4 + d));
        }
    }
    for (int d = 0; d < 2; d++) {
        free(leg[d].sbuf);
        free(leg[d].rbuf);
    }
    free(req);
    free(st);
}

/* 4: 64 MiB to the next rank, with Sendrecv. */
static void ring_huge(void)
{
    size_t n = 64 * MiB;
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    unsigned char *sbuf = alloc_guarded(n), *rbuf = alloc_guarded(n);
    MPI_Status st;
    fill(sbuf, n, seed_of(rank, next, n, 6));
    prepare_recv(rbuf, n);
    MPI_Sendrecv(sbuf, (int)n, MPI_BYTE, next, 64, rbuf, (int)n + GUARD, MPI_BYTE, prev, 64,
                 MPI_COMM_WORLD, &st);
    check_recv(__LINE__, "64 MiB Sendrecv", &st, rbuf, n, prev, 64, seed_of(prev, rank, n, 6));
    free(sbuf);
    free(rbuf);
}

int main(int argc, char **argv)
{
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    phase("blocking Send/Recv between pairs");
    pairwise_blocking();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("Isend/Irecv with both ring neighbours");
    ring_nonblocking();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("every size in flight at once");
    ring_all_at_once();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("64 MiB Sendrecv");
    ring_huge();
    suite_pass();
    return 0;
}
