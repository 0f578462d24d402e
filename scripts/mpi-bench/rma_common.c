/*
 * Shared part of the one-sided benchmarks in this directory (put_latency.c,
 * get_latency.c, put_bw.c, get_bw.c, acc_rate.c, fop_rate.c), in the manner
 * of the OSU one-sided benchmarks: rank 0 is the origin, rank 1 the target,
 * other ranks only join the collectives. Each program defines RMA_OP and
 * #includes this file (after common.c, whose method, options and buffers
 * it uses).
 *
 * The window comes from MPI_Win_allocate, of the largest size (1 MiB at
 * least), so that with
 * the dmable heap preloaded (scripts/mpirun-unimem's default) it is dmable
 * memory and the provider may serve it one-sided; the atomics' window has
 * the info accumulate_ops=same_op, without which MPICH carries accumulates
 * by active messages whatever the provider has. One passive-target epoch
 * (MPI_Win_lock_all) per size.
 *
 * put_latency / get_latency: one MPI_Put / MPI_Get then MPI_Win_flush per
 *   iteration; latency in µs.
 * put_bw / get_bw: a window (-W, 64) of operations, then one flush; MB/s.
 * acc_rate: a window of MPI_Accumulate (MPI_SUM) of one MPI_INT64_T, then
 *   one flush; operations per second (size column 8).
 * fop_rate: MPI_Fetch_and_op (MPI_SUM, MPI_INT64_T), each flushed (a
 *   round trip each); operations per second (size column 8).
 *
 * Data are checked after each size: what a put wrote is in the target's
 * window, what a get read is the target's pattern, and the counter of the
 * atomics holds exactly the sum of what was added.
 */
enum { PUT_LAT, GET_LAT, PUT_BW, GET_BW, ACC_RATE, FOP_RATE };

static MPI_Win win;
static unsigned char *wbuf; /* the window's memory at this rank */
static long long added;     /* atomics: what rank 0 added so far */

static void rma_kernel(size_t size, long n)
{
    if (rank != 0)
        return;
    int count = (int)size, w = opt.window;
    long long one = 1, old;
    MPI_Win_lock_all(0, win);
    for (long i = 0; i < n; i++) {
        switch (RMA_OP) {
        case PUT_LAT:
            MPI_Put(sbuf, count, MPI_BYTE, 1, 0, count, MPI_BYTE, win);
            break;
        case GET_LAT:
            MPI_Get(rbuf, count, MPI_BYTE, 1, 0, count, MPI_BYTE, win);
            break;
        case PUT_BW:
            for (int k = 0; k < w; k++)
                MPI_Put(sbuf, count, MPI_BYTE, 1, 0, count, MPI_BYTE, win);
            break;
        case GET_BW:
            for (int k = 0; k < w; k++)
                MPI_Get(rbuf, count, MPI_BYTE, 1, 0, count, MPI_BYTE, win);
            break;
        case ACC_RATE:
            for (int k = 0; k < w; k++)
                MPI_Accumulate(&one, 1, MPI_INT64_T, 1, 0, 1, MPI_INT64_T, MPI_SUM, win);
            added += w;
            break;
        case FOP_RATE:
            MPI_Fetch_and_op(&one, &old, MPI_INT64_T, 1, 0, MPI_SUM, win);
            added += 1;
            break;
        }
        MPI_Win_flush(1, win);
    }
    MPI_Win_unlock_all(win);
}

/* After a size: the target's window (puts), rank 0's buffer (gets) or the
 * counter (atomics) must hold what they should. */
