/* heapcheck: exercises libunimem-heap.so (preloaded) from a separate
 * process; run by tests/tests/integration/heap.rs.
 *
 *   heapcheck api | threads N | fork | realloc | exhaust
 *
 * It asks the heap which memory is dmable through the heap's handshake
 * (unimem_heap_abi_v3, see dma/src/heap_abi.rs). Prints "heapcheck <cmd>:
 * PASS" and exits 0, or says what failed and exits 1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct region_id { uint32_t job, pid, nonce, reserved; };
struct heap_abi {
    uint64_t magic;
    uint32_t version, layout;
    int (*region)(struct region_id *out);
    int (*contains)(uintptr_t addr, size_t len);
    void *(*alloc)(size_t len);
    void (*free)(void *ptr);
    size_t (*in_use)(void);
    int32_t (*grant_token)(uintptr_t addr, size_t len);
    void (*exposed)(uintptr_t addr, size_t len);
};

static const struct heap_abi *abi;
static const char *cmd = "?";
static size_t threshold = 1;
/* A block the checks of large blocks use: the threshold, or 64 KiB when
 * every block is dmable (the default). */
static size_t unit = 64 << 10;

#define CHECK(cond, ...) do { if (!(cond)) { \
    fprintf(stderr, "heapcheck %s: line %d: %s: ", cmd, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)

static int dmable(const void *p, size_t len) { return abi->contains((uintptr_t)p, len); }

static void fill(unsigned char *p, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(seed + i * 7);
}
static int check(const unsigned char *p, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) if (p[i] != (unsigned char)(seed + i * 7)) return 0;
    return 1;
}

static void api(void) {
    void *big = malloc(unit), *below = malloc(threshold - 1);
    CHECK(big && below, "malloc");
    CHECK(dmable(big, unit), "a malloc at the unit is dmable");
    CHECK(threshold <= 1 || !dmable(below, 1), "a malloc below the threshold is not");
    CHECK((uintptr_t)big % 16 == 0, "alignment");
    CHECK(malloc_usable_size(big) >= unit, "usable %zu", malloc_usable_size(big));
    CHECK(malloc_usable_size(below) >= threshold - 1, "usable below");
    CHECK(malloc_usable_size(NULL) == 0, "usable NULL");
    fill(big, unit, 1);
    free(big); free(below); free(NULL);

    unsigned char *z = calloc(1024, 1024);
    CHECK(z && dmable(z, 1 << 20), "calloc 1 MiB is dmable");
    for (size_t i = 0; i < 1 << 20; i++) CHECK(z[i] == 0, "calloc zeroes reused memory at %zu", i);
    free(z);
    volatile size_t huge = SIZE_MAX / 2;
    errno = 0;
    CHECK(calloc(huge, 4) == NULL && errno == ENOMEM, "calloc overflow");

    /* Larger than the region could ever hold: the system's, and no
     * "region is full" line (the test checks stderr stays empty). */
    volatile size_t two_gib = (size_t)2 << 30;
    void *giant = malloc(two_gib);
    CHECK(giant && !dmable(giant, 1), "a block beyond the region's bound comes from the system");
    free(giant);

    CHECK(realloc(NULL, unit) != NULL, "realloc(NULL) is malloc");
    void *r = malloc(unit * 2);
    CHECK(realloc(r, 0) == NULL, "realloc(p, 0) frees and returns NULL");
    errno = 0;
    CHECK(reallocarray(NULL, huge, 4) == NULL && errno == ENOMEM, "reallocarray overflow");

    void *a = NULL;
    CHECK(posix_memalign(&a, 3, unit) == EINVAL, "posix_memalign, align 3");
    CHECK(posix_memalign(&a, 4, unit) == EINVAL, "posix_memalign, align 4 < sizeof(void *)");
    CHECK(posix_memalign(&a, 4096, unit) == 0 && (uintptr_t)a % 4096 == 0 && dmable(a, unit),
          "posix_memalign 4096, large");
    CHECK(malloc_usable_size(a) >= unit, "usable aligned");
    free(a);
    CHECK(posix_memalign(&a, 1 << 20, 3 * unit) == 0 && (uintptr_t)a % (1 << 20) == 0 && dmable(a, 3 * unit),
          "posix_memalign 1 MiB");
    free(a);
    CHECK(posix_memalign(&a, 256, 100) == 0 && (uintptr_t)a % 256 == 0 && dmable(a, 1) == (100 >= threshold),
          "posix_memalign small");
    free(a);
    errno = 0;
    CHECK(aligned_alloc(3, unit) == NULL && errno == EINVAL, "aligned_alloc, align 3");
    a = aligned_alloc(8192, 2 * unit);
    CHECK(a && (uintptr_t)a % 8192 == 0 && dmable(a, 2 * unit), "aligned_alloc large");
    free(a);
    a = memalign(128, unit);
    CHECK(a && (uintptr_t)a % 128 == 0 && dmable(a, unit), "memalign");
    free(a);
    a = valloc(unit);
    CHECK(a && (uintptr_t)a % 4096 == 0 && dmable(a, unit), "valloc");
    free(a);
    a = pvalloc(unit + 1);
    CHECK(a && (uintptr_t)a % 4096 == 0 && malloc_usable_size(a) >= unit + 4096, "pvalloc");
    free(a);

    /* The provider's buffers (handshake alloc) and the application's heap
     * never share memory: what the provider let go is never handed to
     * the application (a peer may still hold a grant for it). */
    struct region_id id;
    CHECK(abi->region(&id) == 0 && id.pid == (uint32_t)getpid(), "region identity");
    void *internal = abi->alloc(unit);
    CHECK(internal && dmable(internal, unit), "handshake alloc");
    abi->free(internal);
    for (int i = 0; i < 64; i++) {
        void *p = malloc(unit);
        CHECK(p != internal, "malloc handed out the provider's freed buffer");
    }
}

