/*
 * mpi-suite datatypes: non-contiguous derived datatypes, small and large
 * enough for rendezvous, exchanged around the ring with MPI_Sendrecv:
 *
 *   1. MPI_Type_vector (blocks of 3 doubles, stride 5): vector -> contiguous
 *      and contiguous -> vector (the gaps must stay untouched);
 *   2. MPI_Type_indexed with uneven blocks and gaps, on both sides;
 *   3. a struct with gaps (MPI_Type_create_struct, resized to the C extent)
 *      received into another struct layout with the same type signature
 *      (displacements out of order); padding bytes must stay untouched;
 *      the same records broadcast from rank 0;
 *   4. MPI_Type_create_resized: a matrix column resized to one element, so
 *      that count columns make a transpose;
 *   5. MPI_Get_count / MPI_Get_elements on a partial, non-whole receive.
 */
#define NAME "datatypes"
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

static int next_rank, prev_rank;

/* Value of element i of rank r's data in step s: an integer, exact as a
 * double too. */
static int64_t val(int r, int64_t i, int s)
{
    return (int64_t)(mix64(((uint64_t)r << 40) ^ ((uint64_t)s << 32) ^ (uint64_t)i) & 0xffffff);
}

static void sendrecv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                     MPI_Datatype rtype, int tag, MPI_Status *st)
{
    MPI_Sendrecv(sbuf, scount, stype, next_rank, tag, rbuf, rcount, rtype, prev_rank, tag,
                 MPI_COMM_WORLD, st);
    CHECK(st->MPI_SOURCE == prev_rank && st->MPI_TAG == tag, "Sendrecv status: source %d tag %d",
          st->MPI_SOURCE, st->MPI_TAG);
}

/* 1: vectors, sizes around the eager limit and beyond the rendezvous window */
static void vectors(void)
{
    static const int counts[] = {1, 2, 682, 683, 10923, 50000, 120000};
    for (int c = 0; c < 7; c++) {
        int n = counts[c];
        MPI_Datatype vec;
        MPI_Type_vector(n, 3, 5, MPI_DOUBLE, &vec);
        MPI_Type_commit(&vec);
        size_t span = (size_t)5 * n;
        double *strided = xmalloc(span * sizeof(double)), *packed = xmalloc(3 * (size_t)n * sizeof(double));
        MPI_Status st;
        int count;

        /* vector -> contiguous */
        for (size_t i = 0; i < span; i++)
            strided[i] = (double)val(rank, (int64_t)i, 1);
        sendrecv(strided, 1, vec, packed, 3 * n, MPI_DOUBLE, 10 + c, &st);
        MPI_Get_count(&st, MPI_DOUBLE, &count);
        CHECK(count == 3 * n, "vector of %d blocks arrived as %d doubles", n, count);
        for (int j = 0; j < 3 * n; j++) {
            double want = (double)val(prev_rank, (int64_t)(j / 3) * 5 + j % 3, 1);
            CHECK(packed[j] == want, "vector -> contiguous (%d blocks): element %d is %.0f, expected %.0f",
                  n, j, packed[j], want);
        }

        /* contiguous -> vector: gaps keep their sentinel */
        for (int j = 0; j < 3 * n; j++)
            packed[j] = (double)val(rank, j, 2);
        for (size_t i = 0; i < span; i++)
            strided[i] = -1.0;
        sendrecv(packed, 3 * n, MPI_DOUBLE, strided, 1, vec, 20 + c, &st);
        MPI_Get_count(&st, vec, &count);
        CHECK(count == 1, "contiguous -> vector (%d blocks): MPI_Get_count gives %d", n, count);
        for (size_t i = 0; i < span; i++) {
            int in_block = i % 5 < 3;
            double want = in_block ? (double)val(prev_rank, (int64_t)(i / 5 * 3 + i % 5), 2) : -1.0;
            if (i >= (size_t)5 * (n - 1) + 3)
                want = -1.0; /* past the last block */
            CHECK(strided[i] == want, "contiguous -> vector (%d blocks): element %zu is %.0f, expected %.0f",
                  n, i, strided[i], want);
        }
        MPI_Type_free(&vec);
        free(strided);
        free(packed);
    }
}

