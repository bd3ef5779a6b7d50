/* test_preload.c: the C allocation calls as libkpool-malloc.so answers them.
 * Run with LD_PRELOAD=libkpool-malloc.so (make preload-test); the first
 * test fails if the calls do not reach kpool. Checks glibc's semantics
 * where C leaves a choice, foreign (glibc) pointers, threads, fork and
 * dlclose. */
#include "tests/check.h"

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
/* C23's sized frees: glibc 2.36 has none, so they are looked up */
static void (*free_sized)(void *p, size_t size);
static void (*free_aligned_sized)(void *p, size_t alignment, size_t size);

static void *volatile sink;
static volatile size_t half_of_all = SIZE_MAX / 2, nearly_all = SIZE_MAX - 10;  /* opaque to gcc's size checks */   /* keeps the compiler from folding malloc/free pairs */

static void test_the_calls_reach_kpool(void) {
    void *(*volatile fn)(size_t) = malloc;
    Dl_info info;
    CHECK(dladdr((void *)fn, &info) && strstr(info.dli_fname, "libkpool-malloc.so"));
    size_t before = mallinfo2().uordblks;
    char *p = malloc(1000);
    CHECK(p);
    CHECK(mallinfo2().uordblks >= before + 1000);         /* kpool's figures, not glibc's */
    free(p);
    CHECK_EQ(mallinfo2().uordblks, before);
}

/* mallinfo2 with glibc's meanings: large blocks are its mmapped chunks
 * (hblks, hblkhd), outside arena and uordblks; arena = uordblks + fordblks,
 * and it falls when malloc_trim gives memory back. */
static void test_mallinfo2_means_what_glibcs_does(void) {
    struct mallinfo2 a = mallinfo2();
    CHECK_EQ(a.arena, a.uordblks + a.fordblks);
    char *big = malloc(10 << 20);
    memset(big, 1, 10 << 20);
    struct mallinfo2 b = mallinfo2();
    CHECK_EQ(b.hblks, a.hblks + 1);
    CHECK(b.hblkhd >= a.hblkhd + (10 << 20));
    CHECK(b.uordblks < a.uordblks + (1 << 20));             /* not counted twice */
    CHECK_EQ(b.arena, b.uordblks + b.fordblks);
    enum { N = 20000 };
    static char *small[N];
    for (int i = 0; i < N; i++) small[i] = malloc(200);
    struct mallinfo2 c = mallinfo2();
    CHECK(c.uordblks >= b.uordblks + N * 200);
    free(big);
    for (int i = 0; i < N; i++) free(small[i]);
    struct mallinfo2 d = mallinfo2();
    CHECK_EQ(d.hblks, a.hblks);
    CHECK_EQ(d.hblkhd, a.hblkhd);
    CHECK(d.fordblks > a.fordblks);                          /* held free, resident */
    malloc_trim(0);
    struct mallinfo2 e = mallinfo2();
    CHECK(e.arena < d.arena);                                /* given back: not in arena any more */
    CHECK_EQ(e.arena, e.uordblks + e.fordblks);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"   /* mallinfo: exported, so tested */
    struct mallinfo old = mallinfo();
#pragma GCC diagnostic pop
    CHECK_EQ((size_t)old.hblks, e.hblks);
    CHECK_EQ((size_t)old.ordblks, e.ordblks);
}

static void test_zero_sizes_follow_glibc(void) {
    void *a = malloc(0), *b = malloc(0);
    CHECK(a && b && a != b);
    void *c = realloc(NULL, 0);
    CHECK(c != NULL);
    size_t before = mallinfo2().uordblks;
    char *d = malloc(100000);
    errno = 0;
    CHECK(realloc(d, 0) == NULL);                         /* frees d */
    CHECK_EQ(mallinfo2().uordblks, before);
    free(a);
    free(b);
    free(c);
}

static void test_overflow_gives_enomem(void) {
    errno = 0;
    CHECK(calloc(half_of_all, 3) == NULL && errno == ENOMEM);
    char *p = malloc(10);
    strcpy(p, "kept");
    errno = 0;
    CHECK(reallocarray(p, half_of_all, 3) == NULL && errno == ENOMEM);
    CHECK(strcmp(p, "kept") == 0);                        /* untouched */
    errno = 0;
    CHECK(malloc(nearly_all) == NULL && errno == ENOMEM);
    int *q = reallocarray(p, 100, sizeof(int));
    CHECK(q && strcmp((char *)q, "kept") == 0);
    free(q);
}

