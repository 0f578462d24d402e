/* MPI_Alltoall time over every rank of the job: each rank sends -s bytes
 * (default 4 KiB) to every rank, -i times after a warm-up; rank 0 prints
 * "alltoall <ranks> <bytes> <microseconds per call>" (the slowest rank's
 * mean, as the collective lasts until the last one is done). Every block
 * received is checked. Standalone (no common.c): the scale benchmark runs
 * it on many oversubscribed ranks, where a sweep would take too long.
 *
 *   alltoall [-s BYTES] [-i ITERATIONS] */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned char pattern(int from, int to, size_t i)
{
    return (unsigned char)(from * 31 + to * 7 + i);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t bytes = 4096;
    long iters = 20;
    int c;
    while ((c = getopt(argc, argv, "s:i:")) != -1) {
        if (c == 's')
            bytes = (size_t)strtoul(optarg, NULL, 10);
        else if (c == 'i')
            iters = strtol(optarg, NULL, 10);
        else
            MPI_Abort(MPI_COMM_WORLD, 2);
    }
    unsigned char *out = malloc(bytes * (size_t)size), *in = malloc(bytes * (size_t)size);
    if (!out || !in)
        MPI_Abort(MPI_COMM_WORLD, 2);
    for (int to = 0; to < size; to++)
        for (size_t i = 0; i < bytes; i++)
            out[(size_t)to * bytes + i] = pattern(rank, to, i);
    for (int warm = 0; warm < 2; warm++)
        MPI_Alltoall(out, (int)bytes, MPI_BYTE, in, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (long n = 0; n < iters; n++)
        MPI_Alltoall(out, (int)bytes, MPI_BYTE, in, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    double mine = (MPI_Wtime() - start) / (double)iters, slowest;
    long bad = 0, total;
    for (int from = 0; from < size; from++)
        for (size_t i = 0; i < bytes; i++)
            bad += in[(size_t)from * bytes + i] != pattern(from, rank, i);
    MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&bad, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (total != 0) {
            fprintf(stderr, "alltoall: %ld bytes received wrong\n", total);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        printf("alltoall %d %zu %.2f\n", size, bytes, slowest * 1e6);
    }
    free(out);
    free(in);
    MPI_Finalize();
    return 0;
}
