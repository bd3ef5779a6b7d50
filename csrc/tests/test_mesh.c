/* test_mesh.c: meshing (mesh.c) keeps every block's contents and address,
 * gives physical pages back, never hands a slot out twice, survives writers
 * that write during the mesh, and fork.
 *
 * Meshing is turned on by the hidden _kp_mesh_start (the tests link the
 * static library), as KPOOL_MESH=1 does at start-up. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kpool.h"
#include "check.h"

int _kp_mesh_start(void);
int _kp_central_is_valid(unsigned cls);
int _kp_pageheap_is_valid(void);
uint64_t _kp_mesh_fault_waits(void);
void _kp_mesh_figures(size_t *bytes_meshed, uint64_t *meshes);
void _kp_mesh_fail_next(int kind, int n);
size_t _kp_mesh_budget(size_t members);
enum { FAIL_FILE, FAIL_MOVE, FAIL_ANON };   /* kp_internal.h's KP_MESH_FAIL_* */

/* Proportional resident bytes (smaps_rollup's Pss): a page mapped at two
 * addresses counts once, as it costs once. */
static long pss_bytes(void) {
    char buf[4096];
    int fd = open("/proc/self/smaps_rollup", O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strstr(buf, "\nPss:");
    return p ? strtol(p + 5, NULL, 10) * 1024 : -1;
}

static uint64_t rng_state = 88172645463325252u;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void fill(void *p, size_t n, uint64_t tag) {
    uint64_t *w = p;
    for (size_t i = 0; i < n / 8; i++) w[i] = tag * 0x9e3779b97f4a7c15u + i;
}
static int intact(const void *p, size_t n, uint64_t tag) {
    const uint64_t *w = p;
    for (size_t i = 0; i < n / 8; i++)
        if (w[i] != tag * 0x9e3779b97f4a7c15u + i) return 0;
    return 1;
}

static int all_valid(void) {
    for (unsigned c = 1; c < 129; c++)
        if (!_kp_central_is_valid(c)) return 0;
    return _kp_pageheap_is_valid();
}

static kp_stats stats_now(void) {
    kp_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    kp_stats_get(&st);
    return st;
}

/* n blocks of size bytes, each filled; keep one in ten (*kept), free the rest. */
static void **sparse(size_t n, size_t size, size_t *kept) {
    void **all = malloc(n * sizeof *all);
    for (size_t i = 0; i < n; i++) {
        all[i] = kp_malloc(size);
        fill(all[i], size, (uintptr_t)all[i]);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (rnd() % 10 == 0) all[k++] = all[i];
        else kp_free(all[i]);
    }
    *kept = k;
    return all;
}

static void test_off_until_started(void) {
    size_t k;
    void **b = sparse(20000, 128, &k);
    kp_trim();
    kp_stats st = stats_now();
    CHECK_EQ(st.version, 3);
    CHECK_EQ(st.meshes, 0);
    CHECK_EQ(st.bytes_meshed, 0);
    for (size_t i = 0; i < k; i++) kp_free(b[i]);
    free(b);
    kp_trim();
}

static void test_mesh_keeps_blocks_and_gives_pages_back(void) {
    const size_t sizes[] = { 64, 128, 256, 496 };
    void **b[4];
    size_t k[4];
    for (int s = 0; s < 4; s++) b[s] = sparse(40000, sizes[s], &k[s]);
    kp_thread_flush();
    long before = pss_bytes();
    kp_stats st0 = stats_now();
    size_t given = kp_trim();
    kp_stats st = stats_now();
    long after = pss_bytes();
    printf("  meshed %llu spans, %zu bytes; Pss %ld -> %ld KiB; kp_trim returned %zu\n",
           (unsigned long long)(st.meshes - st0.meshes), st.bytes_meshed, before / 1024, after / 1024, given);
    size_t meshed = st.bytes_meshed - st0.bytes_meshed;   /* the decay path may have meshed some before */
    CHECK(st.meshes > st0.meshes);
    CHECK(meshed > 0);
    CHECK(given >= meshed);
    CHECK(before - after > (long)meshed / 2);          /* the pages really went back */
    CHECK_EQ(st.bytes_mapped, st.bytes_small_spans + st.bytes_meshed + st.bytes_large + st.bytes_pools +
                              st.bytes_arenas + st.bytes_free_pageheap + st.bytes_released);
    CHECK(all_valid());
    int ok = 1;
    for (int s = 0; s < 4; s++)
        for (size_t i = 0; i < k[s]; i++) ok &= intact(b[s][i], sizes[s], (uintptr_t)b[s][i]) &&
                                             kp_usable_size(b[s][i]) == sizes[s] && kp_owns(b[s][i]);
    CHECK(ok);

    /* New blocks come from the groups' free slots: none may overlap a live one. */
    void **fresh[4];
    size_t nfresh = 20000;
    for (int s = 0; s < 4; s++) {
        fresh[s] = malloc(nfresh * sizeof(void *));
        for (size_t i = 0; i < nfresh; i++) {
            fresh[s][i] = kp_malloc(sizes[s]);
            fill(fresh[s][i], sizes[s], (uintptr_t)fresh[s][i] ^ 1);
        }
    }
    ok = 1;
    for (int s = 0; s < 4; s++) {
        for (size_t i = 0; i < k[s]; i++) ok &= intact(b[s][i], sizes[s], (uintptr_t)b[s][i]);
        for (size_t i = 0; i < nfresh; i++) ok &= intact(fresh[s][i], sizes[s], (uintptr_t)fresh[s][i] ^ 1);
    }
    CHECK(ok);
    for (int s = 0; s < 4; s++) {
        for (size_t i = 0; i < nfresh; i++) kp_free(fresh[s][i]);
        for (size_t i = 0; i < k[s]; i++) kp_free(b[s][i]);
        free(fresh[s]);
        free(b[s]);
    }
    kp_trim();
    st = stats_now();
    CHECK_EQ(st.bytes_meshed, 0);                 /* every group dissolved with its last block */
    CHECK(all_valid());
}

/* Without kp_trim: the slow paths mesh, at most every KP_MESH_PERIOD_MS. */
static void test_decay_path_meshes(void) {
    size_t k;
    void **b = sparse(60000, 128, &k);
    kp_thread_flush();
    kp_stats st0 = stats_now();
    void *other[20000];
    for (int round = 0; round < 5 && stats_now().meshes == st0.meshes; round++) {
        usleep(120 * 1000);
        for (int i = 0; i < 20000; i++) other[i] = kp_malloc(1024);   /* refills: the slow path */
        for (int i = 0; i < 20000; i++) kp_free(other[i]);
    }
    CHECK(stats_now().meshes > st0.meshes);
    int ok = 1;
    for (size_t i = 0; i < k; i++) ok &= intact(b[i], 128, (uintptr_t)b[i]);
    CHECK(ok);
    for (size_t i = 0; i < k; i++) kp_free(b[i]);
    free(b);
    kp_trim();
    CHECK_EQ(stats_now().bytes_meshed, 0);
}

/* Writers keep writing into their blocks (and checking what they read back)
 * while the main thread meshes the spans those blocks are in. */
#define WRITERS 3
typedef struct writer {
    pthread_t thread;
    void **blocks;
    size_t n;
    _Atomic int go, stop;
    _Atomic uint64_t writes;
    int lost;
} writer;

static void *write_constantly(void *arg) {
    writer *w = arg;
    uint64_t v = 1;
    while (!atomic_load(&w->stop)) {
        if (!atomic_load(&w->go)) continue;
        for (size_t i = 0; i < w->n; i++) {
            volatile uint64_t *p = w->blocks[i];
            p[0] = v;
            p[1] = ~v;
            if (p[0] != v || p[1] != ~v) w->lost++;
        }
        atomic_fetch_add(&w->writes, 1);
        v++;
        for (size_t i = 0; i < w->n; i++) {
            volatile uint64_t *p = w->blocks[i];
            if (p[0] != v - 1 || p[1] != ~(v - 1)) w->lost++;
        }
    }
    return NULL;
}

static void test_writers_during_mesh(void) {
    uint64_t waits0 = _kp_mesh_fault_waits();
    /* 4 rounds, more (up to 20) until a write has met a window: how often
     * one does depends on the scheduler (a few a run under TSan). */
    for (int round = 0; round < 4 || (round < 20 && _kp_mesh_fault_waits() == waits0); round++) {
        size_t k;
        void **b = sparse(30000, 128, &k);
        kp_thread_flush();
        writer w[WRITERS];
        for (int t = 0; t < WRITERS; t++) {
            memset(&w[t], 0, sizeof w[t]);
            w[t].blocks = b + t * (k / WRITERS);
            w[t].n = k / WRITERS;
            pthread_create(&w[t].thread, NULL, write_constantly, &w[t]);
            atomic_store(&w[t].go, 1);
        }
        for (int t = 0; t < WRITERS; t++)
            while (atomic_load(&w[t].writes) < 2) {}
        kp_stats st0 = stats_now();
        kp_trim();
        kp_stats st = stats_now();
        CHECK(st.meshes > st0.meshes);
        for (int t = 0; t < WRITERS; t++) {
            uint64_t at = atomic_load(&w[t].writes);
            while (atomic_load(&w[t].writes) < at + 2) {}
            atomic_store(&w[t].stop, 1);
            pthread_join(w[t].thread, NULL);
            CHECK_EQ(w[t].lost, 0);
        }
        CHECK(all_valid());
        for (size_t i = 0; i < k; i++) kp_free(b[i]);
        free(b);
        kp_trim();
        CHECK_EQ(stats_now().bytes_meshed, 0);
    }
    printf("  %llu writes waited for a mesh window\n", (unsigned long long)(_kp_mesh_fault_waits() - waits0));
    CHECK(_kp_mesh_fault_waits() > waits0);       /* the writers did write during meshing */
}

/* Random allocations and frees in three classes by two threads (half of
 * each one's frees are of the other's blocks, through a shared exchange),
 * while a third thread meshes without pause: every live block keeps its
 * stamp, and none overlaps another. */
#define CHURN_LIVE 40000
#define CHURN_OPS 300000
typedef struct churner {
    pthread_t thread;
    uint64_t rng;
    void *live[CHURN_LIVE];
    size_t size[CHURN_LIVE];
    int bad;
} churner;
static _Atomic(void *) exchange[1024];
static _Atomic size_t exchange_size[1024];
static _Atomic int churn_stop;
static pthread_barrier_t churn_barrier;

static uint64_t next_rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *churn(void *arg) {
    churner *c = arg;
    static const size_t sizes[3] = { 48, 160, 320 };
    for (int op = 0; op < CHURN_OPS; op++) {
        if (op % 4096 == 0) kp_thread_flush();       /* cached free blocks count as live to the mesher */
        uint64_t r = next_rnd(&c->rng);
        size_t i = r % CHURN_LIVE;
        if (c->live[i]) {
            if (!intact(c->live[i], c->size[i], (uintptr_t)c->live[i])) c->bad++;
            if (r >> 40 & 1) {                        /* hand it to the other thread */
                size_t e = (r >> 20) % 1024;
                atomic_store(&exchange_size[e], c->size[i]);
                void *old = atomic_exchange(&exchange[e], c->live[i]);
                if (old) kp_free(old);
            } else {
                kp_free(c->live[i]);
            }
            c->live[i] = NULL;
        } else if ((r >> 41 & 1) == 0) {              /* a third of the slots live: sparse spans */
            size_t n = sizes[(r >> 50) % 3];
            c->live[i] = kp_malloc(n);
            c->size[i] = n;
            fill(c->live[i], n, (uintptr_t)c->live[i]);
        }
    }
    /* End sparse (four in five of the rest freed), so the main thread's
     * trim finds spans to mesh whatever the scheduler did during the churn;
     * then check and free the rest. */
    for (size_t i = 0; i < CHURN_LIVE; i++)
        if (c->live[i] && next_rnd(&c->rng) % 5) {
            kp_free(c->live[i]);
            c->live[i] = NULL;
        }
    kp_thread_flush();
    pthread_barrier_wait(&churn_barrier);
    pthread_barrier_wait(&churn_barrier);   /* the main thread meshed in between */
    for (size_t i = 0; i < CHURN_LIVE; i++)
        if (c->live[i]) {
            if (!intact(c->live[i], c->size[i], (uintptr_t)c->live[i])) c->bad++;
            kp_free(c->live[i]);
        }
    return NULL;
}

static void *mesh_constantly(void *arg) {
    (void)arg;
    while (!atomic_load(&churn_stop)) kp_trim();
    return NULL;
}

static void test_churn_while_meshing(void) {
    static churner c[2];
    kp_stats st0 = stats_now();
    pthread_t mesher;
    pthread_create(&mesher, NULL, mesh_constantly, NULL);
    pthread_barrier_init(&churn_barrier, NULL, 3);
    for (int i = 0; i < 2; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].rng = 0x1234567u + (uint64_t)i * 0x9e3779b9u;
        pthread_create(&c[i].thread, NULL, churn, &c[i]);
    }
    pthread_barrier_wait(&churn_barrier);
    kp_trim();
    pthread_barrier_wait(&churn_barrier);
    for (int i = 0; i < 2; i++) pthread_join(c[i].thread, NULL);
    pthread_barrier_destroy(&churn_barrier);
    atomic_store(&churn_stop, 1);
    pthread_join(mesher, NULL);
    for (int e = 0; e < 1024; e++) {
        void *p = atomic_exchange(&exchange[e], NULL);
        if (p) kp_free(p);
    }
    printf("  %llu spans meshed during the churn\n", (unsigned long long)(stats_now().meshes - st0.meshes));
    CHECK(stats_now().meshes > st0.meshes);
    CHECK_EQ(c[0].bad + c[1].bad, 0);
    kp_trim();
    CHECK(all_valid());
    CHECK_EQ(stats_now().bytes_meshed, 0);
}

