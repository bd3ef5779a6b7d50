/* vg_demo.c: what memcheck sees of kpool in a KP_VALGRIND=1 build (`make
 * -C csrc valgrind`; kp_valgrind.h has the scheme). Run as `vg_demo CASE`
 * under valgrind; tests/valgrind/run.sh runs every case and checks
 * memcheck's report against the "expect: " lines the case prints (fixed
 * strings memcheck must print, sizes and addresses filled in).
 *
 *   uaf-small   a write into a freed small block, at offset 0 (the word
 *               kpool keeps its free-list link in), then a read at 20
 *   uaf-large   a read of a freed large block
 *   uaf-pool    a write into a freed pool block
 *   uaf-arena   a read of an arena block after kp_arena_reset
 *   overflow    a write one byte past a block's usable end
 *   uninit      a branch on bytes kp_malloc handed out unwritten
 *   leak        a small and a large kp_malloc block lost
 *   clean       malloc, calloc, realloc (in place and moving: mremap and
 *               copy), aligned, free_sized, pools, arenas, stats, threads,
 *               all used correctly: memcheck must report nothing. It also
 *               checks memcheck's view of each block (VALGRIND_GET_VBITS:
 *               accessible, defined, undefined) after every step.
 * The error cases exit 77 (skip) when not under valgrind.
 */
#include "../check.h"
#include "kp_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <valgrind/memcheck.h>
#include <valgrind/valgrind.h>

/* n with thousands separators, as memcheck prints sizes */
static const char *commas(size_t n) {
    static char bufs[4][32];
    static int which;
    char *out = bufs[which++ % 4], tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%zu", n), o = 0;
    for (int i = 0; i < len; i++) {
        if (i && (len - i) % 3 == 0) out[o++] = ',';
        out[o++] = tmp[i];
    }
    out[o] = 0;
    return out;
}

/* ---- memcheck's view (clean case) ------------------------------------------------ */
/* 0: every byte of [p, p+n) accessible and defined; 1: accessible, all
 * undefined; 2: accessible, mixed; 3: some byte inaccessible. */
static int vbits_state(const void *p, size_t n) {
    static unsigned char bits[1 << 16];
    int state = -1;
    for (size_t off = 0; off < n; off += sizeof bits) {
        size_t k = n - off < sizeof bits ? n - off : sizeof bits;
        if (VALGRIND_GET_VBITS((const char *)p + off, bits, k) != 1) return 3;
        for (size_t i = 0; i < k; i++) {
            int s = bits[i] == 0 ? 0 : bits[i] == 0xff ? 1 : 2;
            if (state < 0) state = s;
            else if (state != s) state = 2;
        }
    }
    return state < 0 ? 0 : state;
}
#define DEFINED(p, n) CHECK(!RUNNING_ON_VALGRIND || vbits_state(p, n) == 0)
#define UNDEFINED(p, n) CHECK(!RUNNING_ON_VALGRIND || vbits_state(p, n) == 1)
/* every one of the n bytes from p inaccessible (checked byte by byte at a
 * few offsets: the first 16, kpool's words in a free block, and the last) */
static int noaccess(const void *p, size_t n) {
    size_t offs[] = { 0, 1, 7, 8, 15, 16, n / 2, n - 1 };
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        unsigned char b;
        if (offs[i] < n && VALGRIND_GET_VBITS((const char *)p + offs[i], &b, 1) != 3) return 0;
    }
    return 1;
}
#define NOACCESS(p, n) CHECK(!RUNNING_ON_VALGRIND || noaccess(p, n))

static unsigned sum(const unsigned char *p, size_t n) {
    unsigned s = 0;
    for (size_t i = 0; i < n; i++) s += p[i];
    return s;
}

