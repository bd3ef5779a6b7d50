/* fuzz_misuse.c: libFuzzer harness for misuse, with an error handler that
 * returns. Each input mixes valid operations with double frees (also long
 * after the first free), frees of foreign and stack pointers, interior
 * pointers of large blocks, blocks given to the wrong pool or to kp_free,
 * kp_realloc of non-blocks and kp_free_sized with a wrong size that kpool.h
 * allows. Every misuse must reach the handler (the ones a release build
 * detects) and change nothing: live blocks keep their contents, no block is
 * handed out twice (a new block never overlaps a live one), pools keep
 * their capacity, and the heap's invariants hold.
 * Build: make -C csrc fuzz.
 */
#include "kp_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include "input.h"

#define SLOTS 32
#define FAIL(...) do { fprintf(stderr, "fuzz_misuse: " __VA_ARGS__); fprintf(stderr, "\n"); abort(); } while (0)

typedef struct { unsigned char *p; size_t size; unsigned char fill; } block;

static block live[SLOTS];
static void *freed[SLOTS];          /* blocks freed earlier: double-free candidates */
static unsigned nfreed;
static kp_pool *pool_a, *pool_b;     /* pool_b is bounded */
static block pa[SLOTS], pb[SLOTS];
static int reports;

static void counting_handler(const char *call, const void *ptr, const char *what) {
    (void)call, (void)ptr, (void)what;
    reports++;
}


static size_t pick_size(void) {
    unsigned x = next_byte();
    switch (x % 4) {
    case 0: return next_byte();
    case 1: return (size_t)next_byte() * 64 + 16;
    case 2: return KP_SMALL_MAX + (size_t)next_byte() * 4096;
    default: return (size_t)16 << (next_byte() % 12);
    }
}

/* A new block must not overlap any live one. */
static void check_fresh(const unsigned char *p, size_t size) {
    for (int i = 0; i < SLOTS; i++) {
        const block *b[3] = { &live[i], &pa[i], &pb[i] };
        for (int k = 0; k < 3; k++)
            if (b[k]->p && p < b[k]->p + (b[k]->size ? b[k]->size : 1) && b[k]->p < p + (size ? size : 1))
                FAIL("block %p handed out while %p is live", (const void *)p, (const void *)b[k]->p);
    }
}

static void check_live(void) {
    for (int i = 0; i < SLOTS; i++) {
        const block *b[3] = { &live[i], &pa[i], &pb[i] };
        for (int k = 0; k < 3; k++)
            for (size_t j = 0; b[k]->p && j < b[k]->size; j += 61)
                if (b[k]->p[j] != b[k]->fill) FAIL("live block %p damaged by a misuse", (void *)b[k]->p);
    }
    if (!_kp_pageheap_is_valid()) FAIL("page heap invalid");
}

static void give(block *b, void *p, size_t size) {
    check_fresh(p, size);
    b->p = p;
    b->size = size;
    b->fill = (unsigned char)(next_byte() | 1);
    memset(p, b->fill, size);
}

static void remember_freed(void *p) { freed[nfreed++ % SLOTS] = p; }

static int overlaps_live(const unsigned char *p) {
    for (int i = 0; i < SLOTS; i++) {
        const block *b[3] = { &live[i], &pa[i], &pb[i] };
        for (int k = 0; k < 3; k++)
            if (b[k]->p && p >= b[k]->p && p < b[k]->p + (b[k]->size ? b[k]->size : 1)) return 1;
    }
    return 0;
}

/* p, freed earlier, is still the start of a free small block: not handed
 * out again, and its page still holds blocks of a size p starts one of
 * (else a free of p is an interior pointer, which only KP_DEBUG catches). */
static int still_a_free_block(const unsigned char *p) {
    if (overlaps_live(p)) return 0;
    unsigned cls = _kp_pagemap_class(p);
    if (cls == 0 || cls >= KP_NUM_CLASSES) return 0;
    kp_span *s = _kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT);
    if (!s || s->state != KP_SPAN_SMALL) return 0;
    size_t off = (uintptr_t)p - (s->start << KP_PAGE_SHIFT);
    /* a slot the span never carved is not a block (only KP_DEBUG catches it) */
    return off % _kp_classes[cls].size == 0 && off / _kp_classes[cls].size < s->carved;
}

/* A misuse that must be reported. */
static void expect_report(int before, const char *what) {
    if (reports == before) FAIL("%s was not reported", what);
}

