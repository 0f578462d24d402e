/*
 * Multi-pair bandwidth and message rate: with N ranks, rank i < N/2 sends
 * to rank i + N/2, all pairs at once. Per iteration each sender posts a
 * window of MPI_Isend, its receiver a window of MPI_Irecv and then a 4-byte
 * ack. Every sender times its loop; the aggregate rate is all messages of
 * all pairs over the slowest sender's time. Reports MB/s (10^6 bytes per
 * second) and messages per second, summed over the pairs.
 *
 *   mbw_mr [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-t SECONDS] [-W WINDOW] [-S BYTES] [-f]
 */
#include "common.c"

#define TAG 1
#define ACK_TAG 2

static int pairs;

static void pair_windows(size_t size, long n)
{
    int count = (int)size;
    int window = window_at(size);
    unsigned char ack[ACK_BYTES] = {0};
    if (rank < pairs) {
        int peer = rank + pairs;
        for (long i = 0; i < n; i++) {
            for (int w = 0; w < window; w++)
                MPI_Isend(sbuf, count, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
            MPI_Recv(ack, ACK_BYTES, MPI_BYTE, peer, ACK_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
    } else if (rank < 2 * pairs) {
        int peer = rank - pairs;
        for (long i = 0; i < n; i++) {
            for (int w = 0; w < window; w++)
                MPI_Irecv(rbuf, count, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
            MPI_Send(ack, ACK_BYTES, MPI_BYTE, peer, ACK_TAG, MPI_COMM_WORLD);
        }
    }
}

int main(int argc, char **argv)
{
    start(&argc, &argv, "mbw_mr", &window_policy, OPT_WINDOW, 1, 1);
    pairs = nranks / 2;
    if (rank == 0) {
        printf("# MPI Multiple Bandwidth / Message Rate Test (unimem mpi-bench, OSU method)\n");
        printf("# [ pairs: %d ] [ window size: %d ]\n", pairs, opt.window);
    }
    print_header("rank i sends to rank i + pairs",
                 "# Size                  MB/s        Messages/s");

    for (size_t size = opt.min_size; size <= opt.max_size; size = next_size(size)) {
        prepare_buffers(size);
        long iters = warm_up(&window_policy, pair_windows, size);
        double t = timed(pair_windows, size, iters);
        double slowest = 0;
        if (rank >= pairs)
            t = 0; /* only senders' times count */
        MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank >= pairs)
            check_received(size, iters);
        check_pass(size, window_at(size), rank < pairs ? rank + pairs : -1, rank >= pairs ? rank - pairs : -1);
        if (rank == 0) {
            double messages = (double)pairs * (double)window_at(size) * (double)iters;
            double rate = messages / slowest;
            printf("%-10zu%20.2f%18.2f", size, rate * (double)size / 1e6, rate);
            print_iters(iters);
        }
    }

    finish();
    return 0;
}