static void clean_heap(void) {
    /* malloc: usable bytes accessible and undefined; written ones defined */
    unsigned char *p = kp_malloc(100);
    size_t u = kp_usable_size(p);
    CHECK(p && u >= 100);
    UNDEFINED(p, u);
    memset(p, 1, 100);
    DEFINED(p, 100);
    UNDEFINED(p + 100, u - 100);
    CHECK_EQ(sum(p, 100), 100);
    kp_free(p);
    NOACCESS(p, u);                   /* its first 16 bytes (kpool's link and mark) too */
    /* kp_malloc(0) */
    void *z = kp_malloc(0);
    CHECK(z != NULL);
    kp_free(z);
    /* calloc, small and large */
    unsigned char *c = kp_calloc(10, 10), *cl = kp_calloc(1, (size_t)1 << 20);
    CHECK(c && cl);
    DEFINED(c, 100);
    DEFINED(cl, (size_t)1 << 20);
    CHECK_EQ(sum(c, 100) + sum(cl, (size_t)1 << 20), 0);
    kp_free(c);
    kp_free(cl);
    /* free_sized */
    unsigned char *fs = kp_malloc(200);
    memset(fs, 2, 200);
    kp_free_sized(fs, 200);
    NOACCESS(fs, 200);
    /* aligned, small and large */
    size_t aligns[] = { 32, 64, 4096, (size_t)1 << 20 };
    size_t sizes[] = { 100, 5000, 300000 };
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 3; j++) {
            unsigned char *a = kp_aligned_alloc(aligns[i], sizes[j]);
            CHECK(a && (uintptr_t)a % aligns[i] == 0);
            UNDEFINED(a, kp_usable_size(a));
            memset(a, 3, sizes[j]);
            CHECK_EQ(sum(a, sizes[j]), 3 * sizes[j]);
            kp_free(a);
        }
    }
    /* many blocks of many classes, freed in another order, allocated again */
    enum { N = 2000 };
    static unsigned char *v[N];
    for (int i = 0; i < N; i++) {
        size_t n = 1 + (size_t)(i * 37) % 3000;
        v[i] = kp_malloc(n);
        memset(v[i], i & 0xff, n);
    }
    for (int i = 0; i < N; i += 2) kp_free(v[i]);
    for (int i = 1; i < N; i += 2) {
        size_t n = 1 + (size_t)(i * 37) % 3000;
        CHECK_EQ(sum(v[i], n), (unsigned)(i & 0xff) * n);
        kp_free(v[i]);
    }
    for (int i = 0; i < N; i++) v[i] = kp_malloc(48);
    for (int i = 0; i < N; i++) UNDEFINED(v[i], 48);
    for (int i = 0; i < N; i++) kp_free(v[i]);
}