/* 2: indexed ints, uneven blocks and gaps, on both sides */
static void indexed(void)
{
    static const int counts[] = {3, 1000, 20000};
    for (int c = 0; c < 3; c++) {
        int k = counts[c];
        int *len = xmalloc((size_t)k * sizeof *len), *disp = xmalloc((size_t)k * sizeof *disp);
        int at = 0, total = 0;
        for (int b = 0; b < k; b++) {
            len[b] = 1 + (b * 7) % 5;
            disp[b] = at;
            at += len[b] + 1 + b % 3;
            total += len[b];
        }
        int extent = at;
        MPI_Datatype idx;
        MPI_Type_indexed(k, len, disp, MPI_INT, &idx);
        MPI_Type_commit(&idx);
        int *sbuf = xmalloc((size_t)extent * sizeof(int)), *rbuf = xmalloc((size_t)extent * sizeof(int));
        char *member = calloc((size_t)extent, 1);
        for (int b = 0; b < k; b++)
            memset(member + disp[b], 1, (size_t)len[b]);
        for (int i = 0; i < extent; i++) {
            sbuf[i] = (int)val(rank, i, 3);
            rbuf[i] = -7;
        }
        MPI_Status st;
        sendrecv(sbuf, 1, idx, rbuf, 1, idx, 30 + c, &st);
        int elements;
        MPI_Get_elements(&st, MPI_INT, &elements);
        CHECK(elements == total, "indexed (%d blocks): %d ints arrived, expected %d", k, elements, total);
        for (int i = 0; i < extent; i++) {
            int want = member[i] ? (int)val(prev_rank, i, 3) : -7;
            CHECK(rbuf[i] == want, "indexed (%d blocks): int %d is %d, expected %d", k, i, rbuf[i], want);
        }
        MPI_Type_free(&idx);
        free(len);
        free(disp);
        free(sbuf);
        free(rbuf);
        free(member);
    }
}

/* 3: structs with gaps, sent in one layout and received in another */
struct rec_a {
    char c;
    int i;
    double d[3];
    short s;
};
struct rec_b {
    short pad;
    double d[3];
    char c;
    short s;
    int i;
};

static MPI_Datatype struct_type(int layout)
{
    int len[4] = {1, 1, 3, 1};
    MPI_Aint disp[4];
    MPI_Datatype types[4] = {MPI_CHAR, MPI_INT, MPI_DOUBLE, MPI_SHORT}, t, resized;
    /* the same type signature (char, int, 3 double, short) in both layouts */
    if (layout == 0) {
        disp[0] = offsetof(struct rec_a, c);
        disp[1] = offsetof(struct rec_a, i);
        disp[2] = offsetof(struct rec_a, d);
        disp[3] = offsetof(struct rec_a, s);
    } else {
        disp[0] = offsetof(struct rec_b, c);
        disp[1] = offsetof(struct rec_b, i);
        disp[2] = offsetof(struct rec_b, d);
        disp[3] = offsetof(struct rec_b, s);
    }
    MPI_Type_create_struct(4, len, disp, types, &t);
    MPI_Type_create_resized(t, 0, layout == 0 ? sizeof(struct rec_a) : sizeof(struct rec_b), &resized);
    MPI_Type_free(&t);
    MPI_Type_commit(&resized);
    return resized;
}

static void fill_rec(struct rec_a *r, int owner, int k)
{
    memset(r, 0x3c, sizeof *r);
    r->c = (char)(val(owner, k, 4) & 0x7f);
    r->i = (int)val(owner, k, 5);
    for (int j = 0; j < 3; j++)
        r->d[j] = (double)val(owner, 3 * (int64_t)k + j, 6);
    r->s = (short)(val(owner, k, 7) & 0x7fff);
}

