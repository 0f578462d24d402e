/*
 * mpi-suite rma: one-sided communication. In native mode MPICH runs it on
 * unimem's FI_RMA and FI_ATOMIC; in active-message mode (--am) by active
 * messages. For windows from MPI_Win_create (malloc'd memory) and from
 * MPI_Win_allocate, with blocks of 1, 4100 and 300000 ints:
 *
 *   1. fence epochs: every rank puts its block into every window
 *      (itself included), gets its successor's block back, and
 *      accumulates (SUM) into one shared block of every window;
 *   2. MPI_Win_lock exclusive: a read-modify-write counter that only
 *      mutual exclusion keeps exact; large puts under exclusive locks;
 *   3. MPI_Win_lock shared: concurrent MPI_Accumulate (SUM) from all ranks;
 *   4. MPI_Win_lock_all: puts to all ranks, MPI_Win_flush_all, gets back
 *      within the epoch; MPI_Fetch_and_op and MPI_Compare_and_swap
 *      (every ticket handed out once, exactly one CAS winner).
 * Then a window created with info accumulate_ops=same_op, on which MPICH
 * may use the provider's atomics (with its default, same_op_no_op, it
 * carries accumulates by active messages): every rank fetch-and-adds
 * (MPI_LONG_LONG) to each rank's counter; the totals are exact and every
 * ticket of a counter is handed out once.
 */
#define NAME "rma"
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

static int v(int r, int64_t i, int s)
{
    return (int)(mix64(((uint64_t)(r + 1) << 44) ^ ((uint64_t)s << 36) ^ (uint64_t)i) & 0xffffff);
}

/* A window of nranks + 1 blocks of `blk` ints per rank: block q belongs to
 * rank q's puts, the last one is for accumulates. */
struct win {
    MPI_Win win;
    int *base;
    int blk;
    int allocated; /* MPI_Win_allocate, else MPI_Win_create over malloc */
    const char *kind;
};

static struct win win_open(int blk, int allocated)
{
    struct win w = {MPI_WIN_NULL, NULL, blk, allocated, allocated ? "MPI_Win_allocate" : "MPI_Win_create"};
    MPI_Aint bytes = (MPI_Aint)(nranks + 1) * blk * (MPI_Aint)sizeof(int);
    if (allocated) {
        MPI_Win_allocate(bytes, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &w.base, &w.win);
    } else {
        w.base = xmalloc((size_t)bytes);
        MPI_Win_create(w.base, bytes, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &w.win);
    }
    /* zero it inside an exclusive epoch on itself */
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, w.win);
    memset(w.base, 0, (size_t)bytes);
    MPI_Win_unlock(rank, w.win);
    MPI_Barrier(MPI_COMM_WORLD);
    return w;
}

static void win_close(struct win *w)
{
    MPI_Win_free(&w->win);
    if (!w->allocated)
        free(w->base);
}

/* Checks the local window after everybody's access: block q of the window
 * must hold v(q, i, salt) for each q in [first, last]. */
static void check_blocks(struct win *w, int first, int last, int salt, const char *what)
{
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, w->win);
    for (int q = first; q <= last; q++)
        for (int i = 0; i < w->blk; i++) {
            int got = w->base[(size_t)q * w->blk + i];
            CHECK(got == v(q, i, salt), "%s, %s, %d-int blocks: block %d element %d is %d, expected %d",
                  w->kind, what, w->blk, q, i, got, v(q, i, salt));
        }
    MPI_Win_unlock(rank, w->win);
}

/* MPICH 5.0.2 defect 1 (see avoid_rma_bugs): one long operation in flight
 * per origin. Returns how many targets a fence epoch may take at once. */
static int targets_per_epoch(int blk)
{
    return avoid_rma_bugs && is_am_long((size_t)blk * sizeof(int)) ? 1 : nranks;
}

