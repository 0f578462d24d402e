/*
 * Unidirectional bandwidth from rank 0 to rank 1: per iteration, rank 0
 * posts a window of MPI_Isend, rank 1 a window of MPI_Irecv; when rank 1
 * has them all it sends a 4-byte ack, which ends the iteration on rank 0.
 * Bandwidth in MB/s (10^6 bytes per second), timed on rank 0. With -B the
 * messages go from distinct send buffers into distinct receive buffers.
 *
 *   bw [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-W WINDOW] [-S BYTES] [-B BUFS] [-f]
 */
#include "common.c"

#define TAG 1
#define ACK_TAG 2


static void window_to_1(size_t size, long n)
{
    int count = (int)size;
    int window = window_at(size);
    unsigned char ack[ACK_BYTES] = {0};
    if (rank == 0) {
        for (long i = 0; i < n; i++) {
            for (int w = 0; w < window; w++)
                MPI_Isend(sbufs[buffer_of(i, w, window)], count, MPI_BYTE, 1, TAG, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
            MPI_Recv(ack, ACK_BYTES, MPI_BYTE, 1, ACK_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
    } else if (rank == 1) {
        for (long i = 0; i < n; i++) {
            for (int w = 0; w < window; w++)
                MPI_Irecv(rbufs[buffer_of(i, w, window)], count, MPI_BYTE, 0, TAG, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
            MPI_Send(ack, ACK_BYTES, MPI_BYTE, 0, ACK_TAG, MPI_COMM_WORLD);
        }
    }
}

int main(int argc, char **argv)
{
    start(&argc, &argv, "bw", &window_policy, OPT_WINDOW | OPT_BUFS, 0, 1);
    print_header("MPI Bandwidth Test (unidirectional, rank 0 to 1; unimem mpi-bench, OSU method)",
                 "# Size      Bandwidth (MB/s)");

    for (size_t size = opt.min_size; size <= opt.max_size; size = next_size(size)) {
        prepare_buffers(size);
        long iters = warm_up(&window_policy, window_to_1, size);
        double t = timed(window_to_1, size, iters);
        if (rank == 1)
            check_received(size, iters);
        check_pass(size, window_at(size), rank == 0 ? 1 : -1, rank == 1 ? 0 : -1);
        if (rank == 0) {
            double bytes = (double)size * (double)window_at(size) * (double)iters;
            printf("%-10zu%20.2f", size, bytes / 1e6 / t);
            print_iters(iters);
        }
    }

    finish();
    return 0;
}