static void clean_realloc(void) {
    /* small, in place: the bytes written stay defined */
    unsigned char *p = kp_malloc(40);
    size_t u = kp_usable_size(p);
    memset(p, 4, 40);
    unsigned char *q = kp_realloc(p, u);
    CHECK(q == p);
    DEFINED(q, 40);
    UNDEFINED(q + 40, u - 40);
    /* small, moving to a larger class: copied; the old block is freed */
    unsigned char *r = kp_realloc(q, 2000);
    CHECK(r != NULL && r != q);
    DEFINED(r, 40);
    UNDEFINED(r + 40, 2000 - 40);
    NOACCESS(q, u);
    CHECK_EQ(sum(r, 40), 4 * 40);
    r = kp_realloc(r, 0);             /* frees, returns kp_malloc(0)'s pointer */
    kp_free(r);

    /* large, grown in place into the free pages after it */
    kp_trim();
    unsigned char *g = kp_malloc((size_t)300 << 10);
    memset(g, 5, 1000);
    unsigned char *g2 = kp_realloc(g, (size_t)400 << 10);
    CHECK(g2 == g);
    DEFINED(g2, 1000);
    UNDEFINED(g2 + 1000, kp_usable_size(g2) - 1000);
    /* large, moved by mremap: the block behind it is taken */
    unsigned char *behind = kp_malloc((size_t)300 << 10);
    g2[(400 << 10) - 1] = 6;
    size_t old_usable = kp_usable_size(g2);
    unsigned char *m = kp_realloc(g2, (size_t)8 << 20);
    CHECK(m != NULL && m != g2);
    DEFINED(m, 1000);
    UNDEFINED(m + 1000, (400 << 10) - 1 - 1000);
    DEFINED(m + (400 << 10) - 1, 1);
    UNDEFINED(m + old_usable, kp_usable_size(m) - old_usable);
    CHECK_EQ(sum(m, 1000) + m[(400 << 10) - 1], 5 * 1000 + 6);
    /* large, moved by copy: the map for the move fails once */
    unsigned char *x = kp_malloc((size_t)300 << 10), *y = kp_malloc((size_t)300 << 10);
    CHECK(y == x + kp_usable_size(x));  /* x cannot grow in place */
    memset(x, 7, 1000);
    _kp_os_fail_next(1);
    unsigned char *xc = kp_realloc(x, (size_t)4 << 20);
    _kp_os_fail_next(0);
    CHECK(xc != NULL && xc != x);
    DEFINED(xc, 1000);
    UNDEFINED(xc + 1000, (300 << 10) - 1000);
    NOACCESS(x, (size_t)300 << 10);
    CHECK_EQ(sum(xc, 1000), 7 * 1000);
    /* large, shrunk in place: the tail goes back */
    unsigned char *big = kp_malloc((size_t)4 << 20);
    memset(big, 8, (size_t)1 << 20);
    unsigned char *small = kp_realloc(big, (size_t)1 << 20);
    CHECK(small == big);
    CHECK_EQ(kp_usable_size(small), (size_t)1 << 20);
    DEFINED(small, (size_t)1 << 20);
    NOACCESS(small + ((size_t)1 << 20), (size_t)3 << 20);
    /* large to small: copied */
    unsigned char *tiny = kp_realloc(small, 100);
    CHECK(tiny != NULL && tiny != small);
    DEFINED(tiny, 100);
    CHECK_EQ(sum(tiny, 100), 8 * 100);
    /* grown step by step (in place, then moves), contents intact */
    size_t n = (size_t)16 << 10;
    unsigned char *s = kp_malloc(n);
    memset(s, 9, n);
    while (n < ((size_t)4 << 20)) {
        n += (size_t)64 << 10;
        s = kp_realloc(s, n);
        CHECK(s != NULL);
        memset(s + n - ((size_t)64 << 10), 9, (size_t)64 << 10);
    }
    DEFINED(s, n);
    CHECK_EQ(sum(s, n), 9 * n);
    kp_free(s);
    kp_free(tiny);
    kp_free(xc);
    kp_free(y);
    kp_free(m);
    kp_free(behind);
}

static void clean_pools(void) {
    /* bounded: at most 8 live; blocks of block_size, undefined when handed out */
    kp_pool *bp = kp_pool_create(64, 0, 8);
    unsigned char *b[8];
    for (int i = 0; i < 8; i++) {
        b[i] = kp_pool_alloc(bp);
        CHECK(b[i] != NULL);
        UNDEFINED(b[i], 64);
        CHECK(kp_pool_owns(bp, b[i]));    /* reads word 1 of a live, unwritten block: no report */
        memset(b[i], i, 32);
    }
    errno = 0;
    CHECK(kp_pool_alloc(bp) == NULL && errno == ENOBUFS);
    for (int i = 0; i < 8; i++) {
        CHECK_EQ(sum(b[i], 32), (unsigned)i * 32);
        kp_pool_free(bp, b[i]);
        NOACCESS(b[i], 64);
        CHECK(!kp_pool_owns(bp, b[i]));
    }
    for (int i = 0; i < 8; i++) {
        b[i] = kp_pool_alloc(bp);          /* the same blocks again */
        UNDEFINED(b[i], 64);
    }
    kp_pool_stats ps = { .struct_size = sizeof ps };
    CHECK_EQ(kp_pool_stats_get(bp, &ps), 0);
    CHECK_EQ(ps.live, 8);
    kp_pool_destroy(bp);               /* with live blocks: they go too */
    NOACCESS(b[0], 64);

    /* unbounded, thread-cached; trimmed; destroyed empty */
    kp_pool *up = kp_pool_create(100, 32, 0);
    size_t bs = kp_pool_block_size(up);
    enum { N = 1000 };
    static unsigned char *v[N];
    for (int i = 0; i < N; i++) {
        v[i] = kp_pool_alloc(up);
        CHECK(v[i] && (uintptr_t)v[i] % 32 == 0);
        memset(v[i], 1, bs);
    }
    for (int i = 0; i < N; i++) kp_pool_free(up, v[i]);
    for (int i = 0; i < N; i++) v[i] = kp_pool_alloc(up);
    for (int i = 0; i < N; i += 100) UNDEFINED(v[i], bs);
    for (int i = 0; i < N; i++) kp_pool_free(up, v[i]);
    kp_thread_flush();
    kp_pool_trim(up);
    CHECK_EQ(kp_pool_stats_get(up, &ps), 0);
    CHECK_EQ(ps.live, 0);
    kp_pool_destroy(up);
}