static void test_aligned_calls(void) {
    void *marker = &marker, *m = marker;
    CHECK_EQ(posix_memalign(&m, 3, 10), EINVAL);
    CHECK_EQ(posix_memalign(&m, 4, 10), EINVAL);         /* not a multiple of sizeof(void *) */
    CHECK(m == marker);
    CHECK_EQ(posix_memalign(&m, 64, nearly_all), ENOMEM);
    CHECK(m == marker);
    errno = 12345;
    for (size_t a = sizeof(void *); a <= (1u << 22); a <<= 1) {
        void *p = NULL;
        CHECK_EQ(posix_memalign(&p, a, 100), 0);
        CHECK(p && (uintptr_t)p % a == 0);
        free(p);
        p = aligned_alloc(a, 3 * a);
        CHECK(p && (uintptr_t)p % a == 0);
        free(p);
    }
    CHECK_EQ(errno, 12345);                               /* success keeps errno */
    errno = 0;
    CHECK(aligned_alloc(24, 48) == NULL && errno == EINVAL);
    char *p = memalign(24, 100);                          /* glibc: rounded up to 32 */
    CHECK(p && (uintptr_t)p % 32 == 0);
    free(p);
    /* glibc: past 2^63 EINVAL; below, rounded up, then no room: ENOMEM */
    errno = 0;
    CHECK(memalign(((size_t)1 << 63) + 1, 100) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(memalign(((size_t)1 << 62) + 1, 100) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(memalign((size_t)1 << 63, 100) == NULL && errno == ENOMEM);
    long page = sysconf(_SC_PAGESIZE);
    p = valloc(10);
    CHECK(p && (uintptr_t)p % (uintptr_t)page == 0);
    free(p);
    p = pvalloc(1);
    CHECK(p && (uintptr_t)p % (uintptr_t)page == 0 && malloc_usable_size(p) >= (size_t)page);
    memset(p, 1, (size_t)page);
    free(p);
}

static void test_free_keeps_errno(void) {
    void *v[64];
    for (int i = 0; i < 64; i++) v[i] = malloc((size_t)(i + 1) * 70000);
    for (int i = 0; i < 64; i++) {
        errno = 777;
        free(v[i]);
        CHECK_EQ(errno, 777);
    }
    errno = 778;
    free(NULL);
    CHECK_EQ(errno, 778);
    errno = 779;
    free(__libc_malloc(10));                              /* foreign */
    CHECK_EQ(errno, 779);
    malloc_trim(0);
}

static void test_usable_size_and_sized_frees(void) {
    free_sized = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    free_aligned_sized = (void (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");
    CHECK(free_sized && free_aligned_sized);
    if (!free_sized || !free_aligned_sized) return;
    CHECK_EQ(malloc_usable_size(NULL), 0);
    for (size_t n = 1; n < 2000000; n = n * 3 + 1) {
        char *p = malloc(n);
        CHECK(malloc_usable_size(p) >= n);
        memset(p, 7, malloc_usable_size(p));
        free_sized(p, n);
    }
    void *a = aligned_alloc(256, 512);
    free_aligned_sized(a, 256, 512);
    size_t before = mallinfo2().uordblks;
    void *b = malloc(300000);
    free_sized(b, 300000);
    CHECK_EQ(mallinfo2().uordblks, before);
}

/* Memory glibc handed out (__libc_malloc: what a library calling glibc
 * directly, or memory from before kpool, looks like) goes back to glibc. */
static void test_foreign_pointers_go_to_glibc(void) {
    char *g = __libc_malloc(100);
    strcpy(g, "from glibc");
    CHECK(malloc_usable_size(g) >= 100);
    char *r = realloc(g, 5000);
    CHECK(r && strcmp(r, "from glibc") == 0);
    free(r);
    g = __libc_malloc(50);
    free_sized(g, 50);
    struct mallinfo2 mi = mallinfo2();
    CHECK(mi.arena >= mi.uordblks);
}

enum { THREADS = 8, ROUNDS = 2000, HELD = 64 };
static void *held[2][THREADS][HELD];   /* [round % 2]: what each thread of a round left */
static int this_round;

/* Frees what the next thread of the previous round left (that thread has
 * exited: its cache is gone), churns, and leaves HELD blocks for the next. */
static void *thread_body(void *arg) {
    int id = (int)(intptr_t)arg, cur = this_round % 2;
    void **from_before = held[!cur][(id + 1) % THREADS], **mine = held[cur][id];
    for (int s = 0; s < HELD; s++) {
        free(from_before[s]);
        from_before[s] = NULL;
    }
    for (int r = 0; r < ROUNDS; r++) {
        char *p = malloc((size_t)(r * 37 % 5000) + 1);
        p[0] = (char)id;
        sink = p;
        free(p);
    }
    for (int s = 0; s < HELD; s++) mine[s] = malloc((size_t)s * 24 + 8);
    return NULL;
}

static void *do_nothing(void *arg) { return arg; }

static void test_threads_that_exit(void) {
    /* glibc keeps exited threads' stacks, and the TLS vectors it calloc'd
     * for them, for reuse: start THREADS once so the count below compares
     * like with like */
    pthread_t t0[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t0[i], NULL, do_nothing, NULL);
    for (int i = 0; i < THREADS; i++) pthread_join(t0[i], NULL);
    size_t before = mallinfo2().uordblks;
    for (this_round = 0; this_round < 4; this_round++) {
        pthread_t t[THREADS];
        for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, thread_body, (void *)(intptr_t)i);
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    }
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < THREADS; i++)
            for (int s = 0; s < HELD; s++) free(held[c][i][s]);
    CHECK_EQ(mallinfo2().uordblks, before);
}

static _Atomic int stop_allocating;

static void *allocate_until_stopped(void *arg) {
    (void)arg;
    while (!stop_allocating) {
        void *p = malloc(200);
        sink = p;
        free(p);
    }
    return NULL;
}

static void test_fork_while_threads_allocate(void) {
    pthread_t t;
    pthread_create(&t, NULL, allocate_until_stopped, NULL);
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (int k = 0; k < 1000; k++) free(malloc((size_t)k * 100 + 1));
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    stop_allocating = 1;
    pthread_join(t, NULL);
}

static void test_dlopen_and_dlclose(void) {
    for (int i = 0; i < 30; i++) {
        void *h = dlopen("libresolv.so.2", RTLD_NOW | RTLD_LOCAL);
        CHECK(h != NULL);
        if (h) dlclose(h);
        char *p = strdup("a string libc allocated through kpool");
        CHECK(p && malloc_usable_size(p) >= strlen(p) + 1);
        free(p);
    }
}

/* C++ in a library loaded with RTLD_LOCAL (as Python loads extension
 * modules): this C program has no libstdc++ of its own, so the plugin's is
 * outside the global scope, where the operators used to look for it (a
 * huge new aborted, and the new_handler was never called). */
static void test_cxx_in_an_rtld_local_library(void) {
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
    CHECK(n > 0);
    if (n <= 0) return;
    path[n] = 0;
    strcpy(strrchr(path, '/') + 1, "test_cxx_plugin.so");
    CHECK(dlsym(RTLD_DEFAULT, "__cxa_throw") == NULL);   /* no libstdc++ in the global scope */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    if (!h) return;
    CHECK(dlsym(RTLD_DEFAULT, "__cxa_throw") == NULL);   /* still none: the plugin's is local */
    int (*huge_new_throws)(void) = (int (*)(void))dlsym(h, "plugin_huge_new_throws");
    int (*nothrow_with_throwing_handler)(void) = (int (*)(void))dlsym(h, "plugin_nothrow_new_with_a_throwing_handler");
    CHECK(huge_new_throws && huge_new_throws() == 1);
    CHECK(nothrow_with_throwing_handler && nothrow_with_throwing_handler() == 1);
    dlclose(h);
}

int main(void) {
    RUN(test_the_calls_reach_kpool);
    RUN(test_mallinfo2_means_what_glibcs_does);
    RUN(test_zero_sizes_follow_glibc);
    RUN(test_overflow_gives_enomem);
    RUN(test_aligned_calls);
    RUN(test_free_keeps_errno);
    RUN(test_usable_size_and_sized_frees);
    if (free_sized) RUN(test_foreign_pointers_go_to_glibc);
    RUN(test_threads_that_exit);
    RUN(test_fork_while_threads_allocate);
    RUN(test_dlopen_and_dlclose);
    RUN(test_cxx_in_an_rtld_local_library);
    return DONE();
}