static void rma_check(size_t size)
{
    long long total = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, win);
        if (RMA_OP == PUT_LAT || RMA_OP == PUT_BW)
            verify(wbuf, size, (unsigned)size, "the target's window after the puts", 0);
        memcpy(&total, wbuf, sizeof total);
        MPI_Win_unlock(1, win);
    }
    if (RMA_OP == GET_LAT || RMA_OP == GET_BW) {
        if (rank == 0)
            verify(rbuf, size, 7u, "the last get", 0);
    }
    if (RMA_OP == ACC_RATE || RMA_OP == FOP_RATE) {
        MPI_Bcast(&total, 1, MPI_LONG_LONG, 1, MPI_COMM_WORLD);
        MPI_Bcast(&added, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
        if (rank == 0 && total != added) {
            fprintf(stderr, "the target's counter is %lld, rank 0 added %lld\n", total, added);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    static const struct policy lat_pol = {
        .iters_small = 10000, .iters_large = 1000,
        .skip_small = 100, .skip_large = 10,
        .iters_min = 10, .default_min = 1,
    };
    const int atomic = RMA_OP == ACC_RATE || RMA_OP == FOP_RATE;
    const int windowed = RMA_OP == PUT_BW || RMA_OP == GET_BW || RMA_OP == ACC_RATE;
    static const char *names[] = {"put_latency", "get_latency", "put_bw", "get_bw", "acc_rate", "fop_rate"};
    start(&argc, &argv, names[RMA_OP], windowed ? &window_policy : &lat_pol,
          windowed ? OPT_WINDOW : 0, 0, 0);
    if (atomic)
        opt.min_size = opt.max_size = 8;

    MPI_Info info;
    MPI_Info_create(&info);
    if (atomic)
        MPI_Info_set(info, "accumulate_ops", "same_op");
    /* At least 1 MiB: with the dmable heap preloaded, the window is then
     * dmable whatever the sizes measured (the atomics use its first 8 B). */
    size_t wlen = opt.max_size < (1u << 20) ? 1u << 20 : opt.max_size;
    MPI_Win_allocate((MPI_Aint)wlen, 1, info, MPI_COMM_WORLD, &wbuf, &win);
    MPI_Info_free(&info);

    static const char *titles[] = {
        "MPI_Put latency (MPI_Put + MPI_Win_flush, rank 0 to 1; unimem mpi-bench, OSU method)",
        "MPI_Get latency (MPI_Get + MPI_Win_flush, rank 0 from 1; unimem mpi-bench, OSU method)",
        "MPI_Put bandwidth (window of puts + MPI_Win_flush; unimem mpi-bench, OSU method)",
        "MPI_Get bandwidth (window of gets + MPI_Win_flush; unimem mpi-bench, OSU method)",
        "MPI_Accumulate rate (window of 8-byte MPI_SUM + MPI_Win_flush, same_op window)",
        "MPI_Fetch_and_op rate (8-byte MPI_SUM, each flushed, same_op window)",
    };
    static const char *columns[] = {
        "# Size          Latency (us)", "# Size          Latency (us)",
        "# Size      Bandwidth (MB/s)", "# Size      Bandwidth (MB/s)",
        "# Size        Rate (ops/s)", "# Size        Rate (ops/s)",
    };
    print_header(titles[RMA_OP], columns[RMA_OP]);

    for (size_t size = opt.min_size; size <= opt.max_size; size = next_size(size)) {
        prepare_buffers(size);
        if (rank == 1) {
            MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 1, 0, win);
            if (atomic)
                memset(wbuf, 0, 8);
            else
                fill(wbuf, size, 7u);
            MPI_Win_unlock(1, win);
        }
        added = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        long iters = warm_up(windowed ? &window_policy : &lat_pol, rma_kernel, size);
        double t = timed(rma_kernel, size, iters);
        rma_check(size);
        if (rank == 0) {
            double ops = (double)iters * (windowed ? opt.window : 1);
            double value;
            if (RMA_OP == PUT_LAT || RMA_OP == GET_LAT)
                value = t * 1e6 / (double)iters;
            else if (atomic)
                value = ops / t;
            else
                value = (double)size * ops / t / 1e6;
            printf("%-10zu%18.2f", size, value);
            print_iters(iters);
        }
    }
    MPI_Win_free(&win);
    finish();
    return 0;
}