static void clean_arenas(void) {
    kp_arena *a = kp_arena_create(64 << 10);
    size_t sizes[] = { 10, 100, 5000, 0, (size_t)1 << 20, 33 };
    size_t aligns[] = { 0, 64, 4096, 0, 0, 2 };
    unsigned char *p[6];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 6; i++) {
            p[i] = kp_arena_alloc(a, sizes[i], aligns[i]);
            CHECK(p[i] != NULL);
            CHECK(aligns[i] == 0 || (uintptr_t)p[i] % aligns[i] == 0);
            size_t n = sizes[i] ? sizes[i] : 1;
            UNDEFINED(p[i], n);
            memset(p[i], i, n);
        }
        for (int i = 0; i < 6; i++) CHECK_EQ(sum(p[i], sizes[i]), (unsigned)i * sizes[i]);
        CHECK(kp_arena_used(a) > 0);
        kp_arena_reset(a);
        for (int i = 0; i < 6; i++) NOACCESS(p[i], sizes[i] ? sizes[i] : 1);
    }
    p[0] = kp_arena_alloc(a, 200, 0);
    memset(p[0], 1, 200);
    kp_arena_destroy(a);
    NOACCESS(p[0], 200);
}

static void clean_stats(void) {
    kp_stats st = { .struct_size = sizeof st };
    CHECK_EQ(kp_stats_get(&st), 0);
    CHECK(st.bytes_mapped > 0);
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
        kp_stats_print(devnull);
        fclose(devnull);
    }
    kp_stats_reset();
    kp_trim();
}

/* Two threads: each allocates, the other frees (cross-thread frees through
 * the central lists), then each exits (its cache is given back). */
enum { XN = 3000 };
static unsigned char *xfer[2][XN];
static pthread_barrier_t xbar;
static void *xthread(void *arg) {
    int me = (int)(intptr_t)arg;
    for (int i = 0; i < XN; i++) {
        size_t n = 16 + (size_t)(i * 53) % 2000;
        xfer[me][i] = kp_malloc(n);
        memset(xfer[me][i], me + 1, n);
    }
    pthread_barrier_wait(&xbar);
    unsigned bad = 0;
    for (int i = 0; i < XN; i++) {
        size_t n = 16 + (size_t)(i * 53) % 2000;
        bad += sum(xfer[1 - me][i], n) != (unsigned)(2 - me) * n;
        kp_free(xfer[1 - me][i]);
    }
    return (void *)(uintptr_t)bad;
}
static void clean_threads(void) {
    pthread_t t[2];
    pthread_barrier_init(&xbar, NULL, 2);
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, xthread, (void *)(intptr_t)i);
    for (int i = 0; i < 2; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        CHECK(bad == NULL);
    }
    pthread_barrier_destroy(&xbar);
}

static int run_clean(void) {
    RUN(clean_heap);
    RUN(clean_realloc);
    RUN(clean_pools);
    RUN(clean_arenas);
    RUN(clean_threads);
    RUN(clean_stats);
    printf("under valgrind: %s\n", RUNNING_ON_VALGRIND ? "yes" : "no (the memcheck state checks were skipped)");
    return DONE();
}

/* ---- the errors ----------------------------------------------------------------- */
static void expect_block(const char *access, size_t size, const void *p, const void *block, size_t block_size,
                         const char *how) {
    printf("expect: Invalid %s of size %zu\n", access, size);
    printf("expect: Address %p is %s bytes inside a block of size %s %s\n", p,
           commas((size_t)((const char *)p - (const char *)block)), commas(block_size), how);
}

static int run_uaf_small(void) {
    unsigned char *p = kp_malloc(40);
    size_t u = kp_usable_size(p);
    memset(p, 1, 40);
    kp_free(p);
    *(volatile uint64_t *)p = 0x4141414141414141u;   /* kpool's link word: memcheck sees it */
    expect_block("write", 8, p, p, u, "free'd");
    volatile unsigned char c = p[20];
    (void)c;
    expect_block("read", 1, p + 20, p, u, "free'd");
    printf("expect: run_uaf_small (vg_demo.c:\n");
    return 0;                          /* (no allocation of that class follows: the damaged link stays unused) */
}