/* 1: fence epochs */
static void fences(struct win *w, int salt)
{
    int blk = w->blk;
    int *mine = xmalloc((size_t)blk * sizeof(int)), *got = xmalloc((size_t)blk * sizeof(int));
    for (int i = 0; i < blk; i++)
        mine[i] = v(rank, i, salt);
    int step = targets_per_epoch(blk);
    MPI_Win_fence(MPI_MODE_NOPRECEDE, w->win);
    for (int t0 = 0; t0 < nranks; t0 += step) {
        for (int t = t0; t < t0 + step && t < nranks; t++)
            MPI_Put(mine, blk, MPI_INT, t, (MPI_Aint)rank * blk, blk, MPI_INT, w->win);
        MPI_Win_fence(0, w->win);
    }
    /* the successor's own block, from its window */
    int succ = (rank + 1) % nranks;
    MPI_Get(got, blk, MPI_INT, succ, (MPI_Aint)succ * blk, blk, MPI_INT, w->win);
    MPI_Win_fence(MPI_MODE_NOSUCCEED, w->win);
    for (int i = 0; i < blk; i++)
        CHECK(got[i] == v(succ, i, salt), "%s, fence Get of %d ints from rank %d: element %d is %d",
              w->kind, blk, succ, i, got[i]);
    check_blocks(w, 0, nranks - 1, salt, "fence Put");
    MPI_Barrier(MPI_COMM_WORLD);
    /* accumulate into the last block of every window */
    MPI_Win_fence(MPI_MODE_NOPRECEDE, w->win);
    for (int t0 = 0; t0 < nranks; t0 += step) {
        for (int t = t0; t < t0 + step && t < nranks; t++)
            MPI_Accumulate(mine, blk, MPI_INT, t, (MPI_Aint)nranks * blk, blk, MPI_INT, MPI_SUM,
                           w->win);
        MPI_Win_fence(t0 + step >= nranks ? MPI_MODE_NOSUCCEED : 0, w->win);
    }
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, w->win);
    for (int i = 0; i < blk; i++) {
        int want = 0;
        for (int q = 0; q < nranks; q++)
            want += v(q, i, salt);
        int have = w->base[(size_t)nranks * blk + i];
        CHECK(have == want, "%s, fence Accumulate of %d ints: element %d is %d, expected %d", w->kind,
              blk, i, have, want);
    }
    memset(w->base + (size_t)nranks * blk, 0, (size_t)blk * sizeof(int));
    MPI_Win_unlock(rank, w->win);
    MPI_Barrier(MPI_COMM_WORLD);
    free(mine);
    free(got);
}

/* 2: exclusive locks */
#define ROUNDS 10
static void exclusive(struct win *w, int salt)
{
    int blk = w->blk;
    /* a counter in rank 0's accumulate block: get, add one, put */
    for (int k = 0; k < ROUNDS; k++) {
        int value;
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w->win);
        MPI_Get(&value, 1, MPI_INT, 0, (MPI_Aint)nranks * blk, 1, MPI_INT, w->win);
        MPI_Win_flush(0, w->win);
        value++;
        MPI_Put(&value, 1, MPI_INT, 0, (MPI_Aint)nranks * blk, 1, MPI_INT, w->win);
        MPI_Win_unlock(0, w->win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w->win);
        int have = w->base[(size_t)nranks * blk];
        CHECK(have == nranks * ROUNDS, "%s: exclusive-lock counter is %d, expected %d", w->kind, have,
              nranks * ROUNDS);
        w->base[(size_t)nranks * blk] = 0;
        MPI_Win_unlock(0, w->win);
    }
    /* a block into the successor's window under an exclusive lock */
    int succ = (rank + 1) % nranks, pred = (rank + nranks - 1) % nranks;
    int *mine = xmalloc((size_t)blk * sizeof(int));
    for (int i = 0; i < blk; i++)
        mine[i] = v(rank, i, salt);
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, succ, 0, w->win);
    MPI_Put(mine, blk, MPI_INT, succ, (MPI_Aint)rank * blk, blk, MPI_INT, w->win);
    MPI_Win_unlock(succ, w->win);
    MPI_Barrier(MPI_COMM_WORLD);
    check_blocks(w, pred, pred, salt, "exclusive-lock Put");
    MPI_Barrier(MPI_COMM_WORLD);
    free(mine);
}

