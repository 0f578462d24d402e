/*
 * Bidirectional bandwidth between ranks 0 and 1: per iteration, each posts
 * a window of MPI_Irecv from the other, then a window of MPI_Isend to it,
 * and waits for all. Bandwidth in MB/s (10^6 bytes per second) counts both
 * directions, timed on rank 0. With -B the messages go from distinct send
 * buffers into distinct receive buffers.
 *
 *   bibw [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-W WINDOW] [-S BYTES] [-B BUFS] [-f]
 */
#include "common.c"

#define TAG 1


static void exchange_windows(size_t size, long n)
{
    int count = (int)size;
    int window = window_at(size);
    if (rank > 1)
        return;
    int peer = 1 - rank;
    for (long i = 0; i < n; i++) {
        for (int w = 0; w < window; w++)
            MPI_Irecv(rbufs[buffer_of(i, w, window)], count, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, &reqs[w]);
        for (int w = 0; w < window; w++)
            MPI_Isend(sbufs[buffer_of(i, w, window)], count, MPI_BYTE, peer, TAG, MPI_COMM_WORLD,
                      &reqs[window + w]);
        MPI_Waitall(2 * window, reqs, MPI_STATUSES_IGNORE);
    }
}

int main(int argc, char **argv)
{
    start(&argc, &argv, "bibw", &window_policy, OPT_WINDOW | OPT_BUFS, 0, 2);
    print_header("MPI Bi-Directional Bandwidth Test (ranks 0 and 1; unimem mpi-bench, OSU method)",
                 "# Size      Bandwidth (MB/s)");

    for (size_t size = opt.min_size; size <= opt.max_size; size = next_size(size)) {
        prepare_buffers(size);
        long iters = warm_up(&window_policy, exchange_windows, size);
        double t = timed(exchange_windows, size, iters);
        if (rank == 0 || rank == 1)
            check_received(size, iters);
        check_pass(size, window_at(size), rank < 2 ? 1 - rank : -1, rank < 2 ? 1 - rank : -1);
        if (rank == 0) {
            double bytes = 2.0 * (double)size * (double)window_at(size) * (double)iters;
            printf("%-10zu%20.2f", size, bytes / 1e6 / t);
            print_iters(iters);
        }
    }

    finish();
    return 0;
}