static int run_uaf_large(void) {
    size_t n = (size_t)1 << 20;
    unsigned char *p = kp_malloc(n);
    memset(p, 1, n);
    kp_free(p);
    volatile unsigned char c = p[4096];
    (void)c;
    expect_block("read", 1, p + 4096, p, n, "free'd");
    printf("expect: run_uaf_large (vg_demo.c:\n");
    return 0;
}

static int run_uaf_pool(void) {
    kp_pool *pool = kp_pool_create(64, 0, 0);
    unsigned char *p = kp_pool_alloc(pool);
    memset(p, 1, 64);
    kp_pool_free(pool, p);
    p[32] = 2;
    expect_block("write", 1, p + 32, p, 64, "free'd");
    kp_pool_destroy(pool);
    return 0;
}

static int run_uaf_arena(void) {
    kp_arena *a = kp_arena_create(0);
    unsigned char *p = kp_arena_alloc(a, 100, 0);
    memset(p, 1, 100);
    kp_arena_reset(a);
    volatile unsigned char c = p[50];
    (void)c;
    printf("expect: Invalid read of size 1\n");
    kp_arena_destroy(a);
    return 0;
}

static int run_overflow(void) {
    unsigned char *p = kp_malloc(48);
    size_t u = kp_usable_size(p);
    memset(p, 1, u);                   /* every usable byte is the program's */
    p[u] = 1;                          /* one past: a slot never handed out */
    printf("expect: Invalid write of size 1\n");
    printf("expect: Address %p is 0 bytes after a block of size %s alloc'd\n", (void *)(p + u), commas(u));
    kp_free(p);
    return 0;
}

static int run_uninit(void) {
    unsigned char *p = kp_malloc(64);
    p[0] = 1;
    if (p[10] == 42) puts("p[10] is 42");
    printf("expect: Conditional jump or move depends on uninitialised value(s)\n");
    kp_free(p);
    return 0;
}

/* The pointers die here: nothing of the caller's holds them. */
static __attribute__((noinline)) size_t leak_small(void) {
    unsigned char *p = kp_malloc(777);
    memset(p, 1, 777);
    return kp_usable_size(p);
}
static __attribute__((noinline)) size_t leak_large(void) {
    unsigned char *p = kp_malloc(300000);
    memset(p, 1, 300000);
    return kp_usable_size(p);
}
static __attribute__((noinline)) void scrub_stack(void) {
    volatile char junk[4096];
    memset((char *)junk, 0, sizeof junk);
}

static int run_leak(void) {
    /* Not the heap's first span: os.c's metadata cursor may end where that
     * span starts, and memcheck would take it for a pointer to the first
     * block (kp_valgrind.h: Leaks). */
    kp_free(kp_malloc(16));
    size_t s = leak_small(), l = leak_large();
    scrub_stack();
    printf("expect: %s bytes in 1 blocks are definitely lost\n", commas(s));
    printf("expect: %s bytes in 1 blocks are definitely lost\n", commas(l));
    printf("expect: by 0x\n");
    printf("expect: leak_small (vg_demo.c:\n");
    printf("expect: leak_large (vg_demo.c:\n");
    return 0;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "clean";
    if (strcmp(what, "clean") == 0) return run_clean();
    if (!RUNNING_ON_VALGRIND) {
        printf("%s: not under valgrind, skipped\n", what);
        return 77;
    }
    static const struct { const char *name; int (*fn)(void); } cases[] = {
        { "uaf-small", run_uaf_small }, { "uaf-large", run_uaf_large }, { "uaf-pool", run_uaf_pool },
        { "uaf-arena", run_uaf_arena }, { "overflow", run_overflow },   { "uninit", run_uninit },
        { "leak", run_leak },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(what, cases[i].name) == 0) {
            int rc = cases[i].fn();
            fflush(stdout);
            return rc;
        }
    fprintf(stderr, "vg_demo: unknown case %s\n", what);
    return 2;
}
