/*
 * One-way latency between ranks 0 and 1: rank 0 sends a message and waits
 * for the same size back (MPI_Send/MPI_Recv), rank 1 answers; latency is
 * the round trip over two. Other ranks only join the barriers.
 *
 *   latency [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-f]
 */
#include "common.c"

#define TAG 1

static void pingpong(size_t size, long n)
{
    int count = (int)size;
    if (rank == 0) {
        for (long i = 0; i < n; i++) {
            MPI_Send(sbuf, count, MPI_BYTE, 1, TAG, MPI_COMM_WORLD);
            MPI_Recv(rbuf, count, MPI_BYTE, 1, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
    } else if (rank == 1) {
        for (long i = 0; i < n; i++) {
            MPI_Recv(rbuf, count, MPI_BYTE, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, count, MPI_BYTE, 0, TAG, MPI_COMM_WORLD);
        }
    }
}

int main(int argc, char **argv)
{
    static const struct policy pol = {
        .iters_small = 10000, .iters_large = 1000,
        .skip_small = 100, .skip_large = 10,
        .iters_min = 10, .default_min = 0,
    };

    start(&argc, &argv, "latency", &pol, 0, 0, 0);
    print_header("MPI Latency Test (ping-pong, ranks 0 and 1; unimem mpi-bench, OSU method)",
                 "# Size          Latency (us)");

    for (size_t size = opt.min_size; size <= opt.max_size; size = next_size(size)) {
        prepare_buffers(size);
        long iters = warm_up(&pol, pingpong, size);
        double t = timed(pingpong, size, iters);
        if (rank == 0 || rank == 1)
            check_received(size, iters);
        check_pass(size, 1, rank == 0 ? 1 : -1, rank == 1 ? 0 : -1);
        check_pass(size, 1, rank == 1 ? 0 : -1, rank == 0 ? 1 : -1);
        if (rank == 0) {
            printf("%-10zu%18.2f", size, t * 1e6 / (2.0 * (double)iters));
            print_iters(iters);
        }
    }

    finish();
    return 0;
}
