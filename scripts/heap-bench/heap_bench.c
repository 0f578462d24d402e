/* heap_bench: what a malloc/free pair costs, by size, with whatever
 * allocator the process has (run by scripts/bench-heap with and without
 * libunimem-heap.so preloaded). For each size: pairs that touch one byte,
 * pairs that write the whole block (first-touch page faults count), and
 * (up to 64 KiB) 4096 blocks allocated, then all freed. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20000;
    size_t sizes[] = {8, 64, 512, 1 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
    printf("%10s %16s %22s %18s\n", "size", "malloc+free ns", "malloc+write+free ns",
           "4096 live ns/pair");
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t len = sizes[s];
        int n = len >= (4 << 20) ? rounds / 20 : rounds;
        volatile char sink = 0;
        free(malloc(len)); /* warm-up: the heap's first large block makes a segment */
        double t0 = now_ns();
        for (int i = 0; i < n; i++) {
            char *p = malloc(len);
            p[len / 2] = (char)i;
            sink += p[len / 2];
            free(p);
        }
        double pair = (now_ns() - t0) / n;
        int m = n / 10 + 1;
        t0 = now_ns();
        for (int i = 0; i < m; i++) {
            char *p = malloc(len);
            memset(p, i, len);
            sink += p[len - 1];
            free(p);
        }
        double touched = (now_ns() - t0) / m;
        /* Many blocks live at once, freed in the order they came: what a
         * program building a structure does (no block reused at once). */
        enum { LIVE = 4096 };
        static char *live[LIVE];
        double batch = 0;
        if (len <= (64 << 10)) {
            int k = rounds / LIVE + 1;
            t0 = now_ns();
            for (int r = 0; r < k; r++) {
                for (int i = 0; i < LIVE; i++) {
                    live[i] = malloc(len);
                    live[i][0] = (char)i;
                }
                for (int i = 0; i < LIVE; i++) free(live[i]);
            }
            batch = (now_ns() - t0) / ((double)k * LIVE);
        }
        printf("%10zu %16.0f %22.0f %18.0f\n", len, pair, touched, batch);
    }
    return 0;
}
