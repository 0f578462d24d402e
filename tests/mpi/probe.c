/*
 * mpi-suite probe: matching semantics over messages of every protocol
 * (inline, eager, rendezvous):
 *
 *   1. MPI_ANY_SOURCE / MPI_ANY_TAG receives at each rank in turn, every
 *      other rank sending a run of mixed sizes: status MPI_SOURCE, MPI_TAG
 *      and MPI_Get_count checked, and per-source send order kept;
 *      a wildcard-source receive on one tag skips messages of another tag;
 *   2. non-overtaking: 120 messages with one (source, tag, comm), sizes
 *      small/eager/rendezvous interleaved, must arrive in send order, with
 *      the receives posted first, and with the messages already waiting
 *      (unexpected) when a wildcard-source receiver comes;
 *   3. MPI_Probe, MPI_Iprobe, MPI_Mprobe + MPI_Mrecv, MPI_Improbe +
 *      MPI_Imrecv for sizes across the protocols, and that a matched
 *      (Mprobe'd) message is out of the way of later receives.
 *
 * Steps 2 and 3 run between every pair of ranks (round-robin schedule),
 * one direction at a time.
 */
#define NAME "probe"
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

/* Sizes across the protocol boundaries, up to a 2-segment rendezvous. */
static const int psizes[] = {0, 1, 6, 7, 14, 15, 22, 23, 100, 16320, 16352, 16384, 16385,
                             65536, 262145, 524289};
#define NPSIZES ((int)(sizeof psizes / sizeof psizes[0]))
#define PMAX 524289

/* Isend into req[*k]; in restricted active-message mode (see avoid_am_bugs) a
 * long message first waits for this rank's previous long send, whose
 * index *long_idx keeps. */
static void gated_isend(const void *buf, int n, int dst, int tag, MPI_Request *req, int *k,
                        int *long_idx)
{
    if (avoid_am_bugs && is_am_long((size_t)n)) {
        if (*long_idx >= 0)
            MPI_Wait(&req[*long_idx], MPI_STATUS_IGNORE);
        *long_idx = *k;
    }
    MPI_Isend(buf, n, MPI_BYTE, dst, tag, MPI_COMM_WORLD, &req[(*k)++]);
}

/* ---- 1: wildcard receives ---- */

#define WILD_PER_SENDER 14
static int wild_tag(int src, int k)
{
    return 100 + ((src * 7 + k * 13) % 50);
}
static int wild_size(int src, int k)
{
    return psizes[(src * 5 + k) % NPSIZES];
}

