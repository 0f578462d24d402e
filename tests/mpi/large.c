/*
 * mpi-suite large: messages beyond 2^31 bytes with MPI-4's large-count
 * calls (MPI_Send_c, MPI_Recv_c), between ranks 0 and 1:
 *   1. INT_MAX + 100 bytes of MPI_CHAR, contiguous (or
 *      $MPI_SUITE_LARGE_BYTES);
 *   2. 2^31 + 100 bytes as a strided datatype (every other 4-byte int of a
 *      buffer twice as long), so that MPICH packs and unpacks it.
 * Every byte is checked, and the bytes between the strided elements must
 * stay untouched. (Not among the suite programs run on every rank count:
 * it needs several GiB per rank; its own test runs it on 2 ranks.)
 */
#define NAME "large"
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

static unsigned char byte_at(size_t i, unsigned seed)
{
    return (unsigned char)(mix64(((uint64_t)seed << 40) ^ (i >> 3)) >> ((i & 7) * 8));
}

static void contiguous(void)
{
    /* MPI_SUITE_LARGE_BYTES: another length (a benchmark of 5 GiB, say). */
    const char *bytes = getenv("MPI_SUITE_LARGE_BYTES");
    MPI_Count n = bytes ? (MPI_Count)strtoll(bytes, NULL, 0) : (MPI_Count)INT32_MAX + 100;
    unsigned char *buf = xmalloc((size_t)n);
    if (rank == 0)
        for (size_t i = 0; i < (size_t)n; i++)
            buf[i] = byte_at(i, 1);
    else if (rank == 1)
        memset(buf, 0, (size_t)n);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Send_c(buf, n, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
    } else if (rank == 1) {
        MPI_Status st;
        double t0 = MPI_Wtime();
        MPI_Recv_c(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD, &st);
        printf("mpi-suite large: note: contiguous %lld bytes received in %.3f s (%.2f GB/s)\n",
               (long long)n, MPI_Wtime() - t0, (double)n / (MPI_Wtime() - t0) / 1e9);
        MPI_Count got;
        MPI_Get_count_c(&st, MPI_CHAR, &got);
        CHECK(got == n, "contiguous: received %lld bytes, expected %lld", (long long)got, (long long)n);
        for (size_t i = 0; i < (size_t)n; i++)
            CHECK(buf[i] == byte_at(i, 1), "contiguous: byte %zu is %u, expected %u", i, buf[i],
                  byte_at(i, 1));
    }
    free(buf);
}

static void strided(void)
{
    /* One int of every two: 4 bytes of data in 8 of extent. */
    MPI_Datatype every_other;
    MPI_Type_vector(1, 1, 2, MPI_INT, &every_other);
    MPI_Datatype resized;
    MPI_Type_create_resized(every_other, 0, 2 * sizeof(int), &resized);
    MPI_Type_commit(&resized);
    MPI_Type_free(&every_other);
    MPI_Count n = ((MPI_Count)1 << 29) + 25; /* ints: 2^31 + 100 bytes of data */
    size_t ints = 2 * (size_t)n;
    int *buf = xmalloc(ints * sizeof(int));
    if (rank == 0)
        for (size_t i = 0; i < ints; i++)
            buf[i] = (int)(mix64(i) & 0x7fffffff);
    else if (rank == 1)
        for (size_t i = 0; i < ints; i++)
            buf[i] = -1;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Send_c(buf, n, resized, 1, 2, MPI_COMM_WORLD);
    } else if (rank == 1) {
        MPI_Status st;
        double t0 = MPI_Wtime();
        MPI_Recv_c(buf, n, resized, 0, 2, MPI_COMM_WORLD, &st);
        printf("mpi-suite large: note: strided %lld bytes received in %.3f s (%.2f GB/s)\n",
               (long long)n * 4, MPI_Wtime() - t0, (double)n * 4 / (MPI_Wtime() - t0) / 1e9);
        MPI_Count got;
        MPI_Get_count_c(&st, resized, &got);
        CHECK(got == n, "strided: received %lld elements, expected %lld", (long long)got, (long long)n);
        for (size_t i = 0; i < ints; i++) {
            int want = i % 2 == 0 ? (int)(mix64(i) & 0x7fffffff) : -1;
            CHECK(buf[i] == want, "strided: int %zu is %d, expected %d", i, buf[i], want);
        }
    }
    free(buf);
    MPI_Type_free(&resized);
}

int main(int argc, char **argv)
{
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    phase("contiguous: INT_MAX + 100 bytes");
    contiguous();
    MPI_Barrier(MPI_COMM_WORLD);
    phase("strided: 2^31 + 100 bytes in every other int");
    strided();
    suite_pass();
    return 0;
}