static void test_fork_gives_private_pages(void) {
    size_t k;
    void **b = sparse(30000, 256, &k);
    kp_trim();
    CHECK(stats_now().bytes_meshed > 0);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        /* The child writes every block; the parent must not see it. */
        for (size_t i = 0; i < k; i++) fill(b[i], 256, 7);
        for (size_t i = 0; i < k; i++) kp_free(b[i]);
        for (int i = 0; i < 1000; i++) kp_free(kp_malloc(256));
        char c = 'x';
        if (write(pipefd[1], &c, 1) != 1) _exit(2);
        _exit(all_valid() ? 0 : 3);
    }
    char c;
    CHECK(read(pipefd[0], &c, 1) == 1);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int ok = 1;
    for (size_t i = 0; i < k; i++) ok &= intact(b[i], 256, (uintptr_t)b[i]);
    CHECK(ok);
    CHECK_EQ(stats_now().bytes_meshed, 0);        /* the groups are private copies now */
    /* and they still work: allocate from them, then free everything */
    void *extra[5000];
    for (int i = 0; i < 5000; i++) fill(extra[i] = kp_malloc(256), 256, 99);
    ok = 1;
    for (size_t i = 0; i < k; i++) ok &= intact(b[i], 256, (uintptr_t)b[i]);
    for (int i = 0; i < 5000; i++) ok &= intact(extra[i], 256, 99);
    CHECK(ok);
    for (int i = 0; i < 5000; i++) kp_free(extra[i]);
    for (size_t i = 0; i < k; i++) kp_free(b[i]);
    free(b);
    close(pipefd[0]);
    close(pipefd[1]);
    CHECK(all_valid());
}

