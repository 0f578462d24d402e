/*
 * mpi-suite collectives: every collective, checked element by element,
 * on MPI_COMM_WORLD, a dup of it, and communicators from MPI_Comm_split
 * (even/odd ranks; all ranks in reversed key order; even/odd reversed),
 * with 1, 4100 (just over 16 KiB) and 300000 ints (1.2 MB) per block:
 *
 *   Barrier (nobody leaves before the last one enters), Bcast, Reduce,
 *   Allreduce (SUM, MAX on doubles, BXOR on long long, in place),
 *   Allgather, Allgatherv (uneven counts, a zero, gaps), Alltoall,
 *   Alltoallv (uneven counts, zeros, gaps), Scatter, Gather,
 *   Reduce_scatter (uneven counts), Reduce_scatter_block, Scan, Exscan,
 *   and Ibarrier + Iallreduce + Ibcast in flight together.
 *
 * Gaps between the blocks of the v-variants must stay untouched.
 */
#define NAME "collectives"
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

#define SENTINEL (-1)

/* Element i of rank r's data for salt s: 0 .. 2^24-1, so sums over a few
 * ranks stay exact in an int. */
static int v(int r, int64_t i, int s)
{
    return (int)(mix64(((uint64_t)(r + 1) << 44) ^ ((uint64_t)s << 36) ^ (uint64_t)i) & 0xffffff);
}