struct worker { int index, rounds; };

static void *work(void *arg) {
    struct worker *w = arg;
    enum { SLOTS = 32 };
    unsigned char *slot[SLOTS] = {0};
    size_t len[SLOTS] = {0};
    unsigned seed = 12345u + (unsigned)w->index * 7919u;
    for (int round = 0; round < w->rounds; round++) {
        seed = seed * 1103515245u + 12345u;
        int i = (int)(seed >> 8) % SLOTS;
        if (slot[i]) {
            if (!check(slot[i], len[i], (unsigned)(w->index * 131 + i))) return "corrupt";
            if (len[i] >= threshold && !dmable(slot[i], len[i])) return "large block not dmable";
            if (round % 3 == 0) {
                /* Grow, or shrink a block past 4 MiB: the working set stays
                 * far inside the heap's bound (exhaustion has its own test),
                 * and realloc both grows and shrinks blocks. */
                size_t grown = len[i] > (4u << 20) ? len[i] / 3 : len[i] * 2 + 1;
                unsigned char *p = realloc(slot[i], grown);
                if (!p || !check(p, grown < len[i] ? grown : len[i], (unsigned)(w->index * 131 + i)))
                    return "realloc";
                fill(p, grown, (unsigned)(w->index * 131 + i));
                slot[i] = p, len[i] = grown;
            } else {
                free(slot[i]);
                slot[i] = NULL;
            }
            continue;
        }
        size_t sizes[] = {16, 1000, unit / 2, unit, 3 * unit, 1 << 20};
        len[i] = sizes[(seed >> 16) % 6] + (seed >> 20) % 100;
        slot[i] = (seed & 1) ? malloc(len[i]) : calloc(1, len[i]);
        if (!slot[i]) return "malloc";
        fill(slot[i], len[i], (unsigned)(w->index * 131 + i));
    }
    for (int i = 0; i < SLOTS; i++) {
        if (slot[i] && !check(slot[i], len[i], (unsigned)(w->index * 131 + i))) return "corrupt at end";
        free(slot[i]);
    }
    return NULL;
}

static void threads(int n) {
    pthread_t t[64];
    struct worker w[64];
    CHECK(n > 0 && n <= 64, "1..64 threads");
    for (int i = 0; i < n; i++) {
        w[i] = (struct worker){i, 4000};
        CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < n; i++) {
        void *failed;
        pthread_join(t[i], &failed);
        CHECK(failed == NULL, "thread %d: %s", i, (const char *)failed);
    }
}