/* After a fork, parent and child both mesh spans at the same addresses:
 * each must keep its own bytes (each meshes into a file of its own). */
static void test_parent_and_child_mesh_apart(void) {
    int to_parent[2], to_child[2];
    CHECK(pipe(to_parent) == 0 && pipe(to_child) == 0);
    pid_t pid = fork();
    uint64_t me = (uint64_t)getpid();
    /* the same random sequence in both: the same blocks at the same addresses */
    void **all = malloc(30000 * sizeof *all);
    for (int i = 0; i < 30000; i++) {
        all[i] = kp_malloc(256);
        fill(all[i], 256, (uintptr_t)all[i] ^ me);
    }
    size_t k = 0;
    for (int i = 0; i < 30000; i++) {
        if (i % 10 == 3) all[k++] = all[i];
        else kp_free(all[i]);
    }
    kp_trim();
    int meshed = stats_now().bytes_meshed > 0;
    char c = 'x';
    if (pid == 0) {                     /* child: meshed, then wait for the parent to mesh too */
        if (write(to_parent[1], &c, 1) != 1 || read(to_child[0], &c, 1) != 1) _exit(2);
        int ok = 1;
        for (size_t i = 0; i < k; i++) ok &= intact(all[i], 256, (uintptr_t)all[i] ^ me);
        _exit(!meshed ? 4 : ok ? 0 : 3);
    }
    CHECK(read(to_parent[0], &c, 1) == 1);
    CHECK(meshed);
    for (size_t i = 0; i < k; i++) fill(all[i], 256, (uintptr_t)all[i] ^ me);   /* written after both meshed */
    CHECK(write(to_child[1], &c, 1) == 1);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int ok = 1;
    for (size_t i = 0; i < k; i++) ok &= intact(all[i], 256, (uintptr_t)all[i] ^ me);
    CHECK(ok);
    for (size_t i = 0; i < k; i++) kp_free(all[i]);
    free(all);
    for (int i = 0; i < 2; i++) {
        close(to_parent[i]);
        close(to_child[i]);
    }
}