static void step(unsigned code) {
    block *b = &live[next_byte() % SLOTS];
    int before = reports;
    switch (code % 12) {
    case 0: {
        if (b->p) break;
        size_t size = pick_size();
        void *p = kp_malloc(size);
        if (!p) FAIL("kp_malloc(%zu) failed", size);
        give(b, p, size);
        break;
    }
    case 1:
        if (!b->p) break;
        kp_free_sized(b->p, b->size);
        remember_freed(b->p);
        b->p = NULL;
        break;
    case 2: {                               /* a double free of a block freed earlier, if not reused */
        void *p = nfreed ? freed[next_byte() % (nfreed < SLOTS ? nfreed : SLOTS)] : NULL;
        if (!p || !still_a_free_block(p)) break;
        kp_free(p);
        expect_report(before, "a double free");
        break;
    }
    case 3: {                               /* foreign and stack pointers */
        int local;
        void *libc = malloc(64);
        kp_free(&local);
        kp_free(libc);
        free(libc);
        if (reports != before + 2) FAIL("a foreign free was not reported");
        break;
    }
    case 4:                                 /* inside a large block */
        if (b->p && b->size > KP_SMALL_MAX + 16) {
            kp_free(b->p + 16);
            expect_report(before, "a free inside a large block");
        }
        break;
    case 5: {                               /* pool blocks where they do not belong */
        block *x = &pa[next_byte() % SLOTS];
        if (!x->p) {
            void *p = kp_pool_alloc(pool_a);
            if (p) give(x, p, 200);
            break;
        }
        kp_pool_free(pool_b, x->p);
        expect_report(before, "a block freed to the wrong pool");
        int r = reports;
        kp_free(x->p);
        expect_report(r, "a pool block given to kp_free");
        r = reports;
        if (kp_realloc(x->p, 10) != NULL) FAIL("kp_realloc of a pool block did something");
        expect_report(r, "kp_realloc of a pool block");
        break;
    }
    case 6: {                               /* the bounded pool keeps its capacity */
        block *x = &pb[next_byte() % SLOTS];
        if (x->p) {
            kp_pool_free(pool_b, x->p);
            void *again = x->p;
            x->p = NULL;
            int r = reports;
            kp_pool_free(pool_b, again);
            expect_report(r, "a pool double free");
        } else {
            errno = 0;
            void *p = kp_pool_alloc(pool_b);
            if (p) give(x, p, 64);
            else if (errno != ENOBUFS) FAIL("bounded pool alloc failed with errno %d", errno);
            kp_pool_stats st = { .struct_size = sizeof st };
            kp_pool_stats_get(pool_b, &st);
            if (st.live > 7) FAIL("bounded pool of 7 has %zu live blocks", st.live);
        }
        break;
    }
    case 7: {                               /* kp_realloc of a freed large block */
        void *p = nfreed ? freed[next_byte() % (nfreed < SLOTS ? nfreed : SLOTS)] : NULL;
        if (!p || kp_owns(p)) break;
        int owned = 0;
        for (int i = 0; i < SLOTS; i++) owned |= live[i].p == p;
        if (owned) break;
        if (kp_realloc(p, 100) != NULL) FAIL("kp_realloc of a freed block returned a block");
        break;
    }
    case 8:                                 /* a wrong size within what kpool.h allows */
        if (b->p) {
            kp_free_sized(b->p, kp_usable_size(b->p));
            remember_freed(b->p);
            b->p = NULL;
        }
        break;
    case 9: kp_trim(); break;
    case 10: kp_thread_flush(); break;
    default: check_live(); break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kp_set_error_handler(counting_handler);
    if (!pool_a) {
        pool_a = kp_pool_create(200, 0, 0);
        pool_b = kp_pool_create(64, 0, 7);
    }
    in = data;
    in_left = size;
    nfreed = 0;
    while (in_left) step(next_byte());
    check_live();
    for (int i = 0; i < SLOTS; i++) {
        if (live[i].p) kp_free(live[i].p);
        if (pa[i].p) kp_pool_free(pool_a, pa[i].p);
        if (pb[i].p) kp_pool_free(pool_b, pb[i].p);
        live[i].p = pa[i].p = pb[i].p = NULL;
    }
    kp_pool_stats st = { .struct_size = sizeof st };
    kp_pool_stats_get(pool_b, &st);
    if (st.live != 0) FAIL("bounded pool has %zu live blocks after all were freed", st.live);
    return 0;
}