static void forked(void) {
    size_t len = 4 * unit;
    unsigned char *shared = malloc(len);
    CHECK(dmable(shared, len), "parent block dmable");
    memset(shared, 'P', len);
    /* A small block (dmable with the default threshold): shares its
     * pages with others, which the child must get copies of too. */
    unsigned char *tiny = malloc(24);
    memset(tiny, 'p', 24);
    CHECK(dmable(tiny, 24) == (24 >= threshold), "parent small block");
    struct region_id parent;
    CHECK(abi->region(&parent) == 0, "parent region");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        cmd = "fork (child)";
        for (size_t i = 0; i < len; i++) CHECK(shared[i] == 'P', "child sees the parent's data");
        for (size_t i = 0; i < 24; i++) CHECK(tiny[i] == 'p', "child sees the parent's small block");
        CHECK(!dmable(tiny, 24), "the parent's small block is not the child's dmable memory");
        CHECK(malloc_usable_size(tiny) >= 24, "usable size of an inherited small block");
        memset(tiny, 'c', 24);
        unsigned char *tiny2 = realloc(tiny, 40);
        CHECK(tiny2 && tiny2[23] == 'c' && dmable(tiny2, 40) == (40 >= threshold), "realloc of an inherited small block");
        free(tiny2);
        /* The child writes its copy: the parent must not see it. */
        memset(shared, 'C', len);
        CHECK(!dmable(shared, len), "the parent's block is not the child's dmable memory");
        CHECK(malloc_usable_size(shared) >= len, "usable size of an inherited block");
        unsigned char *grown = realloc(shared, 2 * len);
        CHECK(grown && grown[len - 1] == 'C' && dmable(grown, 2 * len), "realloc of an inherited block");
        free(grown);
        unsigned char *own = malloc(len);
        CHECK(own && dmable(own, len), "the child's own large block is dmable");
        struct region_id child;
        CHECK(abi->region(&child) == 0 && child.pid == (uint32_t)getpid() && child.pid != parent.pid,
              "the child has a region of its own");
        fill(own, len, 3);
        CHECK(check(own, len, 3), "child data");
        free(own);
        /* threads in the child too */
        threads(2);
        exit(0); /* (not _exit: the heap removes its objects at exit) */
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (status %d)", status);
    for (size_t i = 0; i < len; i++) CHECK(shared[i] == 'P', "the child's writes reached the parent at %zu", i);
    for (size_t i = 0; i < 24; i++) CHECK(tiny[i] == 'p', "the child's writes reached the parent's small block");
    free(tiny);
    struct region_id again;
    CHECK(abi->region(&again) == 0 && again.pid == parent.pid && again.nonce == parent.nonce, "parent keeps its region");
    free(shared);
    unsigned char *after = malloc(len);
    CHECK(after && dmable(after, len), "parent allocates after the fork");
    free(after);
}

/* Small blocks (the default threshold makes every block dmable): each size
 * up to 2 KiB and a little past it, many live at once, distinct, aligned,
 * dmable, keeping their data; freed ones serve again; calloc zeroes a
 * reused one; realloc keeps data across sizes; a small block is never
 * granted in place (its pages hold other blocks), a page-sized one is. */
static void small_blocks(void) {
    enum { PER = 40 };
    static unsigned char *blocks[2200][PER];
    size_t top = 2100;
    for (size_t size = 1; size <= top; size += (size < 64 ? 1 : 37)) {
        for (int k = 0; k < PER; k++) {
            unsigned char *p = malloc(size);
            CHECK(p && (uintptr_t)p % 16 == 0, "malloc(%zu) aligned", size);
            CHECK(dmable(p, size), "malloc(%zu) is dmable", size);
            CHECK(malloc_usable_size(p) >= size, "usable %zu", size);
            fill(p, size, (unsigned)(size * 31 + k));
            blocks[size][k] = p;
        }
    }
    for (size_t size = 1; size <= top; size += (size < 64 ? 1 : 37))
        for (int k = 0; k < PER; k++)
            CHECK(check(blocks[size][k], size, (unsigned)(size * 31 + k)), "data of a %zu-byte block", size);
    for (size_t size = 1; size <= top; size += (size < 64 ? 1 : 37))
        for (int k = 0; k < PER; k++) free(blocks[size][k]);

    /* What was freed serves again: no growth for a malloc/free loop. */
    size_t before = abi->in_use();
    for (int i = 0; i < 100000; i++) {
        char *p = malloc(48 + i % 200);
        p[0] = (char)i;
        free(p);
    }
    CHECK(abi->in_use() == before, "a malloc/free loop grew the region (%zu -> %zu)", before, abi->in_use());

    /* A block freed twice is handed out once. */
    void *twice = malloc(200);
    void *volatile again = twice; /* (no use-after-free warning) */
    free(twice);
    free(again);
    void *one = malloc(200), *other = malloc(200);
    CHECK(one != other, "a block freed twice was handed out twice");
    free(one);
    free(other);

    unsigned char *d = malloc(100);
    memset(d, 0xAB, 100);
    free(d);
    unsigned char *z = calloc(1, 100);
    for (int i = 0; i < 100; i++) CHECK(z[i] == 0, "calloc zeroes a reused small block");
    fill(z, 100, 9);
    unsigned char *r = realloc(z, 1500);
    CHECK(r && check(r, 100, 9) && dmable(r, 1500), "realloc small to small");
    fill(r, 1500, 10);
    r = realloc(r, 100000);
    CHECK(r && check(r, 1500, 10) && dmable(r, 100000), "realloc small to large");
    fill(r, 100000, 11);
    r = realloc(r, 20);
    CHECK(r && check(r, 20, 11), "realloc large to small");
    free(r);

    void *a = NULL;
    CHECK(posix_memalign(&a, 1024, 100) == 0 && (uintptr_t)a % 1024 == 0 && dmable(a, 100),
          "posix_memalign(1024, 100)");
    free(a);
    unsigned char *s = malloc(64), *page = malloc(8192);
    CHECK(abi->grant_token((uintptr_t)s, 64) < 0, "a small block is granted in place");
    CHECK(abi->grant_token((uintptr_t)page, 8192) >= 0, "a page block is not granted in place");
    free(s);
    free(page);
}