/* ---- failures and foreign handlers (each once a real bug) ---------------------- */
/* The sanitizers put their own SIGSEGV handling under a program's: a fault
 * that gets the default action is their report and exit(1) there, and
 * jumping out of a handler they called is not supported. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif
static int died_of_the_fault(int status) {
    if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGSEGV;
    return SANITIZED && WIFEXITED(status) && WEXITSTATUS(status) != 0;
}

static int count_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, c;
    while (f && (c = fgetc(f)) != EOF) n += c == '\n';
    if (f) fclose(f);
    return n;
}

static int all_intact(void **b, size_t k, size_t size) {
    int ok = 1;
    for (size_t i = 0; i < k; i++) ok &= intact(b[i], size, (uintptr_t)b[i]);
    return ok;
}

static void free_all(void **b, size_t k) {
    for (size_t i = 0; i < k; i++) kp_free(b[i]);
    free(b);
}

/* mesh, fork, free, again: the private copies fork made must not pile up
 * kernel mappings (they once grew by ~600 a round, to vm.max_map_count). */
static void test_fork_rounds_keep_the_mappings_bounded(void) {
    int before = count_maps();
    for (int round = 0; round < 15; round++) {
        size_t k;
        void **b = sparse(20000, 128, &k);
        kp_trim();
        pid_t pid = fork();
        if (pid == 0) _exit(all_intact(b, k, 128) ? 0 : 3);
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        CHECK(all_intact(b, k, 128));
        free_all(b, k);
        kp_trim();
    }
    int after = count_maps();
    printf("  kernel mappings: %d before, %d after 15 rounds\n", before, after);
    CHECK(after < before + 64);
    CHECK_EQ(stats_now().bytes_meshed, 0);
}

