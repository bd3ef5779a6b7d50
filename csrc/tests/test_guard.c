/* test_guard.c: KPOOL_GUARD=N guard sampling. The program runs itself again
 * with KPOOL_GUARD set (kpool reads it at start-up). With N=1 every
 * allocation ends at an inaccessible page: a write past its usable size
 * (its 16-byte rounding, or its class size where that is a power of two,
 * for the alignment) faults at once and kpool names the block, a use after
 * free faults, a fault elsewhere reaches the program's own handler, and
 * everything else works as usual. With N=4 one allocation in four is
 * guarded. */
#include "check.h"
#include "kp_internal.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* What a child does to a block. */
enum misuse { WRITE_PAST, READ_PAST, USE_AFTER_FREE, FAULT_ELSEWHERE };

/* In a child: allocate size bytes and commit `how`, `past` bytes beyond
 * the block's usable end for the first two. The child's stderr comes back
 * in out. Returns the child's wait status. */
static int misuse_in_child(enum misuse how, size_t size, size_t past, char *out, size_t cap) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        char *p = kp_malloc(size);
        memset(p, 1, size);                      /* inside: fine */
        volatile char *v = p;
        switch (how) {
        case WRITE_PAST: v[kp_usable_size(p) - 1 + past] = 2; break;
        case READ_PAST: if (v[kp_usable_size(p) - 1 + past] == 7) _exit(3); break;
        case USE_AFTER_FREE: kp_free(p); v[0] = 3; break;
        case FAULT_ELSEWHERE:                    /* a page that is not kpool's */
            v = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            v[0] = 4;
            break;
        }
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

/* A SIGSEGV handler the program had before kpool's: it is chained to for
 * faults that are not on a guard page. */
static void program_handler(int sig) {
    (void)sig;
    _exit(42);
}
__attribute__((constructor(101))) static void before_kpool(void) {
    if (getenv("KPOOL_GUARD")) signal(SIGSEGV, program_handler);
}

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SKIP_UNDER_SANITIZERS() do { printf("     skipped: the sanitizer handles SIGSEGV itself\n"); return; } while (0)
#else
#define SKIP_UNDER_SANITIZERS() do {} while (0)
#endif

static void test_an_overflow_faults_at_once_and_names_the_block(void) {
    SKIP_UNDER_SANITIZERS();
    size_t sizes[] = { 24, 100, 4000, 300000 };
    for (int how = WRITE_PAST; how <= READ_PAST; how++)
        for (int i = 0; i < 4; i++) {
            char out[512];
            int status = misuse_in_child(how, sizes[i], 1, out, sizeof out);   /* the first byte past it */
            CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
            CHECK(strstr(out, "KPOOL_GUARD caught an access") != NULL);
            CHECK(strstr(out, "past the end of a block of") != NULL);
            char want[64];
            snprintf(want, sizeof want, "block of %zu bytes", sizes[i]);
            CHECK(strstr(out, want) != NULL);
            if (i == 0 && how == WRITE_PAST) printf("     %s", out);
        }
}

static void test_a_use_after_free_faults(void) {
    SKIP_UNDER_SANITIZERS();
    char out[512];
    int status = misuse_in_child(USE_AFTER_FREE, 100, 0, out, sizeof out);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42);   /* it faulted: the pages went back to the OS */
}

static void test_other_faults_go_to_the_programs_handler(void) {
    SKIP_UNDER_SANITIZERS();
    char out[512];
    int status = misuse_in_child(FAULT_ELSEWHERE, 100, 0, out, sizeof out);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42);
    CHECK(strstr(out, "KPOOL_GUARD") == NULL);
}

static void test_one_allocation_in_n_is_guarded(void) {
    unsigned every = (unsigned)atoi(getenv("KPOOL_GUARD"));
    enum { N = 400 };
    void *v[N];
    unsigned guarded = 0;
    for (int i = 0; i < N; i++) {
        v[i] = kp_malloc(i % 2 ? 48 : 400000);
        kp_span *s = _kp_span_of(v[i]);
        guarded += s && s->guarded;
    }
    for (int i = 0; i < N; i++) kp_free(v[i]);
    printf("     KPOOL_GUARD=%u: %u of %d guarded\n", every, guarded, N);
    CHECK_EQ(guarded, N / every);
}

static void test_guarded_blocks_work_like_any_other(void) {
    enum { N = 300 };
    char *v[N];
    kp_stats st = { .struct_size = sizeof st };
    kp_stats_get(&st);
    CHECK_EQ(st.tcaches_unavailable, 1);           /* every allocation takes the sampling path */
    size_t in_use = st.bytes_in_use;
    for (int i = 0; i < N; i++) {
        size_t size = 1 + (size_t)i * 997 % 70000;
        v[i] = kp_malloc(size);
        CHECK(v[i] && ((uintptr_t)v[i] & 15) == 0);
        CHECK(kp_usable_size(v[i]) >= size && kp_owns(v[i]));
        memset(v[i], i & 0xff, size);
        v[i] = kp_realloc(v[i], size + 5000);
        CHECK(v[i] && (unsigned char)v[i][size - 1] == (i & 0xff));
    }
    char *a = kp_aligned_alloc(4096, 100);
    CHECK(a && ((uintptr_t)a & 4095) == 0);
    kp_free(a);
    unsigned char *z = kp_calloc(10, 1000);
    int zero = 1;
    for (int i = 0; i < 10000; i++) zero &= z[i] == 0;
    CHECK(zero);
    kp_free(z);
    kp_stats_get(&st);
    size_t sum = st.bytes_small_spans + st.bytes_meshed + st.bytes_large + st.bytes_pools + st.bytes_arenas + st.bytes_free_pageheap +
                 st.bytes_released;
    CHECK_EQ(sum, st.bytes_mapped);
    for (int i = 0; i < N; i++) kp_free(v[i]);
    kp_stats_get(&st);
    CHECK_EQ(st.bytes_in_use, in_use);
    CHECK(_kp_pageheap_is_valid());
}

int main(int argc, char **argv) {
    (void)argc;
    if (!getenv("KPOOL_GUARD")) {                  /* run again with sampling on */
        for (int every = 1; every <= 4; every += 3) {
            pid_t pid = fork();
            if (pid == 0) {
                char n[16];
                snprintf(n, sizeof n, "%d", every);
                setenv("KPOOL_GUARD", n, 1);
                execv(argv[0], argv);
                _exit(127);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
        }
        printf("KPOOL_GUARD=1 and 4: all passed\n");
        return 0;
    }
    printf("KPOOL_GUARD=%s\n", getenv("KPOOL_GUARD"));
    if (strcmp(getenv("KPOOL_GUARD"), "1") == 0) {
        RUN(test_an_overflow_faults_at_once_and_names_the_block);
        RUN(test_a_use_after_free_faults);
        RUN(test_other_faults_go_to_the_programs_handler);
    }
    RUN(test_one_allocation_in_n_is_guarded);
    RUN(test_guarded_blocks_work_like_any_other);
    return DONE();
}