static void structs(void)
{
    /* 31 B of data a record: 528 records are the first over 16 KiB */
    static const int counts[] = {1, 500, 527, 528, 600, 50000};
    MPI_Datatype ta = struct_type(0), tb = struct_type(1);
    for (int c = 0; c < 6; c++) {
        int n = counts[c];
        if (avoid_am_bugs && is_am_long((size_t)n * 31))
            continue; /* MPICH 5.0.2 defect 2, see avoid_am_bugs */
        struct rec_a *a = xmalloc((size_t)n * sizeof *a);
        struct rec_b *b = xmalloc((size_t)n * sizeof *b);
        for (int k = 0; k < n; k++)
            fill_rec(&a[k], rank, k);
        memset(b, 0xee, (size_t)n * sizeof *b);
        MPI_Status st;
        sendrecv(a, n, ta, b, n, tb, 40 + c, &st);
        int count;
        MPI_Get_count(&st, tb, &count);
        CHECK(count == n, "struct: %d records arrived, expected %d", count, n);
        for (int k = 0; k < n; k++) {
            struct rec_a want;
            fill_rec(&want, prev_rank, k);
            CHECK(b[k].c == want.c && b[k].i == want.i && b[k].s == want.s && b[k].d[0] == want.d[0] &&
                      b[k].d[1] == want.d[1] && b[k].d[2] == want.d[2],
                  "struct (%d records): record %d differs", n, k);
            /* bytes outside the fields: pad, and the holes after c, s and i */
            const unsigned char *raw = (const unsigned char *)&b[k];
            for (size_t off = 0; off < sizeof b[k]; off++) {
                int field = (off >= offsetof(struct rec_b, d) && off < offsetof(struct rec_b, d) + 24) ||
                            off == offsetof(struct rec_b, c) ||
                            (off >= offsetof(struct rec_b, s) && off < offsetof(struct rec_b, s) + 2) ||
                            (off >= offsetof(struct rec_b, i) && off < offsetof(struct rec_b, i) + 4);
                CHECK(field || raw[off] == 0xee, "struct (%d records): record %d: gap byte %zu written",
                      n, k, off);
            }
        }
        /* the same records from rank 0 to all, in layout a */
        if (rank != 0)
            memset(a, 0, (size_t)n * sizeof *a);
        MPI_Bcast(a, n, ta, 0, MPI_COMM_WORLD);
        for (int k = 0; k < n; k++) {
            struct rec_a want;
            fill_rec(&want, 0, k);
            CHECK(a[k].c == want.c && a[k].i == want.i && a[k].s == want.s && a[k].d[0] == want.d[0] &&
                      a[k].d[1] == want.d[1] && a[k].d[2] == want.d[2],
                  "Bcast of struct (%d records): record %d differs", n, k);
        }
        free(a);
        free(b);
    }
    MPI_Type_free(&ta);
    MPI_Type_free(&tb);
}

/* 4: a column resized to one element: count columns make a transpose */
static void resized_transpose(void)
{
    static const int dims[] = {64, 65, 600};
    for (int c = 0; c < 3; c++) {
        int m = dims[c];
        MPI_Datatype col, col1;
        MPI_Type_vector(m, 1, m, MPI_INT, &col);
        MPI_Type_create_resized(col, 0, sizeof(int), &col1);
        MPI_Type_commit(&col1);
        int *a = xmalloc((size_t)m * m * sizeof(int)), *t = xmalloc((size_t)m * m * sizeof(int));
        for (int i = 0; i < m * m; i++)
            a[i] = (int)val(rank, i, 8);
        MPI_Status st;
        sendrecv(a, m, col1, t, m * m, MPI_INT, 50 + c, &st);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < m; j++)
                CHECK(t[i * m + j] == (int)val(prev_rank, (int64_t)j * m + i, 8),
                      "transpose %dx%d: element (%d,%d) is %d", m, m, i, j, t[i * m + j]);
        MPI_Type_free(&col);
        MPI_Type_free(&col1);
        free(a);
        free(t);
    }
}

/* 5: count and elements of a receive that is not a whole number of its type */
static void partial_counts(void)
{
    int out[10], in[20];
    MPI_Datatype four;
    MPI_Type_contiguous(4, MPI_INT, &four);
    MPI_Type_commit(&four);
    for (int i = 0; i < 10; i++)
        out[i] = (int)val(rank, i, 9);
    MPI_Status st;
    sendrecv(out, 10, MPI_INT, in, 5, four, 60, &st);
    int count, elements;
    MPI_Get_count(&st, four, &count);
    MPI_Get_elements(&st, four, &elements);
    CHECK(count == MPI_UNDEFINED, "10 ints as 4-int units: MPI_Get_count gives %d, not MPI_UNDEFINED", count);
    CHECK(elements == 10, "10 ints as 4-int units: MPI_Get_elements gives %d", elements);
    for (int i = 0; i < 10; i++)
        CHECK(in[i] == (int)val(prev_rank, i, 9), "partial receive: int %d is %d", i, in[i]);
    MPI_Type_free(&four);
}

int main(int argc, char **argv)
{
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    if (avoid_am_bugs)
        suite_note = "active-message mode: struct messages kept under 16 KiB (MPICH 5.0.2 defect)";
    next_rank = (rank + 1) % nranks;
    prev_rank = (rank + nranks - 1) % nranks;
    phase("vector types");
    vectors();
    phase("indexed types");
    indexed();
    phase("struct types");
    structs();
    phase("resized types");
    resized_transpose();
    phase("partial receives");
    partial_counts();
    suite_pass();
    return 0;
}