/* kpool.h: meshing stops at a quarter of vm.max_map_count (each member is
 * a kernel mapping). With the budget cut to a few members, kp_trim meshes
 * up to it and no further; given the budget back, it meshes more. */
static void test_meshing_stops_at_its_mapping_budget(void) {
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    long max_map_count = 65530;
    if (f) {
        if (fscanf(f, "%ld", &max_map_count) != 1) max_map_count = 65530;
        fclose(f);
    }
    CHECK_EQ(_kp_mesh_budget(0), (size_t)max_map_count / 4);
    enum { BUDGET = 8 };
    size_t k;
    void **b = sparse(40000, 128, &k);
    kp_thread_flush();
    kp_stats st0 = stats_now();
    int maps0 = count_maps();
    size_t saved = _kp_mesh_budget(BUDGET);
    kp_trim();
    kp_stats st1 = stats_now();
    int maps1 = count_maps();
    printf("  budget %d members: %llu meshes, %zu bytes meshed, %d more kernel mappings\n", BUDGET,
           (unsigned long long)(st1.meshes - st0.meshes), st1.bytes_meshed, maps1 - maps0);
    CHECK(st1.meshes > st0.meshes);                       /* it meshed ... */
    CHECK(st1.meshes - st0.meshes < BUDGET);              /* ... each join a member more, within the budget */
    CHECK(maps1 - maps0 <= 2 * BUDGET + 8);
    CHECK(all_intact(b, k, 128));
    _kp_mesh_budget(saved);
    kp_trim();
    kp_stats st2 = stats_now();
    CHECK(st2.bytes_meshed > st1.bytes_meshed);           /* the budget was what stopped it */
    CHECK(all_intact(b, k, 128));
    CHECK(all_valid());
    free_all(b, k);
    kp_trim();
    CHECK_EQ(stats_now().bytes_meshed, 0);
}