static void wildcards(void)
{
    unsigned char *buf = xmalloc(PMAX);
    for (int root = 0; root < nranks; root++) {
        if (rank != root) {
            /* blocking sends: one message in flight per sender */
            for (int k = 0; k < WILD_PER_SENDER; k++) {
                int n = wild_size(rank, k);
                fill(buf, (size_t)n, seed_of(rank, root, k, 11));
                MPI_Send(buf, n, MPI_BYTE, root, wild_tag(rank, k), MPI_COMM_WORLD);
            }
        } else {
            int *next_k = calloc((size_t)nranks, sizeof *next_k);
            int total = (nranks - 1) * WILD_PER_SENDER;
            for (int m = 0; m < total; m++) {
                MPI_Status st;
                if (m % 2 == 0) {
                    MPI_Recv(buf, PMAX, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
                } else {
                    MPI_Request req;
                    MPI_Irecv(buf, PMAX, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &req);
                    MPI_Wait(&req, &st);
                }
                int src = st.MPI_SOURCE;
                CHECK(src >= 0 && src < nranks && src != root,
                      "wildcard receive %d: status MPI_SOURCE is %d", m, src);
                int k = next_k[src]++;
                CHECK(k < WILD_PER_SENDER, "wildcard receive %d: too many messages from rank %d", m, src);
                check_status(__LINE__, "wildcard receive (per-source order)", &st, src,
                             wild_tag(src, k), wild_size(src, k));
                check_fill(__LINE__, buf, (size_t)wild_size(src, k), seed_of(src, root, k, 11),
                           "wildcard receive, message %d of rank %d", k, src);
            }
            free(next_k);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }

    /* MPI_ANY_SOURCE with a fixed tag: every rank sends rank 0 a decoy with
     * tag 8, then the real message with tag 7; rank 0 takes all tag-7
     * messages first. */
    if (rank != 0) {
        int decoy = rank * 3, real = 16385 + rank;
        fill(buf, (size_t)decoy, seed_of(rank, 0, 8, 12));
        MPI_Send(buf, decoy, MPI_BYTE, 0, 8, MPI_COMM_WORLD);
        fill(buf, (size_t)real, seed_of(rank, 0, 7, 12));
        MPI_Send(buf, real, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
    } else {
        int *seen = calloc((size_t)nranks, sizeof *seen);
        for (int tag = 7; tag <= 8; tag++) {
            for (int m = 1; m < nranks; m++) {
                MPI_Status st;
                MPI_Recv(buf, PMAX, MPI_BYTE, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &st);
                int src = st.MPI_SOURCE;
                CHECK(src > 0 && src < nranks && seen[src] == tag - 7,
                      "MPI_ANY_SOURCE tag %d: unexpected source %d", tag, src);
                seen[src]++;
                int n = tag == 7 ? 16385 + src : src * 3;
                check_status(__LINE__, "MPI_ANY_SOURCE, fixed tag", &st, src, tag, n);
                check_fill(__LINE__, buf, (size_t)n, seed_of(src, 0, tag, 12),
                           "MPI_ANY_SOURCE tag %d from rank %d", tag, src);
            }
        }
        free(seen);
    }
    free(buf);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Runs send_to(p) and recv_from(p) for every pair: lower rank sends first.
 * A barrier ends each round, so wildcard receives see only the partner. */
static void for_each_pair(void (*send_to)(int), void (*recv_from)(int))
{
    int slots = nranks % 2 == 0 ? nranks : nranks + 1;
    for (int r = 0; r < slots - 1; r++) {
        int p = round_partner(rank, r, slots);
        if (p < nranks && rank < p) {
            send_to(p);
            recv_from(p);
        } else if (p < nranks) {
            recv_from(p);
            send_to(p);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

/* ---- 2: non-overtaking ---- */

#define ORDER_MSGS 120
static const int order_cycle[] = {0, 3, 14, 15, 100, 6, 16384, 16385, 2000, 70000, 22, 300001};
static int order_size(int i)
{
    return order_cycle[i % (int)(sizeof order_cycle / sizeof order_cycle[0])];
}
#define ORDER_MAX 300001
#define ORDER_TAG 5

static int order_variant; /* 0: receives posted first; 1: unexpected, wildcard source */

static void order_send(int p)
{
    unsigned char *buf = xmalloc((size_t)ORDER_MSGS * ORDER_MAX);
    MPI_Request req[ORDER_MSGS];
    int k = 0, long_idx = -1;
    if (order_variant == 0) /* wait until the receiver has posted everything */
        MPI_Recv(NULL, 0, MPI_BYTE, p, ORDER_TAG + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (int i = 0; i < ORDER_MSGS; i++) {
        unsigned char *b = buf + (size_t)i * ORDER_MAX;
        fill(b, (size_t)order_size(i), seed_of(rank, p, i, 20 + order_variant));
        if (i % 3 == 2 && !(avoid_am_bugs && is_am_long((size_t)order_size(i)))) {
            MPI_Send(b, order_size(i), MPI_BYTE, p, ORDER_TAG, MPI_COMM_WORLD);
            req[k++] = MPI_REQUEST_NULL;
        } else {
            gated_isend(b, order_size(i), p, ORDER_TAG, req, &k, &long_idx);
        }
    }
    MPI_Waitall(k, req, MPI_STATUSES_IGNORE);
    free(buf);
}

static void order_recv(int p)
{
    unsigned char *buf = xmalloc((size_t)ORDER_MSGS * ORDER_MAX);
    MPI_Request req[ORDER_MSGS];
    MPI_Status st[ORDER_MSGS];
    if (order_variant == 0) {
        for (int i = 0; i < ORDER_MSGS; i++)
            MPI_Irecv(buf + (size_t)i * ORDER_MAX, ORDER_MAX, MPI_BYTE, p, ORDER_TAG,
                      MPI_COMM_WORLD, &req[i]);
        MPI_Send(NULL, 0, MPI_BYTE, p, ORDER_TAG + 1, MPI_COMM_WORLD);
        MPI_Waitall(ORDER_MSGS, req, st);
    } else {
        /* Not a synchronisation: the receiver stays away for a while so
         * that the messages are likely to be unexpected when it comes. The
         * checks hold whatever the timing. */
        sleep_ms(30);
        for (int i = 0; i < ORDER_MSGS; i++)
            MPI_Recv(buf + (size_t)i * ORDER_MAX, ORDER_MAX, MPI_BYTE, MPI_ANY_SOURCE, ORDER_TAG,
                     MPI_COMM_WORLD, &st[i]);
    }
    for (int i = 0; i < ORDER_MSGS; i++) {
        check_status(__LINE__, order_variant ? "unexpected, in order" : "pre-posted, in order",
                     &st[i], p, ORDER_TAG, order_size(i));
        check_fill(__LINE__, buf + (size_t)i * ORDER_MAX, (size_t)order_size(i),
                   seed_of(p, rank, i, 20 + order_variant), "message %d of %d from rank %d", i,
                   ORDER_MSGS, p);
    }
    free(buf);
}

/* ---- 3: probes ---- */

/* Messages of one probe step: psizes[] in order, tags 300 + i. Step 4
 * sends pairs with one tag for the Mprobe step. */
static int probe_step;
#define PROBE_TAG(i) (300 + (i))
#define MATCHED_TAG 77
static const int matched_pairs[][2] = {{300001, 5}, {5, 16385}, {0, 14}, {70000, 16000}};
#define NMATCHED ((int)(sizeof matched_pairs / sizeof matched_pairs[0]))

static void probe_send(int p)
{
    unsigned char *buf = xmalloc((size_t)NPSIZES * PMAX);
    MPI_Request req[2 * NMATCHED + NPSIZES];
    int k = 0, long_idx = -1;
    if (probe_step < 4) {
        for (int i = 0; i < NPSIZES; i++) {
            unsigned char *b = buf + (size_t)i * PMAX;
            fill(b, (size_t)psizes[i], seed_of(rank, p, i, 30 + probe_step));
            gated_isend(b, psizes[i], p, PROBE_TAG(i), req, &k, &long_idx);
        }
    } else {
        for (int i = 0; i < NMATCHED; i++) {
            for (int j = 0; j < 2; j++) {
                unsigned char *b = buf + (size_t)(2 * i + j) * 300001;
                fill(b, (size_t)matched_pairs[i][j], seed_of(rank, p, 2 * i + j, 34));
                gated_isend(b, matched_pairs[i][j], p, MATCHED_TAG, req, &k, &long_idx);
            }
        }
    }
    MPI_Waitall(k, req, MPI_STATUSES_IGNORE);
    free(buf);
}

static void probe_recv(int p)
{
    static const char *names[] = {"MPI_Probe", "MPI_Iprobe", "MPI_Mprobe", "MPI_Improbe"};
    unsigned char *buf = xmalloc(PMAX);
    if (probe_step == 4) {
        /* Mprobe takes the first message of a pair out of matching: the
         * following MPI_Recv with the same tag must get the second one. */
        unsigned char *first = xmalloc(300001);
        for (int i = 0; i < NMATCHED; i++) {
            MPI_Message msg;
            MPI_Status st;
            int a = matched_pairs[i][0], b = matched_pairs[i][1];
            MPI_Mprobe(p, MATCHED_TAG, MPI_COMM_WORLD, &msg, &st);
            check_status(__LINE__, "Mprobe of the first of two", &st, p, MATCHED_TAG, a);
            MPI_Recv(buf, PMAX, MPI_BYTE, p, MATCHED_TAG, MPI_COMM_WORLD, &st);
            check_status(__LINE__, "Recv after Mprobe (must be the second)", &st, p, MATCHED_TAG, b);
            check_fill(__LINE__, buf, (size_t)b, seed_of(p, rank, 2 * i + 1, 34),
                       "second message of pair %d", i);
            MPI_Mrecv(first, a, MPI_BYTE, &msg, &st);
            CHECK(msg == MPI_MESSAGE_NULL, "MPI_Mrecv did not reset the message handle");
            check_status(__LINE__, "Mrecv of the first of two", &st, p, MATCHED_TAG, a);
            check_fill(__LINE__, first, (size_t)a, seed_of(p, rank, 2 * i, 34),
                       "first message of pair %d", i);
        }
        free(first);
        free(buf);
        return;
    }
    for (int i = 0; i < NPSIZES; i++) {
        MPI_Status st;
        MPI_Message msg = MPI_MESSAGE_NULL;
        int flag = 0, count;
        switch (probe_step) {
        case 0:
            MPI_Probe(p, PROBE_TAG(i), MPI_COMM_WORLD, &st);
            break;
        case 1:
            while (!flag)
                MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
            break;
        case 2:
            MPI_Mprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &msg, &st);
            break;
        case 3:
            while (!flag)
                MPI_Improbe(p, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &msg, &st);
            break;
        }
        /* with wildcards the earliest message of the sender must come first */
        check_status(__LINE__, names[probe_step], &st, p, PROBE_TAG(i), psizes[i]);
        MPI_Get_count(&st, MPI_BYTE, &count);
        unsigned char *exact = xmalloc((size_t)count + 1);
        exact[count] = 0x5a;
        if (probe_step < 2) {
            MPI_Recv(exact, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &st);
        } else if (probe_step == 2) {
            MPI_Mrecv(exact, count, MPI_BYTE, &msg, &st);
        } else {
            MPI_Request req;
            MPI_Imrecv(exact, count, MPI_BYTE, &msg, &req);
            MPI_Wait(&req, &st);
        }
        check_status(__LINE__, "receive after probe", &st, p, PROBE_TAG(i), psizes[i]);
        check_fill(__LINE__, exact, (size_t)count, seed_of(p, rank, i, 30 + probe_step),
                   "%s then receive, tag %d", names[probe_step], PROBE_TAG(i));
        CHECK(exact[count] == 0x5a, "receive after %s wrote past %d B", names[probe_step], count);
        free(exact);
    }
    /* nothing else may be waiting */
    int flag;
    MPI_Status st;
    MPI_Iprobe(p, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
    CHECK(!flag, "%s step: a message with tag %d is left over", names[probe_step], st.MPI_TAG);
    free(buf);
}

int main(int argc, char **argv)
{
    suite_init(&argc, &argv, MPI_THREAD_SINGLE);
    phase("wildcard receives");
    wildcards();
    for (order_variant = 0; order_variant < 2; order_variant++) {
        phase("non-overtaking, %s", order_variant ? "unexpected messages" : "receives posted first");
        for_each_pair(order_send, order_recv);
    }
    for (probe_step = 0; probe_step < 5; probe_step++) {
        phase("probe step %d", probe_step);
        for_each_pair(probe_send, probe_recv);
    }
    suite_pass();
    return 0;
}
