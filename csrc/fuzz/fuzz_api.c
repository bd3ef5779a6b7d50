/* fuzz_api.c: libFuzzer harness over the whole C API, checked against a model.
 *
 * Each input is a program: every byte pair is an operation (malloc, calloc,
 * realloc, aligned alloc, free, free_sized, pool create/alloc/free/trim/
 * destroy, arena alloc/reset, stats, trim, thread flush, ownership probes)
 * and its argument. The model keeps every live block: address, size,
 * alignment and the byte it was filled with. After every operation the
 * answers are compared with the model (sizes, usable size, ownership,
 * alignment, zeroed memory, contents kept by realloc), and every few
 * operations every live block's contents and the stats identities are
 * checked. At the end of the input everything is freed, and the heap must
 * be back where the input found it (bytes in use, pool and arena bytes), so
 * inputs are independent. A broken check aborts (a finding).
 * Build: make -C csrc fuzz (clang, -fsanitize=fuzzer,address,undefined).
 */
#include "kp_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include "input.h"

#define HEAP_SLOTS 48
#define POOLS 3
#define POOL_SLOTS 24
#define ARENA_BLOCKS 32

typedef struct block { unsigned char *p; size_t size, align; unsigned char fill; int sized; } block;

static block heap[HEAP_SLOTS];
static struct { kp_pool *pool; size_t bs; block b[POOL_SLOTS]; } pools[POOLS];
static struct { kp_arena *arena; block b[ARENA_BLOCKS]; int n; } arena;


#define FAIL(...) do { fprintf(stderr, "fuzz_api: " __VA_ARGS__); fprintf(stderr, "\n"); abort(); } while (0)

/* A size that likes the edges: 0, classes, the small limit, pages, large. */
static size_t pick_size(unsigned b) {
    unsigned x = next_byte(), y = next_byte();
    switch (b % 8) {
    case 0: return x;                                        /* tiny, 0 included */
    case 1: return 16u * (x + 1);                            /* fine classes */
    case 2: return (size_t)x * 256 + y;                      /* to 64 KiB */
    case 3: return KP_SMALL_MAX - 64 + (x % 129);            /* around the small limit */
    case 4: return ((size_t)x << 12) + y;                    /* to 1 MiB */
    case 5: return ((size_t)(x % 24) << 20) + ((size_t)y << 8); /* large, to 24 MiB */
    case 6: return KP_PAGE_SIZE * (x % 64 + 1) + (y % 3) - 1;   /* around page multiples */
    default: return (size_t)1 << (x % 23);                   /* powers of two */
    }
}

static void fill(block *b) {
    if (b->size) memset(b->p, b->fill, b->size);
}

static void check_block(const block *b, const char *what) {
    if (!b->p) return;
    if (b->align && ((uintptr_t)b->p % b->align)) FAIL("%s: %p not aligned to %zu", what, (void *)b->p, b->align);
    for (size_t i = 0; i < b->size; i += (b->size > 4096 ? 509 : 1))
        if (b->p[i] != b->fill) FAIL("%s: block %p (%zu bytes) damaged at %zu", what, (void *)b->p, b->size, i);
    if (b->size && b->p[b->size - 1] != b->fill) FAIL("%s: block %p last byte damaged", what, (void *)b->p);
}

static void check_heap_block(const block *b) {
    check_block(b, "heap");
    if (!kp_owns(b->p)) FAIL("kp_owns(%p) == 0 for a live block", (void *)b->p);
    size_t u = kp_usable_size(b->p);
    if (u < b->size) FAIL("usable %zu < size %zu", u, b->size);
    if (b->size > 1 && kp_usable_size(b->p + 1) != 0) FAIL("usable size of an interior pointer is not 0");
    if (b->size > 1 && !kp_owns(b->p + b->size - 1)) FAIL("kp_owns of the last byte is 0");
}