/* A join whose last remap fails has written the source's objects into the
 * destination's free slots: its free list must be rebuilt, not followed. */
static void test_join_that_fails_late_keeps_lists_sound(void) {
    size_t k;
    void **b = sparse(20000, 128, &k);
    kp_thread_flush();
    _kp_mesh_fail_next(FAIL_FILE, 1);
    kp_trim();
    _kp_mesh_fail_next(FAIL_FILE, 0);
    CHECK(all_valid());
    CHECK(all_intact(b, k, 128));
    void *more[5000];
    for (int i = 0; i < 5000; i++) {
        more[i] = kp_malloc(128);
        fill(more[i], 128, (uintptr_t)more[i]);
    }
    CHECK(all_intact(b, k, 128) && all_intact(more, 5000, 128));
    for (int i = 0; i < 5000; i++) kp_free(more[i]);
    free_all(b, k);
    kp_trim();
    CHECK(all_valid());
}

/* A fork (the child exits at once) whose prepare handler's first private
 * copy fails. */
static void fork_with_a_failed_copy(void) {
    _kp_mesh_fail_next(FAIL_MOVE, 1);
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    _kp_mesh_fail_next(FAIL_MOVE, 0);
    waitpid(pid, NULL, 0);
}

/* fork's private copy fails for a member: the group stays shared (its
 * file page kept), and no block loses its bytes. */
static void test_fork_copy_that_fails_loses_nothing(void) {
    size_t k;
    void **b = sparse(20000, 256, &k);
    kp_trim();
    fork_with_a_failed_copy();
    CHECK(all_intact(b, k, 256));                  /* the member left sharing still shows the file page */
    free_all(b, k);
    kp_trim();
    CHECK_EQ(stats_now().bytes_meshed, 0);
    CHECK(all_valid());
}

/* A member that cannot get private pages back when its group empties keeps
 * the group alive (its range still shows the shared page): new blocks must
 * not overlap, and the group is undone once it empties again. */
static void test_undo_that_fails_keeps_the_group(void) {
    size_t k;
    void **b = sparse(20000, 128, &k);
    kp_trim();
    CHECK(stats_now().bytes_meshed > 0);
    _kp_mesh_fail_next(FAIL_ANON, 1);
    free_all(b, k);
    kp_trim();
    _kp_mesh_fail_next(FAIL_ANON, 0);
    CHECK(stats_now().bytes_meshed > 0);           /* one group lives on */
    CHECK(all_valid());
    void **fresh = malloc(40000 * sizeof *fresh);
    for (int i = 0; i < 40000; i++) {
        fresh[i] = kp_malloc(128);
        fill(fresh[i], 128, (uintptr_t)fresh[i]);
    }
    CHECK(all_intact(fresh, 40000, 128));
    free_all(fresh, 40000);
    kp_trim();
    CHECK_EQ(stats_now().bytes_meshed, 0);
    CHECK(all_valid());
}

/* A handler installed after meshing's, chaining to it: a real crash must
 * still end the process, not go round between the two. */
static struct sigaction saved_by_program;
static void program_handler(int sig, siginfo_t *si, void *ctx) {
    if (saved_by_program.sa_flags & SA_SIGINFO) saved_by_program.sa_sigaction(sig, si, ctx);
}
static void test_a_crash_under_a_chaining_handler_still_ends(void) {
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);                                 /* a loop would end here, with SIGALRM */
        size_t k;
        void **b = sparse(20000, 128, &k);
        kp_trim();                                  /* meshing's handler is installed */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = program_handler;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, &saved_by_program);
        void **c = sparse(20000, 160, &k);
        kp_trim();                                  /* puts meshing's handler on top again */
        (void)b;
        (void)c;
        volatile int *nowhere = (volatile int *)(uintptr_t)atoi("16");   /* a real NULL-page write */
        *nowhere = 1;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(died_of_the_fault(status));
}

/* A program whose handler recovers from its own faults (siglongjmp) keeps
 * meshing working: writers that meet a window later still wait. */