static int *ints(size_t n, int value)
{
    int *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = value;
    return p;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *label; /* the communicator under test */
static int cr, cp;        /* rank and size in it */

#define EXPECT(cond, what, i, got, want)                                                          \
    CHECK(cond, "%s, %s: element %lld is %lld, expected %lld", label, what, (long long)(i),      \
          (long long)(got), (long long)(want))

static void barrier_check(MPI_Comm comm)
{
    for (int late = 0; late < cp; late += cp - 1 > 0 ? cp - 1 : 1) {
        MPI_Barrier(comm);
        /* Not a synchronisation: one rank comes late to the barrier, and
         * nobody may leave it before that rank entered. The check holds
         * whatever the delay; the delay only makes a broken barrier show. */
        if (cr == late)
            sleep_ms(20);
        double entered = now();
        MPI_Barrier(comm);
        double left = now();
        MPI_Bcast(&entered, 1, MPI_DOUBLE, late, comm);
        CHECK(left >= entered, "%s: rank %d left MPI_Barrier %.6f s before rank %d entered it",
              label, cr, entered - left, late);
        if (cp == 1)
            break;
    }
}

static void rooted(MPI_Comm comm, int cnt, int salt)
{
    int roots[2] = {0, cp - 1};
    for (int k = 0; k < (cp > 1 ? 2 : 1); k++) {
        int root = roots[k];
        /* Bcast */
        int *buf = ints((size_t)cnt, 0);
        if (cr == root)
            for (int i = 0; i < cnt; i++)
                buf[i] = v(root, i, salt);
        MPI_Bcast(buf, cnt, MPI_INT, root, comm);
        for (int i = 0; i < cnt; i++)
            EXPECT(buf[i] == v(root, i, salt), "Bcast", i, buf[i], v(root, i, salt));
        /* Reduce */
        int *mine = ints((size_t)cnt, 0), *sum = ints((size_t)cnt, SENTINEL);
        for (int i = 0; i < cnt; i++)
            mine[i] = v(cr, i, salt + 1);
        MPI_Reduce(mine, sum, cnt, MPI_INT, MPI_SUM, root, comm);
        for (int i = 0; cr == root && i < cnt; i++) {
            int want = 0;
            for (int q = 0; q < cp; q++)
                want += v(q, i, salt + 1);
            EXPECT(sum[i] == want, "Reduce SUM", i, sum[i], want);
        }
        /* Scatter from root, Gather back to it */
        int *all = ints((size_t)cnt * cp, SENTINEL), *part = ints((size_t)cnt, SENTINEL);
        if (cr == root)
            for (int q = 0; q < cp; q++)
                for (int i = 0; i < cnt; i++)
                    all[(size_t)q * cnt + i] = v(q, i, salt + 2);
        MPI_Scatter(all, cnt, MPI_INT, part, cnt, MPI_INT, root, comm);
        for (int i = 0; i < cnt; i++)
            EXPECT(part[i] == v(cr, i, salt + 2), "Scatter", i, part[i], v(cr, i, salt + 2));
        for (int i = 0; i < cnt; i++)
            part[i] = v(cr, i, salt + 3);
        MPI_Gather(part, cnt, MPI_INT, all, cnt, MPI_INT, root, comm);
        for (int q = 0; cr == root && q < cp; q++)
            for (int i = 0; i < cnt; i++)
                EXPECT(all[(size_t)q * cnt + i] == v(q, i, salt + 3), "Gather", (size_t)q * cnt + i,
                       all[(size_t)q * cnt + i], v(q, i, salt + 3));
        free(buf);
        free(mine);
        free(sum);
        free(all);
        free(part);
        salt += 4;
    }
}

static void allreduces(MPI_Comm comm, int cnt, int salt)
{
    int *mine = ints((size_t)cnt, 0), *sum = ints((size_t)cnt, SENTINEL);
    for (int i = 0; i < cnt; i++)
        mine[i] = v(cr, i, salt);
    MPI_Allreduce(mine, sum, cnt, MPI_INT, MPI_SUM, comm);
    for (int i = 0; i < cnt; i++) {
        int want = 0;
        for (int q = 0; q < cp; q++)
            want += v(q, i, salt);
        EXPECT(sum[i] == want, "Allreduce SUM", i, sum[i], want);
    }
    /* in place: the same sum */
    MPI_Allreduce(MPI_IN_PLACE, mine, cnt, MPI_INT, MPI_SUM, comm);
    for (int i = 0; i < cnt; i++)
        EXPECT(mine[i] == sum[i], "Allreduce SUM in place", i, mine[i], sum[i]);

    double *dm = xmalloc((size_t)cnt * sizeof *dm), *dmax = xmalloc((size_t)cnt * sizeof *dmax);
    for (int i = 0; i < cnt; i++)
        dm[i] = (double)v(cr, i, salt + 1) - 8388608.0;
    MPI_Allreduce(dm, dmax, cnt, MPI_DOUBLE, MPI_MAX, comm);
    for (int i = 0; i < cnt; i++) {
        double want = -1e30;
        for (int q = 0; q < cp; q++)
            want = (double)v(q, i, salt + 1) - 8388608.0 > want ? (double)v(q, i, salt + 1) - 8388608.0 : want;
        EXPECT(dmax[i] == want, "Allreduce MAX double", i, dmax[i], want);
    }

    long long *lm = xmalloc((size_t)cnt * sizeof *lm), *lx = xmalloc((size_t)cnt * sizeof *lx);
    for (int i = 0; i < cnt; i++)
        lm[i] = (long long)(mix64((uint64_t)cr * 977 + (uint64_t)i + (uint64_t)salt) >> 1);
    MPI_Allreduce(lm, lx, cnt, MPI_LONG_LONG, MPI_BXOR, comm);
    for (int i = 0; i < cnt; i++) {
        long long want = 0;
        for (int q = 0; q < cp; q++)
            want ^= (long long)(mix64((uint64_t)q * 977 + (uint64_t)i + (uint64_t)salt) >> 1);
        EXPECT(lx[i] == want, "Allreduce BXOR long long", i, lx[i], want);
    }
    free(mine);
    free(sum);
    free(dm);
    free(dmax);
    free(lm);
    free(lx);
}

static void gathers(MPI_Comm comm, int cnt, int salt)
{
    /* Allgather */
    int *mine = ints((size_t)cnt, 0), *all = ints((size_t)cnt * cp, SENTINEL);
    for (int i = 0; i < cnt; i++)
        mine[i] = v(cr, i, salt);
    MPI_Allgather(mine, cnt, MPI_INT, all, cnt, MPI_INT, comm);
    for (int q = 0; q < cp; q++)
        for (int i = 0; i < cnt; i++)
            EXPECT(all[(size_t)q * cnt + i] == v(q, i, salt), "Allgather", (size_t)q * cnt + i,
                   all[(size_t)q * cnt + i], v(q, i, salt));
    free(all);

    /* Allgatherv: uneven counts (rank 1 gives nothing), 3-int gaps */
    int *counts = xmalloc((size_t)cp * sizeof *counts), *displs = xmalloc((size_t)cp * sizeof *displs);
    int total = 0;
    for (int q = 0; q < cp; q++) {
        counts[q] = q == 1 ? 0 : cnt / (q + 1) + q;
        displs[q] = total;
        total += counts[q] + 3;
    }
    int *gv = ints((size_t)total, SENTINEL), *mv = ints((size_t)counts[cr] + 1, 0);
    for (int i = 0; i < counts[cr]; i++)
        mv[i] = v(cr, i, salt + 1);
    MPI_Allgatherv(mv, counts[cr], MPI_INT, gv, counts, displs, MPI_INT, comm);
    for (int q = 0; q < cp; q++) {
        for (int i = 0; i < counts[q]; i++)
            EXPECT(gv[displs[q] + i] == v(q, i, salt + 1), "Allgatherv", displs[q] + i,
                   gv[displs[q] + i], v(q, i, salt + 1));
        for (int g = 0; g < 3; g++)
            EXPECT(gv[displs[q] + counts[q] + g] == SENTINEL, "Allgatherv gap",
                   displs[q] + counts[q] + g, gv[displs[q] + counts[q] + g], SENTINEL);
    }
    free(mine);
    free(counts);
    free(displs);
    free(gv);
    free(mv);
}

/* block of q's Alltoall data for rank d */
static int a2a(int q, int d, int64_t i, int salt)
{
    return v(q, ((int64_t)d << 32) | i, salt);
}

static int a2av_count(int from, int to, int cnt)
{
    return ((from + to) % 3) * (cnt / 2) + (from == to);
}

static void alltoalls(MPI_Comm comm, int cnt, int salt)
{
    int *out = ints((size_t)cnt * cp, 0), *in = ints((size_t)cnt * cp, SENTINEL);
    for (int d = 0; d < cp; d++)
        for (int i = 0; i < cnt; i++)
            out[(size_t)d * cnt + i] = a2a(cr, d, i, salt);
    MPI_Alltoall(out, cnt, MPI_INT, in, cnt, MPI_INT, comm);
    for (int q = 0; q < cp; q++)
        for (int i = 0; i < cnt; i++)
            EXPECT(in[(size_t)q * cnt + i] == a2a(q, cr, i, salt), "Alltoall", (size_t)q * cnt + i,
                   in[(size_t)q * cnt + i], a2a(q, cr, i, salt));
    free(out);
    free(in);

    int *sc = xmalloc((size_t)cp * sizeof(int)), *sd = xmalloc((size_t)cp * sizeof(int));
    int *rc = xmalloc((size_t)cp * sizeof(int)), *rd = xmalloc((size_t)cp * sizeof(int));
    int stotal = 0, rtotal = 0;
    for (int q = 0; q < cp; q++) {
        sc[q] = a2av_count(cr, q, cnt);
        sd[q] = stotal;
        stotal += sc[q] + 1;
        rc[q] = a2av_count(q, cr, cnt);
        rd[q] = rtotal;
        rtotal += rc[q] + 2;
    }
    out = ints((size_t)stotal, 0);
    in = ints((size_t)rtotal, SENTINEL);
    for (int d = 0; d < cp; d++)
        for (int i = 0; i < sc[d]; i++)
            out[sd[d] + i] = a2a(cr, d, i, salt + 1);
    MPI_Alltoallv(out, sc, sd, MPI_INT, in, rc, rd, MPI_INT, comm);
    for (int q = 0; q < cp; q++) {
        for (int i = 0; i < rc[q]; i++)
            EXPECT(in[rd[q] + i] == a2a(q, cr, i, salt + 1), "Alltoallv", rd[q] + i, in[rd[q] + i],
                   a2a(q, cr, i, salt + 1));
        for (int g = 0; g < 2; g++)
            EXPECT(in[rd[q] + rc[q] + g] == SENTINEL, "Alltoallv gap", rd[q] + rc[q] + g,
                   in[rd[q] + rc[q] + g], SENTINEL);
    }
    free(out);
    free(in);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void reductions(MPI_Comm comm, int cnt, int salt)
{
    /* Reduce_scatter with uneven counts */
    int *counts = xmalloc((size_t)cp * sizeof(int)), total = 0;
    for (int q = 0; q < cp; q++)
        total += counts[q] = cnt / (q + 1) + q;
    int *mine = ints((size_t)total, 0), *part = ints((size_t)counts[cr] + 1, SENTINEL);
    for (int i = 0; i < total; i++)
        mine[i] = v(cr, i, salt);
    MPI_Reduce_scatter(mine, part, counts, MPI_INT, MPI_SUM, comm);
    int start = 0;
    for (int q = 0; q < cr; q++)
        start += counts[q];
    for (int i = 0; i < counts[cr]; i++) {
        int want = 0;
        for (int q = 0; q < cp; q++)
            want += v(q, start + i, salt);
        EXPECT(part[i] == want, "Reduce_scatter", i, part[i], want);
    }
    EXPECT(part[counts[cr]] == SENTINEL, "Reduce_scatter past its block", counts[cr],
           part[counts[cr]], SENTINEL);
    free(mine);
    free(part);
    free(counts);

    /* Reduce_scatter_block */
    mine = ints((size_t)cnt * cp, 0);
    part = ints((size_t)cnt, SENTINEL);
    for (int i = 0; i < cnt * cp; i++)
        mine[i] = v(cr, i, salt + 1);
    MPI_Reduce_scatter_block(mine, part, cnt, MPI_INT, MPI_SUM, comm);
    for (int i = 0; i < cnt; i++) {
        int want = 0;
        for (int q = 0; q < cp; q++)
            want += v(q, (int64_t)cr * cnt + i, salt + 1);
        EXPECT(part[i] == want, "Reduce_scatter_block", i, part[i], want);
    }
    free(mine);
    free(part);

    /* Scan and Exscan */
    mine = ints((size_t)cnt, 0);
    int *pre = ints((size_t)cnt, SENTINEL);
    for (int i = 0; i < cnt; i++)
        mine[i] = v(cr, i, salt + 2);
    MPI_Scan(mine, pre, cnt, MPI_INT, MPI_SUM, comm);
    for (int i = 0; i < cnt; i++) {
        int want = 0;
        for (int q = 0; q <= cr; q++)
            want += v(q, i, salt + 2);
        EXPECT(pre[i] == want, "Scan", i, pre[i], want);
    }
    for (int i = 0; i < cnt; i++)
        pre[i] = SENTINEL;
    MPI_Exscan(mine, pre, cnt, MPI_INT, MPI_SUM, comm);
    for (int i = 0; cr > 0 && i < cnt; i++) {
        int want = 0;
        for (int q = 0; q < cr; q++)
            want += v(q, i, salt + 2);
        EXPECT(pre[i] == want, "Exscan", i, pre[i], want);
    }
    free(mine);
    free(pre);
}

static void nonblocking(MPI_Comm comm, int cnt, int salt)
{
    int *mine = ints((size_t)cnt, 0), *sum = ints((size_t)cnt, SENTINEL), *b = ints((size_t)cnt, 0);
    for (int i = 0; i < cnt; i++) {
        mine[i] = v(cr, i, salt);
        if (cr == cp - 1)
            b[i] = v(cr, i, salt + 1);
    }
    MPI_Request req[3];
    MPI_Ibarrier(comm, &req[0]);
    MPI_Iallreduce(mine, sum, cnt, MPI_INT, MPI_SUM, comm, &req[1]);
    MPI_Ibcast(b, cnt, MPI_INT, cp - 1, comm, &req[2]);
    MPI_Waitall(3, req, MPI_STATUSES_IGNORE);
    for (int i = 0; i < cnt; i++) {
        int want = 0;
        for (int q = 0; q < cp; q++)
            want += v(q, i, salt);
        EXPECT(sum[i] == want, "Iallreduce", i, sum[i], want);
        EXPECT(b[i] == v(cp - 1, i, salt + 1), "Ibcast", i, b[i], v(cp - 1, i, salt + 1));
    }
    free(mine);
    free(sum);
    free(b);
}

static void run_all(MPI_Comm comm, const char *name)
{
    static const int counts[] = {1, 4100, 300000};
    label = name;
    MPI_Comm_rank(comm, &cr);
    MPI_Comm_size(comm, &cp);
    phase("%s: barrier", name);
    barrier_check(comm);
    for (int c = 0; c < 3; c++) {
        int cnt = counts[c], salt = 100 * c;
        /* MPICH's nonblocking schedules send several blocks at once */
        int nb_cnt = avoid_am_bugs && cnt > 4000 ? 4000 : cnt;
        phase("%s: rooted collectives, %d ints", name, cnt);
        rooted(comm, cnt, salt);
        phase("%s: allreduce, %d ints", name, cnt);
        allreduces(comm, cnt, salt + 10);
        phase("%s: allgather(v), %d ints", name, cnt);
        gathers(comm, cnt, salt + 20);
        phase("%s: alltoall(v), %d ints", name, cnt);
        alltoalls(comm, cnt, salt + 30);
        phase("%s: reduce_scatter and scans, %d ints", name, cnt);
        reductions(comm, cnt, salt + 40);
        phase("%s: nonblocking collectives, %d ints", name, nb_cnt);
        nonblocking(comm, nb_cnt, salt + 50);
    }
}

int main(int argc, char **argv)
{
    suite_mode();
    if (avoid_am_bugs) {
        /* MPICH 5.0.2 defect 1 (see avoid_am_bugs): its default Alltoall and
         * Alltoallv for medium sizes send to all peers at once, and its
         * nonblocking schedules several blocks at once. Take the pairwise
         * Alltoall, one block at a time for Alltoallv, and keep the blocks
         * of nonblocking collectives to 16000 B. */
        setenv("MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM", "pairwise", 1);
        setenv("MPIR_CVAR_ALLTOALL_THROTTLE", "1", 1);
        suite_note = "active-message mode: pairwise Alltoall, Alltoallv throttled to one block, "
                     "nonblocking collectives up to 16000 B blocks (MPICH 5.0.2 defect)";
    }
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    run_all(MPI_COMM_WORLD, "MPI_COMM_WORLD");

    MPI_Comm dup, halves, reversed, halves_reversed;
    int r, p;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    run_all(dup, "dup of MPI_COMM_WORLD");

    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &halves);
    MPI_Comm_rank(halves, &r);
    MPI_Comm_size(halves, &p);
    CHECK(r == rank / 2 && p == (nranks + 1 - rank % 2) / 2, "even/odd split: rank %d of %d", r, p);
    run_all(halves, rank % 2 ? "odd ranks" : "even ranks");

    MPI_Comm_split(MPI_COMM_WORLD, 0, nranks - rank, &reversed);
    MPI_Comm_rank(reversed, &r);
    CHECK(r == nranks - 1 - rank, "reversed split: rank %d, expected %d", r, nranks - 1 - rank);
    run_all(reversed, "all ranks, reversed");

    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &halves_reversed);
    MPI_Comm_rank(halves_reversed, &r);
    MPI_Comm_size(halves_reversed, &p);
    CHECK(r == p - 1 - rank / 2, "even/odd reversed split: rank %d of %d", r, p);
    run_all(halves_reversed, rank % 2 ? "odd ranks, reversed" : "even ranks, reversed");

    MPI_Comm_free(&dup);
    MPI_Comm_free(&halves);
    MPI_Comm_free(&reversed);
    MPI_Comm_free(&halves_reversed);
    suite_pass();
    return 0;
}