static void check_all(void) {
    for (int i = 0; i < HEAP_SLOTS; i++) if (heap[i].p) check_heap_block(&heap[i]);
    for (int k = 0; k < POOLS; k++)
        for (int i = 0; i < POOL_SLOTS; i++)
            if (pools[k].b[i].p) {
                check_block(&pools[k].b[i], "pool");
                if (!kp_pool_owns(pools[k].pool, pools[k].b[i].p)) FAIL("kp_pool_owns of a live block is 0");
            }
    for (int i = 0; i < arena.n; i++) check_block(&arena.b[i], "arena");
}

static void check_stats(void) {
    kp_stats st = { .struct_size = sizeof st };
    if (kp_stats_get(&st) != 0) FAIL("kp_stats_get failed");
    size_t sum = st.bytes_small_spans + st.bytes_large + st.bytes_pools + st.bytes_arenas + st.bytes_free_pageheap +
                 st.bytes_released;
    if (sum != st.bytes_mapped) FAIL("bytes_mapped %zu != parts %zu", st.bytes_mapped, sum);
    size_t live = 0;
    for (size_t k = 0; k < st.nclasses; k++) live += st.classes[k].in_use * st.classes[k].size;
    if (live + st.bytes_free_tcaches + st.bytes_free_central + st.bytes_span_waste != st.bytes_small_spans)
        FAIL("small spans identity broken");
    if (st.bytes_requested > st.bytes_in_use) FAIL("requested above in use");
    if (!_kp_pageheap_is_valid()) FAIL("page heap invalid");
}

static void heap_free(block *b, int sized) {
    if (!b->p) return;
    check_heap_block(b);
    if (sized) kp_free_sized(b->p, b->size);
    else kp_free(b->p);
    b->p = NULL;
}

static void set_heap(block *b, void *p, size_t size, size_t align, const char *what) {
    if (!p) {
        if (size < ((size_t)1 << 40)) FAIL("%s(%zu) returned NULL", what, size);
        return;
    }
    b->p = p;
    b->size = size;
    b->align = align;
    b->fill = (unsigned char)(next_byte() | 1);
    fill(b);
}