static sigjmp_buf probe_jump;
static void probe_handler(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)si;
    (void)ctx;
    siglongjmp(probe_jump, 1);
}
static void test_meshing_survives_a_handler_that_jumps_out(void) {
    if (SANITIZED) {
        printf("  skipped: jumping out of a handler the sanitizer called\n");
        return;
    }
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = probe_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, &old);
    size_t k;
    void **b = sparse(20000, 128, &k);
    kp_trim();                                      /* meshing's handler above the program's */
    void *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    volatile int jumped = 0;
    for (int i = 0; i < 3; i++)
        if (sigsetjmp(probe_jump, 1) == 0) *(volatile int *)page = 1;
        else jumped++;
    CHECK_EQ(jumped, 3);                            /* each probe reached the program's handler */
    free_all(b, k);
    kp_trim();
    test_writers_during_mesh();                     /* and writers in windows still wait */
    munmap(page, 4096);
    sigaction(SIGSEGV, &old, NULL);
}

/* Python's faulthandler: installed after kpool's handler, on a crash it
 * puts its previous handler (kpool's) back and raise()s. That must end the
 * process after one report, not go round (it printed 73k tracebacks). */
static int *fh_reports;                            /* shared with the parent */
static struct sigaction fh_previous;
static void fh_like(int sig) {
    sigaction(sig, &fh_previous, NULL);
    __atomic_add_fetch(fh_reports, 1, __ATOMIC_SEQ_CST);
    raise(sig);
}
static void test_a_crash_under_faulthandler_reports_once(void) {
    fh_reports = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        size_t k;
        void **b = sparse(20000, 128, &k);
        kp_trim();
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = fh_like;
        sa.sa_flags = SA_NODEFER | SA_ONSTACK;
        sigaction(SIGSEGV, &sa, &fh_previous);
        void **c = sparse(20000, 160, &k);
        kp_trim();                                  /* kpool's on top again, faulthandler its previous */
        (void)b;
        (void)c;
        volatile int *nowhere = (volatile int *)(uintptr_t)atoi("16");
        *nowhere = 1;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(died_of_the_fault(status));
    CHECK_EQ(*fh_reports, 1);
    munmap(fh_reports, 4096);
}

/* After a handler jumped out of a fault, a fault deeper in the stack is
 * not taken for one coming back from that handler: a foreign one still
 * reaches the program's handler, a write into a mesh window still waits. */