/* 3: shared locks, concurrent accumulates into rank 0's last block */
static void shared(struct win *w, int salt)
{
    int blk = w->blk;
    int *mine = xmalloc((size_t)blk * sizeof(int));
    for (int i = 0; i < blk; i++)
        mine[i] = v(rank, i, salt);
    for (int k = 0; k < 3; k++) {
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, w->win);
        MPI_Accumulate(mine, blk, MPI_INT, 0, (MPI_Aint)nranks * blk, blk, MPI_INT, MPI_SUM, w->win);
        MPI_Win_unlock(0, w->win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w->win);
        for (int i = 0; i < blk; i++) {
            int want = 0;
            for (int q = 0; q < nranks; q++)
                want += 3 * v(q, i, salt);
            int have = w->base[(size_t)nranks * blk + i];
            CHECK(have == want, "%s, shared-lock Accumulate of %d ints: element %d is %d, expected %d",
                  w->kind, blk, i, have, want);
        }
        memset(w->base + (size_t)nranks * blk, 0, (size_t)blk * sizeof(int));
        MPI_Win_unlock(0, w->win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(mine);
}

/* 4: lock_all, flush, atomics */
static void lock_all(struct win *w, int salt)
{
    int blk = w->blk;
    int *mine = xmalloc((size_t)blk * sizeof(int)), *back = xmalloc((size_t)blk * sizeof(int));
    for (int i = 0; i < blk; i++)
        mine[i] = v(rank, i, salt);
    MPI_Win_lock_all(0, w->win);
    for (int t = 0; t < nranks; t++) {
        MPI_Put(mine, blk, MPI_INT, t, (MPI_Aint)rank * blk, blk, MPI_INT, w->win);
        if (targets_per_epoch(blk) == 1)
            MPI_Win_flush(t, w->win);
    }
    MPI_Win_flush_all(w->win);
    /* every target serves one Get at a time (its reply is a long message
     * from the target) where avoid_rma_bugs is set */
    for (int k = 0; k < nranks; k++) {
        int t = (rank + k) % nranks;
        if (targets_per_epoch(blk) == 1)
            MPI_Barrier(MPI_COMM_WORLD);
        memset(back, 0, (size_t)blk * sizeof(int));
        MPI_Get(back, blk, MPI_INT, t, (MPI_Aint)rank * blk, blk, MPI_INT, w->win);
        MPI_Win_flush(t, w->win);
        for (int i = 0; i < blk; i++)
            CHECK(back[i] == mine[i], "%s, lock_all: Get after flushed Put of %d ints from rank %d: "
                  "element %d is %d, expected %d", w->kind, blk, t, i, back[i], mine[i]);
    }
    MPI_Win_unlock_all(w->win);
    MPI_Barrier(MPI_COMM_WORLD);
    check_blocks(w, 0, nranks - 1, salt, "lock_all Put");
    MPI_Barrier(MPI_COMM_WORLD);

    /* tickets from rank 0's counter: each one handed out once */
    int tickets[ROUNDS], one = 1;
    MPI_Win_lock_all(0, w->win);
    for (int k = 0; k < ROUNDS; k++) {
        MPI_Fetch_and_op(&one, &tickets[k], MPI_INT, 0, (MPI_Aint)nranks * blk, MPI_SUM, w->win);
        MPI_Win_flush(0, w->win);
    }
    MPI_Win_unlock_all(w->win);
    int *all = xmalloc((size_t)nranks * ROUNDS * sizeof(int));
    MPI_Allgather(tickets, ROUNDS, MPI_INT, all, ROUNDS, MPI_INT, MPI_COMM_WORLD);
    char *seen = calloc((size_t)nranks * ROUNDS, 1);
    for (int k = 0; k < nranks * ROUNDS; k++) {
        CHECK(all[k] >= 0 && all[k] < nranks * ROUNDS && !seen[all[k]],
              "%s: MPI_Fetch_and_op handed out ticket %d twice or out of range", w->kind, all[k]);
        seen[all[k]] = 1;
    }
    /* compare-and-swap on a fresh slot of rank 0: exactly one winner */
    MPI_Barrier(MPI_COMM_WORLD);
    int minus = -1, me = rank, old = 0, winners;
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w->win);
        w->base[(size_t)nranks * blk] = -1;
        MPI_Win_unlock(0, w->win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock_all(0, w->win);
    MPI_Compare_and_swap(&me, &minus, &old, MPI_INT, 0, (MPI_Aint)nranks * blk, w->win);
    MPI_Win_unlock_all(w->win);
    int won = old == -1;
    MPI_Allreduce(&won, &winners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(winners == 1, "%s: MPI_Compare_and_swap had %d winners", w->kind, winners);
    CHECK(won || (old >= 0 && old < nranks), "%s: MPI_Compare_and_swap returned %d", w->kind, old);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w->win);
        memset(w->base + (size_t)nranks * blk, 0, (size_t)blk * sizeof(int));
        MPI_Win_unlock(0, w->win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(mine);
    free(back);
    free(all);
    free(seen);
}

/* 5: a same_op window (native atomics where the provider has them) */
static void same_op_counters(void)
{
    enum { ADDS = 200 };
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "accumulate_ops", "same_op");
    long long *counter;
    MPI_Win win;
    MPI_Win_allocate(sizeof(long long), sizeof(long long), info, MPI_COMM_WORLD, &counter, &win);
    MPI_Info_free(&info);
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, win);
    *counter = 0;
    MPI_Win_unlock(rank, win);
    MPI_Barrier(MPI_COMM_WORLD);
    long long one = 1, *got = xmalloc((size_t)nranks * ADDS * sizeof(long long));
    MPI_Win_lock_all(0, win);
    for (int k = 0; k < ADDS; k++)
        for (int t = 0; t < nranks; t++) {
            MPI_Fetch_and_op(&one, &got[(size_t)t * ADDS + k], MPI_LONG_LONG, t, 0, MPI_SUM, win);
            MPI_Win_flush(t, win);
        }
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
    long long total = *counter;
    MPI_Win_unlock(rank, win);
    CHECK(total == (long long)nranks * ADDS, "same_op window: counter of rank %d is %lld, expected %d",
          rank, total, nranks * ADDS);
    /* the tickets of each counter: every value below nranks * ADDS once */
    long long *all = xmalloc((size_t)nranks * nranks * ADDS * sizeof(long long));
    MPI_Allgather(got, nranks * ADDS, MPI_LONG_LONG, all, nranks * ADDS, MPI_LONG_LONG,
                  MPI_COMM_WORLD);
    char *seen = calloc((size_t)nranks * ADDS, 1);
    for (int r = 0; r < nranks; r++)
        for (int k = 0; k < ADDS; k++) {
            long long v = all[(size_t)r * nranks * ADDS + (size_t)rank * ADDS + k];
            CHECK(v >= 0 && v < (long long)nranks * ADDS && !seen[v],
                  "same_op window: rank %d's counter handed out ticket %lld twice or out of range",
                  rank, v);
            seen[v] = 1;
        }
    free(seen);
    free(all);
    free(got);
    MPI_Win_free(&win);
}

int main(int argc, char **argv)
{
    static const int blocks[] = {1, 4100, 300000};
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    if (avoid_rma_bugs)
        suite_note = "one long RMA operation in flight per origin (MPICH 5.0.2 defect: RMA over "
                     "active messages)";
    for (int allocated = 0; allocated < 2; allocated++) {
        for (int b = 0; b < 3; b++) {
            const char *kind = allocated ? "MPI_Win_allocate" : "MPI_Win_create";
            int salt = 10 * b + 100 * allocated;
            phase("%s, %d-int blocks: open", kind, blocks[b]);
            struct win w = win_open(blocks[b], allocated);
            phase("%s, %d-int blocks: fences", kind, blocks[b]);
            fences(&w, salt);
            phase("%s, %d-int blocks: exclusive locks", kind, blocks[b]);
            exclusive(&w, salt + 1);
            phase("%s, %d-int blocks: shared locks", kind, blocks[b]);
            shared(&w, salt + 2);
            phase("%s, %d-int blocks: lock_all", kind, blocks[b]);
            lock_all(&w, salt + 3);
            win_close(&w);
        }
    }
    phase("same_op window: fetch-and-add counters");
    same_op_counters();
    suite_pass();
    return 0;
}