static void op(unsigned code, unsigned arg) {
    block *h = &heap[arg % HEAP_SLOTS];
    int k = arg % POOLS;
    switch (code % 16) {
    case 0: {
        heap_free(h, 1);
        size_t size = pick_size(arg);
        set_heap(h, kp_malloc(size), size, 16, "kp_malloc");
        break;
    }
    case 1: {
        heap_free(h, 1);
        size_t n = next_byte() + 1, sz = pick_size(arg) / n + 1;
        unsigned char *p = kp_calloc(n, sz);
        if (!p) FAIL("kp_calloc returned NULL");
        for (size_t i = 0; i < n * sz; i += 97) if (p[i]) FAIL("kp_calloc memory not zero at %zu", i);
        if (p[n * sz - 1]) FAIL("kp_calloc last byte not zero");
        set_heap(h, p, n * sz, 16, "kp_calloc");
        break;
    }
    case 2: {                                               /* realloc keeps the common prefix */
        if (!h->p) break;
        size_t to = pick_size(arg);
        unsigned char *q = kp_realloc(h->p, to);
        if (!q) FAIL("kp_realloc(%zu) returned NULL", to);
        size_t keep = to < h->size ? to : h->size;
        for (size_t i = 0; i < keep; i += (keep > 4096 ? 331 : 1))
            if (q[i] != h->fill) FAIL("kp_realloc lost byte %zu of %zu", i, keep);
        h->p = q;
        h->size = to;
        h->align = 16;
        fill(h);
        break;
    }
    case 3: {
        heap_free(h, 1);
        size_t align = (size_t)1 << (next_byte() % 22);
        size_t size = pick_size(arg);
        set_heap(h, kp_aligned_alloc(align, size), size, align, "kp_aligned_alloc");
        break;
    }
    case 4: heap_free(h, 0); break;
    case 5: heap_free(h, 1); break;
    case 6:                                                 /* pool create / destroy */
        if (pools[k].pool) {
            for (int i = 0; i < POOL_SLOTS; i++) check_block(&pools[k].b[i], "pool");
            kp_pool_destroy(pools[k].pool);
            memset(&pools[k], 0, sizeof pools[k]);
        } else {
            size_t bs = pick_size(arg) % 70000 + 1, align = (size_t)16 << (next_byte() % 6);
            size_t cap = next_byte() % 3 == 0 ? next_byte() % 20 + 1 : 0;
            pools[k].pool = kp_pool_create(bs, align, cap);
            if (!pools[k].pool) FAIL("kp_pool_create(%zu, %zu, %zu) failed", bs, align, cap);
            pools[k].bs = bs;
        }
        break;
    case 7: case 8: {                                       /* pool alloc / free */
        if (!pools[k].pool) break;
        block *b = &pools[k].b[next_byte() % POOL_SLOTS];
        if (b->p) {
            check_block(b, "pool");
            kp_pool_free(pools[k].pool, b->p);
            b->p = NULL;
        } else if (code % 16 == 7) {
            errno = 0;
            void *p = kp_pool_alloc(pools[k].pool);
            if (!p) {
                if (errno != ENOBUFS) FAIL("kp_pool_alloc failed with errno %d", errno);
                break;
            }
            if (kp_usable_size(p) != kp_pool_block_size(pools[k].pool)) FAIL("pool block usable size");
            b->p = p;
            b->size = pools[k].bs;
            b->align = 0;
            b->fill = (unsigned char)(next_byte() | 1);
            fill(b);
        }
        break;
    }
    case 9:
        if (pools[k].pool) kp_pool_trim(pools[k].pool);
        break;
    case 10: {                                              /* arena alloc */
        if (!arena.arena) arena.arena = kp_arena_create((size_t)(next_byte() % 8 + 1) << 14);
        if (arena.n == ARENA_BLOCKS) break;
        size_t size = pick_size(arg) % 300000, align = (size_t)1 << (next_byte() % 13);
        void *p = kp_arena_alloc(arena.arena, size, align);
        if (!p) FAIL("kp_arena_alloc(%zu, %zu) failed", size, align);
        if (!kp_owns(p)) FAIL("kp_owns of an arena block is 0");
        block *b = &arena.b[arena.n++];
        b->p = p;
        b->size = size;
        b->align = align;
        b->fill = (unsigned char)(next_byte() | 1);
        fill(b);
        break;
    }
    case 11:
        if (arena.arena) {
            for (int i = 0; i < arena.n; i++) check_block(&arena.b[i], "arena");
            kp_arena_reset(arena.arena);
            arena.n = 0;
        }
        break;
    case 12: check_stats(); break;
    case 13: kp_trim(); break;
    case 14: kp_thread_flush(); break;
    default:                                                /* probes of what is not a live block */
        if (h->p && h->size > 16 && kp_usable_size(h->p + 16) != 0) FAIL("usable size inside a block");
        if (kp_owns(&arg) || kp_usable_size(&arg)) FAIL("a stack address is kpool's");
        break;
    }
}

static size_t baseline_in_use, baseline_pools, baseline_arenas;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kp_stats st = { .struct_size = sizeof st };
    kp_stats_get(&st);
    baseline_in_use = st.bytes_in_use;
    baseline_pools = st.bytes_pools;
    baseline_arenas = st.bytes_arenas;
    in = data;
    in_left = size;
    unsigned n = 0;
    while (in_left >= 2) {
        unsigned code = next_byte(), arg = next_byte();
        op(code, arg);
        if (++n % 16 == 0) check_all();
    }
    check_all();
    check_stats();
    for (int i = 0; i < HEAP_SLOTS; i++) heap_free(&heap[i], i & 1);
    for (int k = 0; k < POOLS; k++) {
        if (pools[k].pool) kp_pool_destroy(pools[k].pool);
        memset(&pools[k], 0, sizeof pools[k]);
    }
    if (arena.arena) kp_arena_destroy(arena.arena);
    memset(&arena, 0, sizeof arena);
    kp_stats_get(&st);
    if (st.bytes_in_use != baseline_in_use) FAIL("bytes in use %zu after freeing all, was %zu", st.bytes_in_use, baseline_in_use);
    if (st.bytes_pools != baseline_pools || st.bytes_arenas != baseline_arenas) FAIL("pool or arena bytes left");
    return 0;
}