static _Atomic int deep_stop;
static void *trim_constantly(void *arg) {
    (void)arg;
    while (!atomic_load(&deep_stop)) kp_trim();
    return NULL;
}
static volatile int deep_jumps;
__attribute__((noinline)) static void fault_deeper(int depth, void *page, void **b, size_t k) {
    volatile char pad[2048];
    pad[0] = 0;
    if (depth > 0) {
        fault_deeper(depth - 1, page, b, k);
    } else if (page) {
        if (sigsetjmp(probe_jump, 1) == 0) *(volatile int *)page = 1;
        else deep_jumps++;
    } else {
        for (int r = 0; r < 100; r++)
            for (size_t i = 0; i < k; i++) ((volatile uint64_t *)b[i])[0] = ((uint64_t *)b[i])[0];
    }
    (void)pad;
}
static void test_a_handler_that_jumped_out_leaves_nothing_behind(void) {
    if (SANITIZED) {
        printf("  skipped: jumping out of a handler the sanitizer called\n");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        alarm(120);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = probe_handler;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigaction(SIGSEGV, &sa, NULL);
        size_t k;
        void **b = sparse(2000, 128, &k);
        kp_trim();                                  /* kpool's handler over the program's */
        void *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (sigsetjmp(probe_jump, 1) == 0) *(volatile int *)page = 1;   /* shallow, jumps out */
        else deep_jumps++;
        fault_deeper(3, page, NULL, 0);             /* ~6 KiB deeper: the program's handler again */
        pthread_t mesher;
        pthread_create(&mesher, NULL, trim_constantly, NULL);
        for (int round = 0; round < 5; round++) {   /* deeper writes into mesh windows: they wait */
            size_t n;
            void **w = sparse(20000, 128, &n);
            kp_thread_flush();
            fault_deeper(3, NULL, w, n);
            int ok = all_intact(w, n, 128);
            free_all(w, n);
            if (!ok) _exit(4);
        }
        atomic_store(&deep_stop, 1);
        pthread_join(mesher, NULL);
        free_all(b, k);
        _exit(deep_jumps == 2 ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        printf("  child: exit %d, signal %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
               WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* fork with a member's copy failing, then a second fork, then undo: the
 * members already private are not copied again, and bytes_meshed stays
 * right throughout (it wrapped around, and went negative). */
static void test_forks_after_a_partial_split_keep_the_figures(void) {
    size_t k;
    void **b = sparse(40000, 64, &k);
    kp_trim();
    fork_with_a_failed_copy();
    kp_stats one = stats_now();
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    waitpid(pid, NULL, 0);
    kp_stats two = stats_now();
    CHECK(two.bytes_meshed <= one.bytes_meshed);
    CHECK(two.bytes_small_spans > 0);
    CHECK(all_intact(b, k, 64));
    free_all(b, k);
    kp_trim();
    CHECK_EQ(stats_now().bytes_meshed, 0);
    size_t raw;
    uint64_t count;
    _kp_mesh_figures(&raw, &count);
    CHECK_EQ(raw, 0);                              /* unclamped: it went below zero once */
    void *x = kp_malloc(64);
    CHECK_EQ(stats_now().bytes_meshed, 0);
    kp_free(x);
    CHECK(all_valid());
}

/* A write after free into a free block: meshing skips the damaged span
 * instead of following the bad link (the next pop reports it). */
static _Atomic int reported;
static void note_error(const char *call, const void *p, const char *what) {
    (void)call;
    (void)p;
    (void)what;
    atomic_fetch_add(&reported, 1);
}
static void test_damaged_free_list_is_skipped(void) {
    kp_error_handler prev = kp_set_error_handler(note_error);
    void **all = malloc(20000 * sizeof *all);
    for (int i = 0; i < 20000; i++) {
        all[i] = kp_malloc(128);
        fill(all[i], 128, (uintptr_t)all[i]);
    }
    size_t k = 0;
    void *victim = NULL;
    for (int i = 0; i < 20000; i++) {
        if (i % 10 == 0) all[k++] = all[i];
        else {
            kp_free(all[i]);
            if (i == 10001) victim = all[i];
        }
    }
    kp_thread_flush();
    kp_trim();                                       /* the transfer slots drain into the spans */
    ((uintptr_t *)victim)[0] = 0x4141414141414141u;  /* the write after free */
    kp_trim();
    CHECK(all_intact(all, k, 128));
    void *more[20000];
    for (int i = 0; i < 20000; i++) more[i] = kp_malloc(128);
    for (int i = 0; i < 20000; i++) kp_free(more[i]);
    CHECK(atomic_load(&reported) > 0);             /* when the damaged list was reached */
    for (size_t i = 0; i < k; i++) kp_free(all[i]);
    free(all);
    kp_set_error_handler(prev);
}

int main(void) {
    const char *env = getenv("KPOOL_MESH");
    if (!env || strcmp(env, "1") != 0) RUN(test_off_until_started);   /* else it is on from the start */
    if (_kp_mesh_start() != 0) {
        /* a -DKP_MESH=0 build (make nomesh-check runs this with KPOOL_MESH=1),
         * or no memfd here: nothing is ever meshed */
        printf("meshing unavailable (%s)\n", strerror(errno));
        RUN(test_off_until_started);
        return DONE();
    }
    RUN(test_mesh_keeps_blocks_and_gives_pages_back);
    RUN(test_decay_path_meshes);
    RUN(test_writers_during_mesh);
    RUN(test_churn_while_meshing);
    RUN(test_fork_gives_private_pages);
    RUN(test_parent_and_child_mesh_apart);
    RUN(test_fork_rounds_keep_the_mappings_bounded);
    RUN(test_meshing_stops_at_its_mapping_budget);
    RUN(test_join_that_fails_late_keeps_lists_sound);
    RUN(test_fork_copy_that_fails_loses_nothing);
    RUN(test_undo_that_fails_keeps_the_group);
    RUN(test_a_crash_under_a_chaining_handler_still_ends);
    RUN(test_meshing_survives_a_handler_that_jumps_out);
    RUN(test_a_crash_under_faulthandler_reports_once);
    RUN(test_a_handler_that_jumped_out_leaves_nothing_behind);
    RUN(test_forks_after_a_partial_split_keep_the_figures);
    RUN(test_damaged_free_list_is_skipped);
    return DONE();
}