static void realloc_across(void) {
    /* A large block with free memory after it grows where it is. */
    unsigned char *first = malloc(1 << 20);
    fill(first, 1 << 20, 4);
    unsigned char *grown = realloc(first, 3 << 20);
    CHECK(grown == first && check(grown, 1 << 20, 4) && dmable(grown, 3 << 20), "grow in place");
    CHECK(malloc_usable_size(grown) >= (3u << 20), "usable after growing in place");
    unsigned char *blocker = malloc(1 << 20);
    unsigned char *moved = realloc(grown, 5 << 20);
    CHECK(moved && check(moved, 1 << 20, 4) && dmable(moved, 5 << 20), "grow past a neighbour");
    free(blocker);
    free(moved);

    size_t len = 1000;
    unsigned char *p = malloc(len);
    fill(p, len, 9);
    for (; len < (8u << 20); len *= 2) {
        unsigned char *q = realloc(p, len * 2);
        CHECK(q && check(q, len, 9), "grow to %zu keeps the data", len * 2);
        CHECK(dmable(q, len * 2) == (len * 2 >= threshold), "grow to %zu: dmable iff at least the threshold", len * 2);
        fill(q, len * 2, 9);
        p = q;
    }
    for (; len >= 500; len /= 2) {
        unsigned char *q = realloc(p, len);
        CHECK(q && check(q, len, 9), "shrink to %zu keeps the data", len);
        CHECK(dmable(q, len) == (len >= threshold), "shrink to %zu: dmable iff at least the threshold", len);
        p = q;
    }
    free(p);
}

/* Run with a small region: FI_UNIMEM_DMA_SEGMENT_SIZE=1m
 * FI_UNIMEM_HEAP_MAX_SIZE=4m. */
static void exhaust(void) {
    enum { N = 64 };
    unsigned char *block[N];
    int dma = 0, sys = 0;
    for (int i = 0; i < N; i++) {
        block[i] = malloc(512 << 10);
        CHECK(block[i], "malloc %d falls back instead of failing", i);
        fill(block[i], 512 << 10, (unsigned)i);
        if (dmable(block[i], 512 << 10)) dma++; else sys++;
    }
    CHECK(dma >= 4 && sys > 0, "%d dmable, %d from the system", dma, sys);
    for (int i = 0; i < N; i++) {
        CHECK(check(block[i], 512 << 10, (unsigned)i), "data of block %d", i);
        free(block[i]);
    }
    void *again = malloc(512 << 10);
    CHECK(dmable(again, 512 << 10), "freed dmable memory serves again");
    free(again);
    printf("heapcheck exhaust: %d dmable, %d from the system\n", dma, sys);
}

int main(int argc, char **argv) {
    cmd = argc > 1 ? argv[1] : "?";
    const struct heap_abi *(*get)(void) = (const struct heap_abi *(*)(void))dlsym(RTLD_DEFAULT, "unimem_heap_abi_v3");
    CHECK(get != NULL, "libunimem-heap.so is not preloaded");
    abi = get();
    const char *t = getenv("FI_UNIMEM_HEAP_THRESHOLD");
    if (t) threshold = strtoul(t, NULL, 0);
    if (threshold > 1) unit = threshold;
    if (!strcmp(cmd, "api")) api();
    else if (!strcmp(cmd, "threads")) threads(argc > 2 ? atoi(argv[2]) : 4);
    else if (!strcmp(cmd, "fork")) forked();
    else if (!strcmp(cmd, "realloc")) realloc_across();
    else if (!strcmp(cmd, "exhaust")) exhaust();
    else if (!strcmp(cmd, "small")) small_blocks();
    else CHECK(0, "unknown command");
    printf("heapcheck %s: PASS\n", cmd);
    return 0;
}
