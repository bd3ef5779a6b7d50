/* stress.c: the multithreaded allocator workload driver (DESIGN.md section 5).
 *
 * Job: run one workload (pairs mixed random larson prodcons burst frag) in
 * cfg->threads C threads against one allocator (kpool, kpool-pool, system,
 * null), reached through a small vtable so that every allocator is called
 * the same way (kpool through the exported kp_* functions of libkpool.so,
 * never inlined); time it, sample latencies, read RSS, verify blocks, and
 * return one JSON object. Built into kpool._core and into kpool-stress.
 *
 * Invariants: the measured loops do nothing but the workload: no locks, no
 * I/O and no allocation of the driver's own (every array the driver needs,
 * sample buffers included, is mmap'd before the threads start; only the JSON
 * text and the merged samples in kps_finish come from libc malloc). A block
 * is stamped right after allocation and checked right before its free when
 * verify is on; a freed block's first and last words are poisoned first.
 *
 * Synchronisation: C11 atomics only. run->go (release/acquire) starts the
 * workers; run->stop (the first stop reason, set by compare-and-swap), the
 * process-wide cancel epoch and the run's deadline are polled (relaxed)
 * every KPS_STOP_EVERY ops and while a producer waits; phases
 * meet at a spinning barrier (acq_rel counter + release generation); blocks
 * move between threads only through single-producer single-consumer rings
 * whose slots are published by a release store of the tail and recycled by a
 * release store of the head. Per-thread results are read after pthread_join.
 */
#include "stress.h"

#include "kpool.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------
 * Names and tunables
 * ---------------------------------------------------------------------- */
const char *const kps_workloads[] = {"pairs", "mixed", "random", "larson", "prodcons",
                                     "burst", "frag", NULL};
const char *const kps_allocators[] = {"kpool", "kpool-pool", "system", "null", NULL};

enum { WL_PAIRS, WL_MIXED, WL_RANDOM, WL_LARSON, WL_PRODCONS, WL_BURST, WL_FRAG };
enum { AL_KPOOL, AL_KPOOL_POOL, AL_SYSTEM, AL_NULL };

#define KPS_CACHELINE 64
#define KPS_SAMPLE_MASK 1023u        /* one op in 1024 is timed */
#define KPS_SAMPLES_MAX ((size_t)1 << 22)   /* latency samples kept, all threads together */
#define KPS_STOP_EVERY 4096u         /* ops between two looks at the stop flag */
#define KPS_MAX_THREADS 4096
#define KPS_MAX_SIZE ((size_t)1 << 30)
#define KPS_DEFAULT_SIZE 32
#define KPS_DEFAULT_BURST ((size_t)1 << 30)
#define KPS_MIXED_WINDOW 512
#define KPS_RANDOM_WINDOW 1000
#define KPS_LARSON_WINDOW 1000
#define KPS_RING 4096                /* slots per SPSC ring, a power of two */
#define KPS_SOLO_BATCH 64            /* prodcons with one thread: blocks per turn */
#define KPS_PUBLISH 32               /* ring items per index store (a power of two) */
#define KPS_NULL_BUF 8192            /* the null allocator's per-thread buffer, at least */
#define KPS_MAGIC 0x9e3779b97f4a7c15ull
#define KPS_TAILK 0xff51afd7ed558ccdull
#define KPS_FREED 0xfeedfacecafebeefull

_Static_assert((KPS_RING & (KPS_RING - 1)) == 0, "KPS_RING must be a power of two");
_Static_assert((KPS_PUBLISH & (KPS_PUBLISH - 1)) == 0 && KPS_PUBLISH < KPS_RING, "KPS_PUBLISH");
_Static_assert(((KPS_SAMPLE_MASK + 1) & KPS_SAMPLE_MASK) == 0, "sample mask");
_Static_assert(KPS_NULL_BUF >= 4096, "null buffer must hold the largest fixed size");

/* ------------------------------------------------------------------------
 * Types
 * ---------------------------------------------------------------------- */
typedef struct kps_thread kps_thread;

typedef struct alloc_vt {
    const char *name;
    void *(*alloc)(kps_thread *t, size_t n);
    void (*release)(kps_thread *t, void *p, size_t n);
} alloc_vt;

typedef struct ring_item {
    void *p;
    size_t n;
} ring_item;

/* SPSC ring: tail - head == items published and not yet taken, <= KPS_RING.
 * Each end keeps its own position and stores it only every KPS_PUBLISH items
 * (and before it waits), so the two ends trade the index cache lines once per
 * batch, not per item: the ring costs the driver little, and what a
 * cross-thread workload measures is the allocator's remote frees. */
typedef struct ring {
    _Alignas(KPS_CACHELINE) atomic_size_t head;   /* written by the consumer */
    _Alignas(KPS_CACHELINE) atomic_size_t tail;   /* written by the producer */
    atomic_int closed;                              /* producer done (prodcons) */
    _Alignas(KPS_CACHELINE) ring_item items[KPS_RING];
} ring;

typedef struct slot {
    void *p;
    size_t n;
} slot;

struct kps_thread {
    _Alignas(KPS_CACHELINE) kps_run *run;
    int id;
    pthread_t tid;
    int joinable;
    uint64_t rng;
    uint64_t ops;              /* ops assigned */
    uint64_t done;             /* ops done */
    uint64_t t_start, t_end;   /* ns, CLOCK_MONOTONIC */
    uint64_t t_phase[8];       /* burst/frag phase times */
    uint64_t *samples;         /* mmap'd: a uniform sample (reservoir) of the timed ops */
    size_t nsamples, cap;
    uint64_t timed;            /* timed ops seen, kept or not */
    uint64_t sample_rng;       /* the reservoir's own generator: the workload's sequence stays the seed's */
    uint64_t corrupt;
    char err[200];
    unsigned char *nullbuf;    /* mmap'd, for the null allocator */
    size_t nullsize;
    kp_pool *pool;
    slot *slots;               /* mmap'd window / block arrays */
    size_t nslots;
    slot *slots2;              /* frag: the refill blocks */
    size_t nslots2;
    void **ptrs;               /* burst: the blocks (sizes are replayed from the RNG) */
    size_t nptrs;
    ring *out, *in;            /* larson / prodcons */
    int role;                  /* prodcons: 0 producer, 1 consumer, 2 both */
    uint64_t remote, local;    /* larson: frees handed on / done locally */
    size_t live[4];            /* frag: live bytes after each phase */
    size_t prod_tail, cached_head;  /* producer end (out, or the solo ring): position, last head seen */
    size_t cons_head, cached_tail;  /* consumer end (in, or the solo ring): position, last tail seen */
};

/* Stop reasons, in run->stop: the first one set wins. */
enum { KPS_RUNNING = 0, KPS_STOP_REQUEST, KPS_STOP_CANCEL, KPS_STOP_DURATION };

/* kps_cancel_all bumps the epoch; a run started in an older one stops. */
static atomic_uint kps_epoch;
static atomic_int kps_in_progress;  /* runs between kps_start and kps_finish */

struct kps_run {
    int wl, al;
    kps_config cfg;            /* copy; strings point to the static name tables */
    const alloc_vt *vt;
    int verify;                /* effective (off for null) */
    size_t size;               /* effective block size for pairs */
    int nthreads;              /* threads started */
    kps_thread *th;            /* mmap'd */
    size_t th_bytes;
    ring *rings;               /* mmap'd */
    size_t nrings;
    kp_pool *pool;
    atomic_int go;
    atomic_int abort_run;
    atomic_int stop;           /* KPS_RUNNING or the reason to stop */
    unsigned epoch;            /* kps_epoch when the run started */
    uint64_t deadline_ns;      /* 0 = none; written before go */
    atomic_int finished;
    atomic_int loop_done;      /* larson: threads out of their loop */
    atomic_int bar_count;
    atomic_int bar_gen;
    int bar_n;
    uint64_t ops_requested;
    /* filled by thread 0 between barriers, read after join */
    long rss_base, rss_full, rss_free, rss_1s, rss_trim;
    long frag_rss[4];
    uint64_t frag_trim_ns;     /* frag: time the trim call took (with the RSS reading) */
    size_t trim_bytes;
    const char *trim_kind;     /* the call trim_heap made, or NULL */
    char preload[160];
    kp_stats *st0;             /* kpool stats at start (libc malloc'd) */
};

/* ------------------------------------------------------------------------
 * Small helpers: time, RNG, memory, RSS, backoff
 * ---------------------------------------------------------------------- */
static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* xorshift64*: state never 0. */
static inline uint64_t rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Uniform in [0, n) from 32 bits of r. */
static inline size_t below(uint64_t r32, size_t n) { return (size_t)(((r32 & 0xffffffffu) * (uint64_t)n) >> 32); }

static void *map_bytes(size_t bytes) {
    if (bytes == 0) bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void unmap_bytes(void *p, size_t bytes) {
    if (p) munmap(p, bytes ? bytes : 1);
}

/* Touch every page so later RSS readings do not count the driver's arrays. */
static void prefault(void *p, size_t bytes) {
    long pg = sysconf(_SC_PAGESIZE);
    volatile unsigned char *b = p;
    for (size_t i = 0; i < bytes; i += (size_t)pg) b[i] = 0;
}

/* Bytes resident now, -1 if unreadable. No allocation. The proportional
 * figure (smaps_rollup's Pss), where the kernel has it: a page mapped at two
 * addresses costs one page, and statm's resident count would count it twice
 * (kpool's meshing maps one physical page at several addresses). For the
 * private anonymous memory of the other allocators the two agree. */
static long rss_now(void) {
    char buf[4096];
    int fd = open("/proc/self/smaps_rollup", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        char *pss = k > 0 ? (buf[k] = 0, strstr(buf, "\nPss:")) : NULL;
        if (pss) return strtol(pss + 5, NULL, 10) * 1024;
    }
    fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return -1;
    buf[k] = 0;
    char *s = buf;
    strtol(s, &s, 10);
    long pages = strtol(s, NULL, 10);
    return pages * sysconf(_SC_PAGESIZE);
}

/* Peak resident bytes (VmHWM), falling back to ru_maxrss. */
static long rss_peak(void) {
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (k > 0) {
            buf[k] = 0;
            char *h = strstr(buf, "VmHWM:");
            if (h) return strtol(h + 6, NULL, 10) * 1024;
        }
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) return ru.ru_maxrss * 1024;
    return -1;
}

/* Reset the peak-RSS mark (Linux >= 4.0); best effort. */
static void rss_peak_reset(void) {
    int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k = write(fd, "5", 1);
        (void)k;
        close(fd);
    }
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spin a little, then yield (threads may outnumber cores), then sleep. */
static void backoff(unsigned *k) {
    unsigned n = (*k)++;
    if (n < 32) {
        cpu_relax();
    } else if (n < 2000) {
        sched_yield();
    } else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

static void set_stop(kps_run *r, int why) {
    int running = KPS_RUNNING;
    atomic_compare_exchange_strong_explicit(&r->stop, &running, why, memory_order_relaxed, memory_order_relaxed);
}

/* 1 once the run should stop: asked to, cancelled (the epoch moved), or
 * past its deadline (the last two are recorded as the reason). */
static int stopping(kps_run *r) {
    if (atomic_load_explicit(&r->stop, memory_order_relaxed)) return 1;
    if (atomic_load_explicit(&kps_epoch, memory_order_relaxed) != r->epoch) {
        set_stop(r, KPS_STOP_CANCEL);
        return 1;
    }
    if (r->deadline_ns && now_ns() >= r->deadline_ns) {
        set_stop(r, KPS_STOP_DURATION);
        return 1;
    }
    return 0;
}

/* Spinning barrier among the bar_n workers. */
static void bar_wait(kps_run *r) {
    int gen = atomic_load_explicit(&r->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&r->bar_count, 1, memory_order_acq_rel) + 1 == r->bar_n) {
        atomic_store_explicit(&r->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&r->bar_gen, 1, memory_order_release);
        return;
    }
    unsigned k = 0;
    while (atomic_load_explicit(&r->bar_gen, memory_order_acquire) == gen) backoff(&k);
}

static void set_error(kps_thread *t, const char *fmt, ...) {
    if (t->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------
 * Allocators
 * ---------------------------------------------------------------------- */
static void *a_kpool(kps_thread *t, size_t n) { (void)t; return kp_malloc(n); }
static void f_kpool(kps_thread *t, void *p, size_t n) { (void)t; kp_free_sized(p, n); }
static void *a_pool(kps_thread *t, size_t n) { (void)n; return kp_pool_alloc(t->pool); }
static void f_pool(kps_thread *t, void *p, size_t n) { (void)n; kp_pool_free(t->pool, p); }
static void *a_system(kps_thread *t, size_t n) { (void)t; return malloc(n); }
static void f_system(kps_thread *t, void *p, size_t n) { (void)t; (void)n; free(p); }
static void *a_null(kps_thread *t, size_t n) { (void)n; return t->nullbuf; }
static void f_null(kps_thread *t, void *p, size_t n) { (void)t; (void)p; (void)n; }

static const alloc_vt vt_table[] = {
    [AL_KPOOL] = {"kpool", a_kpool, f_kpool},
    [AL_KPOOL_POOL] = {"kpool-pool", a_pool, f_pool},
    [AL_SYSTEM] = {"system", a_system, f_system},
    [AL_NULL] = {"null", a_null, f_null},
};

/* ------------------------------------------------------------------------
 * Verification: stamps. Every stamped word is (address ^ KPS_MAGIC), so a
 * foreign stamp inside a block names the block that overlaps it; the last 8
 * bytes hold the stamp mixed with the size.
 * ---------------------------------------------------------------------- */
static inline uint64_t stamp_word(const void *p) { return (uint64_t)(uintptr_t)p ^ KPS_MAGIC; }
static inline uint64_t stamp_tail(const void *p, size_t n) { return stamp_word(p) ^ ((uint64_t)n * KPS_TAILK); }

/* Number of leading words stamped for a block of n >= 8 bytes. */
static inline size_t stamp_words(size_t n) { return n <= 256 ? n / 8 : 4; }

static void stamp(void *p, size_t n) {
    unsigned char *b = p;
    uint64_t w = stamp_word(p);
    if (n < 8) {
        for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(w >> (8 * i)) ^ (unsigned char)n;
        return;
    }
    size_t k = stamp_words(n);
    for (size_t i = 0; i < k; i++) memcpy(b + 8 * i, &w, 8);
    if (n > 256) memcpy(b + (n / 16) * 8, &w, 8);
    uint64_t tl = stamp_tail(p, n);
    memcpy(b + n - 8, &tl, 8);
}

/* A fresh block must not carry its own live stamp (that would mean it was
 * handed out twice). Returns 0 when fine. */
static int check_fresh(kps_thread *t, void *p, size_t n) {
    if (n < 8) return 0;
    uint64_t w0, tl;
    memcpy(&w0, p, 8);
    memcpy(&tl, (unsigned char *)p + n - 8, 8);
    if (w0 == stamp_word(p) && tl == stamp_tail(p, n)) {
        t->corrupt++;
        set_error(t, "overlap: block %p (%zu B) was handed out while still live", p, n);
        return 1;
    }
    if (t->run->al != AL_SYSTEM && ((uintptr_t)p & 15) != 0) {
        t->corrupt++;
        set_error(t, "misaligned: block %p (%zu B) is not 16-byte aligned", p, n);
        return 1;
    }
    return 0;
}

static void report_word(kps_thread *t, void *p, size_t n, size_t off, uint64_t v) {
    uint64_t q = v ^ KPS_MAGIC;
    uintptr_t a = (uintptr_t)p;
    t->corrupt++;
    if (q != a && (q & 7) == 0 && q + ((uint64_t)1 << 24) > a && q < a + ((uint64_t)1 << 24))
        set_error(t, "overlap: block %p (%zu B) holds at offset %zu the stamp of block %#llx", p, n,
                  off, (unsigned long long)q);
    else
        set_error(t, "damaged: block %p (%zu B) at offset %zu: %#llx", p, n, off, (unsigned long long)v);
}

/* Check the stamp before a free and poison the block's ends. 0 when intact. */
static int check_block(kps_thread *t, void *p, size_t n) {
    unsigned char *b = p;
    uint64_t w = stamp_word(p);
    if (n < 8) {
        for (size_t i = 0; i < n; i++)
            if (b[i] != ((unsigned char)(w >> (8 * i)) ^ (unsigned char)n)) {
                t->corrupt++;
                set_error(t, "damaged: block %p (%zu B) at offset %zu", p, n, i);
                return 1;
            }
        memset(b, 0xa5, n);
        return 0;
    }
    uint64_t tl, v;
    memcpy(&tl, b + n - 8, 8);
    if (tl != stamp_tail(p, n)) {
        report_word(t, p, n, n - 8, tl);
        return 1;
    }
    size_t k = stamp_words(n);
    for (size_t i = 0; i < k && 8 * i + 8 <= n - 8; i++) {   /* words the tail left alone */
        memcpy(&v, b + 8 * i, 8);
        if (v != w) {
            report_word(t, p, n, 8 * i, v);
            return 1;
        }
    }
    if (n > 256) {
        memcpy(&v, b + (n / 16) * 8, 8);
        if (v != w) {
            report_word(t, p, n, (n / 16) * 8, v);
            return 1;
        }
    }
    v = KPS_FREED;
    memcpy(b, &v, 8);
    memcpy(b + n - 8, &v, 8);
    return 0;
}

/* ------------------------------------------------------------------------
 * The operations every workload is built from. verify is a constant in each
 * inlined copy, so the timing loops carry no verification code.
 * ---------------------------------------------------------------------- */
#define KPS_INLINE static inline __attribute__((always_inline))

KPS_INLINE void *get_block(kps_thread *t, const alloc_vt *vt, size_t n, const int verify) {
    void *p = vt->alloc(t, n);
    if (__builtin_expect(p == NULL, 0)) {
        set_error(t, "allocation of %zu bytes failed (%s)", n, strerror(errno));
        return NULL;
    }
    if (verify) {
        check_fresh(t, p, n);
        stamp(p, n);
    } else {
        unsigned char *b = p;
        b[0] = (unsigned char)n;
        b[n - 1] = (unsigned char)n;
    }
    return p;
}

KPS_INLINE void put_block(kps_thread *t, const alloc_vt *vt, void *p, size_t n, const int verify) {
    if (verify) check_block(t, p, n);
    vt->release(t, p, n);
}

/* Keep dt in the thread's reservoir: every timed op has the same chance of
 * being kept, however long the run, in memory that does not grow with ops. */
KPS_INLINE void add_sample(kps_thread *t, uint64_t dt) {
    uint64_t seen = ++t->timed;
    if (t->nsamples < t->cap) {
        t->samples[t->nsamples++] = dt;
        return;
    }
    uint64_t j = rnd(&t->sample_rng) % seen;
    if (j < t->cap) t->samples[j] = dt;
}

static size_t size_mixed(uint64_t r) {
    static const size_t sizes[5] = {8, 32, 128, 512, 4096};
    return sizes[below(r >> 32, 5)];
}
static size_t size_random(uint64_t r) { return 8 + below(r >> 32, 249); }      /* 8..256 */
static size_t size_larson(uint64_t r) { return 8 + below(r >> 32, 993); }      /* 8..1000 */
static size_t size_burst(uint64_t r) { return 64 + below(r >> 32, 4033); }      /* 64..4096 */
static size_t size_small(uint64_t r) { return 8 + below(r >> 32, 249); }       /* 8..256 */
static size_t size_big(uint64_t r) { return 257 + below(r >> 32, 768); }       /* 257..1024 */

/* ------------------------------------------------------------------------
 * pairs: alloc/free pairs of one size
 * ---------------------------------------------------------------------- */
/* vt is a constant in each copy (the worker picks one per allocator), so
 * the allocator's functions are called directly, not through pointers: the
 * loop's own cost is what the null allocator's copy measures. One op in
 * KPS_SAMPLE_MASK + 1 is timed; the stop flag is read every KPS_STOP_EVERY. */
KPS_INLINE void run_pairs(kps_thread *t, const alloc_vt *vt, const int verify) {
    kps_run *r = t->run;
    const size_t n = r->size;
    const uint64_t ops = t->ops;
    uint64_t i = 0;
    t->t_start = now_ns();
    while (i < ops) {
        if ((i & (KPS_STOP_EVERY - 1)) == 0 && stopping(r)) break;
        uint64_t a = now_ns();
        void *p = get_block(t, vt, n, verify);
        if (!p) break;
        put_block(t, vt, p, n, verify);
        add_sample(t, now_ns() - a);
        uint64_t chunk_end = (i | KPS_SAMPLE_MASK) + 1;
        if (chunk_end > ops) chunk_end = ops;
        for (i++; i < chunk_end; i++) {
            p = get_block(t, vt, n, verify);
            if (__builtin_expect(!p, 0)) break;
            put_block(t, vt, p, n, verify);
        }
        if (i < chunk_end) break;   /* an allocation failed */
    }
    t->t_end = now_ns();
    t->done = i;
}

/* ------------------------------------------------------------------------
 * mixed / random: a live window per thread, random replacement
 * ---------------------------------------------------------------------- */
/* Fill the thread's live window with blocks of sizes drawn by pick; how
 * many slots were filled (fewer when an allocation failed). */
KPS_INLINE size_t fill_window(kps_thread *t, const alloc_vt *vt, size_t (*pick)(uint64_t), const int verify) {
    slot *s = t->slots;
    size_t filled;
    for (filled = 0; filled < t->nslots; filled++) {
        size_t n = pick(rnd(&t->rng));
        s[filled].p = get_block(t, vt, n, verify);
        s[filled].n = n;
        if (!s[filled].p) break;
    }
    return filled;
}

KPS_INLINE void run_window(kps_thread *t, size_t (*pick)(uint64_t), const int verify) {
    kps_run *r = t->run;
    const alloc_vt *vt = r->vt;
    slot *s = t->slots;
    const size_t w = t->nslots;
    uint64_t i;
    size_t j, filled = fill_window(t, vt, pick, verify);
    bar_wait(r);
    t->t_start = now_ns();
    for (i = 0; i < t->ops && filled == w; i++) {
        if ((i & (KPS_STOP_EVERY - 1)) == 0 && stopping(r)) break;
        uint64_t x = rnd(&t->rng);
        slot *e = &s[below(x, w)];
        size_t n = pick(x);
        if ((i & KPS_SAMPLE_MASK) == 0) {
            uint64_t a = now_ns();
            put_block(t, vt, e->p, e->n, verify);
            e->p = get_block(t, vt, n, verify);
            add_sample(t, now_ns() - a);
        } else {
            put_block(t, vt, e->p, e->n, verify);
            e->p = get_block(t, vt, n, verify);
        }
        e->n = n;
        if (!e->p) {
            i++;
            break;
        }
    }
    t->t_end = now_ns();
    t->done = i;
    for (j = 0; j < filled; j++)
        if (s[j].p) put_block(t, vt, s[j].p, s[j].n, verify);
}

/* ------------------------------------------------------------------------
 * SPSC rings
 * ---------------------------------------------------------------------- */
/* Producer side: publish every item pushed so far. */
KPS_INLINE void ring_flush(kps_thread *t, ring *q) {
    atomic_store_explicit(&q->tail, t->prod_tail, memory_order_release);
}

/* Producer side: 1 if pushed, 0 if full (then everything pushed is
 * published, so the consumer can make room). */
KPS_INLINE int ring_push(kps_thread *t, ring *q, void *p, size_t n) {
    size_t tail = t->prod_tail;
    if (tail - t->cached_head >= KPS_RING) {
        t->cached_head = atomic_load_explicit(&q->head, memory_order_acquire);
        if (tail - t->cached_head >= KPS_RING) {
            ring_flush(t, q);
            return 0;
        }
    }
    q->items[tail & (KPS_RING - 1)].p = p;
    q->items[tail & (KPS_RING - 1)].n = n;
    t->prod_tail = ++tail;
    if ((tail & (KPS_PUBLISH - 1)) == 0) ring_flush(t, q);
    return 1;
}

/* Consumer side: 1 and *it filled if an item was taken, 0 if none is
 * published (then every slot taken is given back to the producer). */
KPS_INLINE int ring_pop(kps_thread *t, ring *q, ring_item *it) {
    size_t head = t->cons_head;
    if (head == t->cached_tail) {
        if (atomic_load_explicit(&q->head, memory_order_relaxed) != head)
            atomic_store_explicit(&q->head, head, memory_order_release);
        t->cached_tail = atomic_load_explicit(&q->tail, memory_order_acquire);
        if (head == t->cached_tail) return 0;
    }
    *it = q->items[head & (KPS_RING - 1)];
    t->cons_head = ++head;
    if ((head & (KPS_PUBLISH - 1)) == 0) atomic_store_explicit(&q->head, head, memory_order_release);
    return 1;
}

/* A thread's producer and consumer ends have separate fields, so one thread
 * may be both ends of a ring (one thread, a self ring).
 *
 * ------------------------------------------------------------------------
 * larson: each thread replaces random slots of its window; the block taken
 * out is handed to the next thread on a ring, which frees it (cross-thread
 * free). A full ring makes the thread wait, freeing its own input, so all
 * frees are remote; only a stop request frees locally (counted).
 * ---------------------------------------------------------------------- */
KPS_INLINE void drain(kps_thread *t, const alloc_vt *vt, const int verify) {
    ring_item it;
    while (ring_pop(t, t->in, &it)) put_block(t, vt, it.p, it.n, verify);
}

KPS_INLINE void run_larson(kps_thread *t, const int verify) {
    kps_run *r = t->run;
    const alloc_vt *vt = r->vt;
    slot *s = t->slots;
    const size_t w = t->nslots;
    uint64_t i;
    size_t j, filled = fill_window(t, vt, size_larson, verify);
    bar_wait(r);
    t->t_start = now_ns();
    for (i = 0; i < t->ops && filled == w; i++) {
        if ((i & (KPS_STOP_EVERY - 1)) == 0 && stopping(r)) break;
        uint64_t x = rnd(&t->rng);
        slot *e = &s[below(x, w)];
        size_t n = size_larson(x);
        uint64_t a = 0;
        int sample = (i & KPS_SAMPLE_MASK) == 0;
        if (sample) a = now_ns();
        /* A full ring is back-pressure, not a reason to free locally: the
         * thread frees what reaches it while it waits, so every replaced
         * block is freed by another thread whatever the scheduling. */
        unsigned k = 0;
        int pushed;
        while (!(pushed = ring_push(t, t->out, e->p, e->n)) && !stopping(r)) {
            drain(t, vt, verify);
            backoff(&k);
        }
        if (pushed) {
            t->remote++;
        } else {
            put_block(t, vt, e->p, e->n, verify);
            t->local++;
        }
        e->p = get_block(t, vt, n, verify);
        e->n = n;
        drain(t, vt, verify);
        if (sample) add_sample(t, now_ns() - a);
        if (!e->p) {
            i++;
            break;
        }
    }
    t->t_end = now_ns();
    t->done = i;
    ring_flush(t, t->out);
    /* Keep freeing what arrives until every thread has left its loop; after
     * that nothing more is pushed and one last drain empties the ring. */
    atomic_fetch_add_explicit(&r->loop_done, 1, memory_order_acq_rel);
    unsigned k = 0;
    while (atomic_load_explicit(&r->loop_done, memory_order_acquire) < r->nthreads) {
        drain(t, vt, verify);
        backoff(&k);
    }
    drain(t, vt, verify);
    for (j = 0; j < filled; j++)
        if (s[j].p) put_block(t, vt, s[j].p, s[j].n, verify);
}

/* ------------------------------------------------------------------------
 * prodcons: producers allocate, consumers free, paired by SPSC rings; an odd
 * thread out plays both roles alternately on a ring of its own.
 * ---------------------------------------------------------------------- */
KPS_INLINE void run_prodcons(kps_thread *t, const int verify) {
    kps_run *r = t->run;
    const alloc_vt *vt = r->vt;
    ring *q = t->role == 1 ? t->in : t->out;
    uint64_t i = 0, got = 0;
    ring_item it;
    bar_wait(r);
    t->t_start = now_ns();
    if (t->role == 0) {                                       /* producer */
        unsigned k = 0;
        for (i = 0; i < t->ops; i++) {
            if ((i & (KPS_STOP_EVERY - 1)) == 0 && stopping(r)) break;
            size_t n = size_random(rnd(&t->rng));
            void *p;
            if ((i & KPS_SAMPLE_MASK) == 0) {
                uint64_t a = now_ns();
                p = get_block(t, vt, n, verify);
                add_sample(t, now_ns() - a);
            } else {
                p = get_block(t, vt, n, verify);
            }
            if (!p) break;
            while (!ring_push(t, q, p, n)) {
                if (stopping(r)) {
                    put_block(t, vt, p, n, verify);
                    p = NULL;
                    break;
                }
                backoff(&k);
            }
            if (!p) break;
            k = 0;
        }
        ring_flush(t, q);
        atomic_store_explicit(&q->closed, 1, memory_order_release);
        t->done = i;
    } else if (t->role == 1) {                                /* consumer */
        unsigned k = 0;
        for (;;) {
            if (ring_pop(t, q, &it)) {
                if ((got & KPS_SAMPLE_MASK) == 0) {
                    uint64_t a = now_ns();
                    put_block(t, vt, it.p, it.n, verify);
                    add_sample(t, now_ns() - a);
                } else {
                    put_block(t, vt, it.p, it.n, verify);
                }
                got++;
                k = 0;
                continue;
            }
            if (atomic_load_explicit(&q->closed, memory_order_acquire)) {
                if (!ring_pop(t, q, &it)) break;
                put_block(t, vt, it.p, it.n, verify);
                got++;
                continue;
            }
            backoff(&k);
        }
        t->done = 0;                                          /* counted by the producer */
    } else {                                                  /* both, alternately */
        while (i < t->ops && !stopping(r)) {
            uint64_t end = i + KPS_SOLO_BATCH < t->ops ? i + KPS_SOLO_BATCH : t->ops;
            for (; i < end; i++) {
                size_t n = size_random(rnd(&t->rng));
                void *p;
                if ((i & KPS_SAMPLE_MASK) == 0) {
                    uint64_t a = now_ns();
                    p = get_block(t, vt, n, verify);
                    add_sample(t, now_ns() - a);
                } else {
                    p = get_block(t, vt, n, verify);
                }
                if (!p) break;
                ring_push(t, q, p, n);                        /* never full: batch < ring */
            }
            ring_flush(t, q);
            while (ring_pop(t, q, &it)) put_block(t, vt, it.p, it.n, verify);
            if (i < end) break;
        }
        t->done = i;
    }
    t->t_end = now_ns();
}

/* ------------------------------------------------------------------------
 * burst: allocate burst_bytes of 64..4096 B blocks, free them all, watch RSS
 * ---------------------------------------------------------------------- */
/* Give idle memory back each allocator's own way: kp_trim (which meshes
 * too, where meshing is on), mimalloc's mi_collect(true), tcmalloc's
 * MallocExtension_ReleaseFreeMemory, jemalloc's arena purge, else
 * malloc_trim (glibc's, or the kpool drop-in's). Sets trim_kind and returns
 * the RSS after. */
static void *peer_symbol(const char *name) { return dlsym(RTLD_DEFAULT, name); }
static long trim_heap(kps_run *r) {
    void *sym;
    if (r->al == AL_KPOOL) {
        r->trim_bytes = kp_trim();
        r->trim_kind = "kp_trim";
    } else if ((sym = peer_symbol("mi_collect"))) {
        void (*collect)(_Bool);
        memcpy(&collect, &sym, sizeof collect);
        collect(1);
        r->trim_kind = "mi_collect";
    } else if ((sym = peer_symbol("MallocExtension_ReleaseFreeMemory"))) {
        void (*release)(void);
        memcpy(&release, &sym, sizeof release);
        release();
        r->trim_kind = "MallocExtension_ReleaseFreeMemory";
    } else if ((sym = peer_symbol("mallctl"))) {
        int (*ctl)(const char *, void *, size_t *, void *, size_t);
        memcpy(&ctl, &sym, sizeof ctl);
        if (ctl("arena.4096.purge", NULL, NULL, NULL, 0) == 0) r->trim_kind = "mallctl arena.<all>.purge";
    } else if ((sym = peer_symbol("malloc_trim"))) {
        int (*mt)(size_t);
        memcpy(&mt, &sym, sizeof mt);
        mt(0);
        r->trim_kind = "malloc_trim";
    }
    return r->trim_kind ? rss_now() : -1;
}

KPS_INLINE void run_burst(kps_thread *t, const int verify) {
    kps_run *r = t->run;
    const alloc_vt *vt = r->vt;
    uint64_t seed = t->rng, i, count = t->nptrs;
    void **ptrs = t->ptrs;
    bar_wait(r);
    if (t->id == 0) r->rss_base = rss_now();
    bar_wait(r);
    t->t_start = t->t_phase[0] = now_ns();
    for (i = 0; i < count; i++) {
        if ((i & (KPS_STOP_EVERY - 1)) == 0 && stopping(r)) break;
        size_t n = size_burst(rnd(&t->rng));
        unsigned char *p;
        if ((i & KPS_SAMPLE_MASK) == 0) {
            uint64_t a = now_ns();
            p = get_block(t, vt, n, verify);
            add_sample(t, now_ns() - a);
        } else {
            p = get_block(t, vt, n, verify);
        }
        if (!p) break;
        if (!verify && n > 2048) p[n / 2] = 1;   /* with both ends: every page (stamps do it too) */
        ptrs[i] = p;
    }
    count = t->done = i;
    t->t_phase[1] = now_ns();
    bar_wait(r);
    if (t->id == 0) r->rss_full = rss_now();
    bar_wait(r);
    t->t_phase[2] = now_ns();
    t->rng = seed;
    for (i = 0; i < count; i++) put_block(t, vt, ptrs[i], size_burst(rnd(&t->rng)), verify);
    t->t_end = t->t_phase[3] = now_ns();
    bar_wait(r);
    if (t->id == 0) {
        r->rss_free = rss_now();
        for (int k = 0; k < 100 && !stopping(r); k++) {  /* 1 s, in slices that a stop request cuts short */
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        r->rss_1s = rss_now();
        r->rss_trim = trim_heap(r);
    }
}

/* ------------------------------------------------------------------------
 * frag: many small blocks, free a random 90%, refill with bigger ones
 * ---------------------------------------------------------------------- */
KPS_INLINE void run_frag(kps_thread *t, const int verify) {
    kps_run *r = t->run;
    const alloc_vt *vt = r->vt;
    slot *s = t->slots, *b = t->slots2;
    uint64_t n1 = t->nslots, i, nb = 0;
    size_t live = 0, keep, left;
    bar_wait(r);
    if (t->id == 0) r->rss_base = rss_now();
    bar_wait(r);
    t->t_start = t->t_phase[0] = now_ns();
    for (i = 0; i < n1; i++) {                                  /* 1: small blocks */
        if ((i & (KPS_STOP_EVERY - 1)) == 0 && stopping(r)) break;
        size_t n = size_small(rnd(&t->rng));
        if ((i & KPS_SAMPLE_MASK) == 0) {
            uint64_t a = now_ns();
            s[i].p = get_block(t, vt, n, verify);
            add_sample(t, now_ns() - a);
        } else {
            s[i].p = get_block(t, vt, n, verify);
        }
        s[i].n = n;
        if (!s[i].p) break;
        live += n;
    }
    n1 = t->done = i;
    t->live[0] = live;
    t->t_phase[1] = now_ns();
    bar_wait(r);
    if (t->id == 0) r->frag_rss[0] = rss_now();
    bar_wait(r);
    keep = (size_t)(n1 / 10);                                   /* 2: free exactly 90% */
    left = (size_t)n1;
    for (i = 0; i < n1; i++, left--) {
        if (below(rnd(&t->rng), left) < keep) {                 /* selection sampling */
            keep--;
            continue;
        }
        put_block(t, vt, s[i].p, s[i].n, verify);
        live -= s[i].n;
        s[i].p = NULL;
    }
    t->live[1] = live;
    t->t_phase[2] = now_ns();
    bar_wait(r);
    if (t->id == 0) r->frag_rss[1] = rss_now();
    bar_wait(r);
    while (live < t->live[0] && nb < t->nslots2 && !stopping(r)) {   /* 3: refill */
        size_t n = size_big(rnd(&t->rng));
        b[nb].p = get_block(t, vt, n, verify);
        b[nb].n = n;
        if (!b[nb].p) break;
        live += n;
        nb++;
    }
    t->live[2] = live;
    t->t_end = t->t_phase[3] = now_ns();
    bar_wait(r);
    if (t->id == 0) r->frag_rss[2] = rss_now();
    bar_wait(r);
    if (t->id == 0) {                                           /* 4: trim (kpool: mesh) */
        uint64_t t0 = now_ns();
        r->frag_rss[3] = trim_heap(r);
        r->frag_trim_ns = now_ns() - t0;
    }
    bar_wait(r);
    for (i = 0; i < n1; i++)
        if (s[i].p) put_block(t, vt, s[i].p, s[i].n, verify);
    for (i = 0; i < nb; i++) put_block(t, vt, b[i].p, b[i].n, verify);
}

/* ------------------------------------------------------------------------
 * Worker
 * ---------------------------------------------------------------------- */
#define DISPATCH(fn, ...) do { if (v) fn(__VA_ARGS__, 1); else fn(__VA_ARGS__, 0); } while (0)

static void *worker(void *arg) {
    kps_thread *t = arg;
    kps_run *r = t->run;
    unsigned k = 0;
    while (!atomic_load_explicit(&r->go, memory_order_acquire)) backoff(&k);
    if (atomic_load_explicit(&r->abort_run, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&r->finished, 1, memory_order_release);
        return NULL;
    }
    int v = r->verify;
    switch (r->wl) {
    case WL_PAIRS:
        bar_wait(r);
        switch (r->al) {
        case AL_KPOOL: DISPATCH(run_pairs, t, &vt_table[AL_KPOOL]); break;
        case AL_KPOOL_POOL: DISPATCH(run_pairs, t, &vt_table[AL_KPOOL_POOL]); break;
        case AL_SYSTEM: DISPATCH(run_pairs, t, &vt_table[AL_SYSTEM]); break;
        default: DISPATCH(run_pairs, t, &vt_table[AL_NULL]); break;
        }
        break;
    case WL_MIXED: DISPATCH(run_window, t, size_mixed); break;
    case WL_RANDOM: DISPATCH(run_window, t, size_random); break;
    case WL_LARSON: DISPATCH(run_larson, t); break;
    case WL_PRODCONS: DISPATCH(run_prodcons, t); break;
    case WL_BURST: DISPATCH(run_burst, t); break;
    case WL_FRAG: DISPATCH(run_frag, t); break;
    default: break;
    }
    atomic_fetch_add_explicit(&r->finished, 1, memory_order_release);
    return NULL;
}

/* ------------------------------------------------------------------------
 * Set-up and tear-down
 * ---------------------------------------------------------------------- */
static int find_name(const char *const *names, const char *s) {
    if (!s) return -1;
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

static void fmt_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void free_arrays(kps_run *r) {
    if (r->th) {
        for (int i = 0; i < r->cfg.threads; i++) {
            kps_thread *t = &r->th[i];
            unmap_bytes(t->samples, t->cap * sizeof(uint64_t));
            unmap_bytes(t->nullbuf, t->nullsize);
            unmap_bytes(t->slots, t->nslots * sizeof(slot));
            unmap_bytes(t->slots2, t->nslots2 * sizeof(slot));
            unmap_bytes(t->ptrs, t->nptrs * sizeof(void *));
        }
        unmap_bytes(r->th, r->th_bytes);
    }
    unmap_bytes(r->rings, r->nrings * sizeof(ring));
    if (r->pool) kp_pool_destroy(r->pool);
    free(r->st0);
    free(r);
}

/* Blocks a burst thread allocates for `bytes`, replaying its RNG. */
static size_t burst_count(uint64_t rng, size_t bytes) {
    size_t total = 0, count = 0;
    while (total < bytes) {
        total += size_burst(rnd(&rng));
        count++;
    }
    return count;
}

static int prepare_thread(kps_run *r, kps_thread *t, int i) {
    int n = r->cfg.threads;
    uint64_t s = r->cfg.seed ^ ((uint64_t)(i + 1) * 0xd1b54a32d192ed03ull);
    t->run = r;
    t->id = i;
    t->rng = splitmix(&s) | 1;
    t->ops = r->cfg.ops / (uint64_t)n + ((uint64_t)i < r->cfg.ops % (uint64_t)n);
    t->pool = r->pool;
    uint64_t work = t->ops;
    switch (r->wl) {
    case WL_MIXED: t->nslots = KPS_MIXED_WINDOW; break;
    case WL_RANDOM: t->nslots = KPS_RANDOM_WINDOW; break;
    case WL_LARSON:
        t->nslots = KPS_LARSON_WINDOW;
        t->out = &r->rings[i];
        t->in = &r->rings[(i + n - 1) % n];
        break;
    case WL_PRODCONS: {
        /* units: n/2 producer-consumer pairs, plus one solo thread if n is odd */
        int pairs = n / 2, units = pairs + n % 2, u = i / 2;
        uint64_t uops = r->cfg.ops / (uint64_t)units + ((uint64_t)u < r->cfg.ops % (uint64_t)units);
        if (i < 2 * pairs) {
            t->role = i % 2;
            t->out = t->in = &r->rings[u];
        } else {
            t->role = 2;
            t->out = t->in = &r->rings[pairs];
        }
        t->ops = t->role == 1 ? 0 : uops;
        work = uops;                     /* a consumer samples as many frees */
        break;
    }
    case WL_BURST:
        t->nptrs = burst_count(t->rng, r->cfg.burst_bytes / (size_t)n + (i == 0 ? r->cfg.burst_bytes % (size_t)n : 0));
        work = t->nptrs;
        if (t->nptrs) {
            t->ptrs = map_bytes(t->nptrs * sizeof(void *));
            if (!t->ptrs) return -1;
            prefault(t->ptrs, t->nptrs * sizeof(void *));
        }
        break;
    case WL_FRAG:
        t->nslots = (size_t)t->ops;
        t->nslots2 = (size_t)t->ops;   /* live bytes of 8..256 B blocks need fewer 257+ B ones */
        break;
    default: break;
    }
    if (t->nslots) {
        t->slots = map_bytes(t->nslots * sizeof(slot));
        if (!t->slots) return -1;
        prefault(t->slots, t->nslots * sizeof(slot));
    }
    if (t->nslots2) {
        t->slots2 = map_bytes(t->nslots2 * sizeof(slot));
        if (!t->slots2) return -1;
        prefault(t->slots2, t->nslots2 * sizeof(slot));
    }
    /* Up to KPS_SAMPLES_MAX samples over all threads (32 MiB): a run
     * asked for 10^12 ops maps no more, and starts as soon as a short one. */
    size_t per_thread_max = KPS_SAMPLES_MAX / (size_t)r->cfg.threads + 4;
    uint64_t want = work / (KPS_SAMPLE_MASK + 1) + 4;
    t->cap = want < per_thread_max ? (size_t)want : per_thread_max;
    t->sample_rng = t->rng ^ 0x9e3779b97f4a7c15ull;
    if (!t->sample_rng) t->sample_rng = 1;
    t->samples = map_bytes(t->cap * sizeof(uint64_t));
    if (!t->samples) return -1;
    prefault(t->samples, t->cap * sizeof(uint64_t));
    if (r->al == AL_NULL) {
        t->nullsize = r->size > KPS_NULL_BUF ? r->size : KPS_NULL_BUF;
        t->nullbuf = map_bytes(t->nullsize);
        if (!t->nullbuf) return -1;
        prefault(t->nullbuf, t->nullsize);
    }
    return 0;
}

static int start_run(const kps_config *cfg, kps_run **out, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (!cfg || !out) {
        fmt_err(err, errlen, "no configuration");
        return -1;
    }
    *out = NULL;
    int wl = find_name(kps_workloads, cfg->workload);
    int al = find_name(kps_allocators, cfg->allocator);
    if (wl < 0) {
        fmt_err(err, errlen, "unknown workload '%s' (one of pairs, mixed, random, larson, prodcons, burst, frag)",
                cfg->workload ? cfg->workload : "(null)");
        return -1;
    }
    if (al < 0) {
        fmt_err(err, errlen, "unknown allocator '%s' (one of kpool, kpool-pool, system, null)",
                cfg->allocator ? cfg->allocator : "(null)");
        return -1;
    }
    if (cfg->threads < 1 || cfg->threads > KPS_MAX_THREADS) {
        fmt_err(err, errlen, "threads must be 1..%d, not %d", KPS_MAX_THREADS, cfg->threads);
        return -1;
    }
    if (cfg->ops < 1 || cfg->ops > ((uint64_t)1 << 40)) {
        fmt_err(err, errlen, "ops must be 1..2^40, not %llu", (unsigned long long)cfg->ops);
        return -1;
    }
    if (cfg->size > KPS_MAX_SIZE) {
        fmt_err(err, errlen, "size must be 0 (32) or 1..2^30, not %zu", cfg->size);
        return -1;
    }
    if (cfg->burst_bytes > ((size_t)1 << 40)) {
        fmt_err(err, errlen, "burst_bytes must be at most 2^40");
        return -1;
    }
    if (al == AL_KPOOL_POOL && wl != WL_PAIRS) {
        fmt_err(err, errlen, "allocator kpool-pool serves one block size: it runs the one-size workload 'pairs' only, not '%s'",
                kps_workloads[wl]);
        return -1;
    }
    if (wl == WL_FRAG && cfg->ops > ((uint64_t)1 << 28)) {
        fmt_err(err, errlen, "frag: ops (blocks) must be at most 2^28");
        return -1;
    }
    if (!(cfg->duration == 0 || (cfg->duration >= 1e-3 && cfg->duration <= 1e9))) {  /* NaN fails too */
        fmt_err(err, errlen, "duration must be 0 (no limit) or 0.001..1e9 seconds, not %g", cfg->duration);
        return -1;
    }
    kps_run *r = calloc(1, sizeof *r);
    if (!r) {
        fmt_err(err, errlen, "out of memory");
        return -2;
    }
    r->wl = wl;
    r->al = al;
    r->cfg = *cfg;
    r->cfg.workload = kps_workloads[wl];
    r->cfg.allocator = kps_allocators[al];
    if (!r->cfg.burst_bytes) r->cfg.burst_bytes = KPS_DEFAULT_BURST;
    r->size = cfg->size ? cfg->size : KPS_DEFAULT_SIZE;
    r->vt = &vt_table[al];
    r->verify = cfg->verify && al != AL_NULL;
    r->ops_requested = cfg->ops;
    r->epoch = atomic_load_explicit(&kps_epoch, memory_order_relaxed);
    const char *pre = getenv("LD_PRELOAD");
    if (al == AL_SYSTEM && pre && *pre) {
        const char *base = strrchr(pre, '/');
        snprintf(r->preload, sizeof r->preload, "%s", base ? base + 1 : pre);
    }
    int n = cfg->threads;
    if (al == AL_KPOOL_POOL) {
        r->pool = kp_pool_create(r->size, 0, 0);
        if (!r->pool) {
            fmt_err(err, errlen, "kp_pool_create(%zu) failed: %s", r->size, strerror(errno));
            free_arrays(r);
            return -2;
        }
    }
    if (wl == WL_LARSON || wl == WL_PRODCONS) {
        r->nrings = (size_t)(wl == WL_LARSON ? n : n / 2 + 1);
        r->rings = map_bytes(r->nrings * sizeof(ring));
        if (!r->rings) {
            fmt_err(err, errlen, "out of memory for rings");
            free_arrays(r);
            return -2;
        }
    }
    r->th_bytes = (size_t)n * sizeof(kps_thread);
    r->th = map_bytes(r->th_bytes);
    if (!r->th) {
        fmt_err(err, errlen, "out of memory for threads");
        free_arrays(r);
        return -2;
    }
    for (int i = 0; i < n; i++) {
        if (prepare_thread(r, &r->th[i], i) != 0) {
            fmt_err(err, errlen, "out of memory for the driver's arrays");
            free_arrays(r);
            return -2;
        }
    }
    if (al == AL_KPOOL) {
        r->st0 = calloc(1, sizeof(kp_stats));
        if (r->st0) {
            r->st0->struct_size = sizeof(kp_stats);
            if (kp_stats_get(r->st0) != 0) {
                free(r->st0);
                r->st0 = NULL;
            }
        }
    }
    rss_peak_reset();
    if (cfg->duration > 0) r->deadline_ns = now_ns() + (uint64_t)(cfg->duration * 1e9);
    int started = 0, rc = 0;
    for (; started < n; started++) {
        rc = pthread_create(&r->th[started].tid, NULL, worker, &r->th[started]);
        if (rc != 0) break;
        r->th[started].joinable = 1;
    }
    r->nthreads = started;
    r->bar_n = started;
    if (started < n) atomic_store_explicit(&r->abort_run, 1, memory_order_relaxed);
    atomic_store_explicit(&r->go, 1, memory_order_release);
    if (started < n) {
        for (int i = 0; i < started; i++) pthread_join(r->th[i].tid, NULL);
        fmt_err(err, errlen, "could not start thread %d of %d: %s", started + 1, n, strerror(rc));
        free_arrays(r);
        return -2;
    }
    *out = r;
    return 0;
}

/* A run counts as in progress from here, its setup (mapping and touching
 * its arrays) included, so kps_cancel_all counts it; a cancel during setup
 * stops it as soon as its threads start (the epoch it took has moved). */
int kps_start(const kps_config *cfg, kps_run **out, char *err, size_t errlen) {
    atomic_fetch_add_explicit(&kps_in_progress, 1, memory_order_relaxed);
    int rc = start_run(cfg, out, err, errlen);
    if (rc != 0) atomic_fetch_sub_explicit(&kps_in_progress, 1, memory_order_relaxed);
    return rc;
}

int kps_wait(kps_run *run, int timeout_ms) {
    if (!run) return 1;
    uint64_t deadline = now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
    for (;;) {
        if (atomic_load_explicit(&run->finished, memory_order_acquire) >= run->nthreads) return 1;
        if (timeout_ms >= 0 && now_ns() >= deadline) return 0;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

void kps_stop(kps_run *run) {
    if (run) set_stop(run, KPS_STOP_REQUEST);
}

void kps_cancel(kps_run *run) {
    if (run) set_stop(run, KPS_STOP_CANCEL);
}

int kps_cancel_all(void) {
    atomic_fetch_add_explicit(&kps_epoch, 1, memory_order_relaxed);
    return atomic_load_explicit(&kps_in_progress, memory_order_relaxed);
}

/* ------------------------------------------------------------------------
 * Result: JSON text
 * ---------------------------------------------------------------------- */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)k < b->cap - b->len) {
            b->len += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
}

static void sb_str(sbuf *b, const char *s) {
    if (!s) {
        sb_printf(b, "null");
        return;
    }
    sb_printf(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') sb_printf(b, "\\%c", c);
        else if (c < 0x20) sb_printf(b, "\\u%04x", c);
        else sb_printf(b, "%c", c);
    }
    sb_printf(b, "\"");
}

static void sb_rss(sbuf *b, const char *key, long v) {
    if (v < 0) sb_printf(b, ",\"%s\":null", key);
    else sb_printf(b, ",\"%s\":%ld", key, v);
}

/* The file that defines the malloc this process calls: libc, or a peer
 * preloaded with LD_PRELOAD (so that a preload that did not take is seen). */
static const char *malloc_library(void) {
    Dl_info info;
    void *sym = dlsym(RTLD_DEFAULT, "malloc");
    if (sym && dladdr(sym, &info) && info.dli_fname) return info.dli_fname;
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t pct(const uint64_t *s, size_t n, double q) {
    if (n == 0) return 0;
    size_t i = (size_t)(q * (double)n);
    return s[i >= n ? n - 1 : i];
}

static double ratio(long rss, long base, size_t live) {
    if (rss < 0 || live == 0) return 0.0;
    long d = base >= 0 ? rss - base : rss;
    return (double)(d < 0 ? 0 : d) / (double)live;
}

char *kps_finish(kps_run *r) {
    if (!r) return NULL;
    for (int i = 0; i < r->nthreads; i++)
        if (r->th[i].joinable) pthread_join(r->th[i].tid, NULL);
    /* The run's memory figures, before this function's own buffers (the
     * samples' copy, the sort's scratch, the JSON) can add to them. */
    long peak_rss = rss_peak(), final_rss = rss_now();
    int n = r->nthreads;
    uint64_t t0 = UINT64_MAX, t1 = 0, ops = 0, corrupt = 0;
    uint64_t pa0 = UINT64_MAX, pa1 = 0, pf0 = UINT64_MAX, pf1 = 0;
    size_t ns = 0;
    const char *error = NULL;
    for (int i = 0; i < n; i++) {
        kps_thread *t = &r->th[i];
        if (t->t_start && t->t_start < t0) t0 = t->t_start;
        if (t->t_end > t1) t1 = t->t_end;
        if (t->t_phase[0] && t->t_phase[0] < pa0) pa0 = t->t_phase[0];
        if (t->t_phase[1] > pa1) pa1 = t->t_phase[1];
        if (t->t_phase[2] && t->t_phase[2] < pf0) pf0 = t->t_phase[2];
        if (t->t_phase[3] > pf1) pf1 = t->t_phase[3];
        ops += t->done;
        corrupt += t->corrupt;
        ns += t->nsamples;
        if (!error && t->err[0]) error = t->err;
    }
    double secs = (t1 > t0 && t0 != UINT64_MAX) ? (double)(t1 - t0) / 1e9 : 0.0;
    uint64_t *all = malloc((ns ? ns : 1) * sizeof(uint64_t));
    size_t k = 0;
    if (all) {
        for (int i = 0; i < n; i++) {
            memcpy(all + k, r->th[i].samples, r->th[i].nsamples * sizeof(uint64_t));
            k += r->th[i].nsamples;
        }
        qsort(all, k, sizeof(uint64_t), cmp_u64);
    }
    int why = atomic_load_explicit(&r->stop, memory_order_relaxed);
    static const char *const why_names[] = {NULL, "stop", "cancel", "duration"};
    sbuf b = {malloc(4096), 0, 4096, 0};
    if (!b.s) b.oom = 1;
    sb_printf(&b, "{\"workload\":\"%s\",\"allocator\":\"%s\",\"threads\":%d", r->cfg.workload, r->cfg.allocator, n);
    sb_printf(&b, ",\"ops\":%llu,\"ops_requested\":%llu", (unsigned long long)ops, (unsigned long long)r->ops_requested);
    sb_printf(&b, ",\"seconds\":%.9f,\"ops_per_sec\":%.1f,\"ns_per_op\":%.3f", secs,
              secs > 0 ? (double)ops / secs : 0.0, ops ? secs * 1e9 / (double)ops : 0.0);
    sb_printf(&b, ",\"p50_ns\":%llu,\"p99_ns\":%llu,\"p999_ns\":%llu,\"max_ns\":%llu,\"samples\":%zu",
              (unsigned long long)pct(all, k, 0.50), (unsigned long long)pct(all, k, 0.99),
              (unsigned long long)pct(all, k, 0.999), (unsigned long long)(k ? all[k - 1] : 0), k);
    free(all);
    sb_rss(&b, "peak_rss", peak_rss);
    sb_rss(&b, "final_rss", final_rss);
    sb_printf(&b, ",\"corrupt\":%llu,\"error\":", (unsigned long long)corrupt);
    sb_str(&b, error);
    sb_printf(&b, ",\"stopped\":%s,\"stop_reason\":", why ? "true" : "false");
    sb_str(&b, why_names[why]);
    if (r->cfg.duration > 0) sb_printf(&b, ",\"duration\":%.6f", r->cfg.duration);
    else sb_printf(&b, ",\"duration\":null");
    sb_printf(&b, ",\"seed\":%llu,\"verify\":%s", (unsigned long long)r->cfg.seed, r->verify ? "true" : "false");
    if (r->wl == WL_PAIRS) sb_printf(&b, ",\"size\":%zu", r->size);
    else sb_printf(&b, ",\"size\":null");
    sb_printf(&b, ",\"preload\":");
    sb_str(&b, r->preload[0] ? r->preload : NULL);
    sb_printf(&b, ",\"kpool_version\":");
    sb_str(&b, kp_version());
    sb_printf(&b, ",\"malloc_library\":");
    sb_str(&b, malloc_library());
    if (r->wl == WL_LARSON) {
        uint64_t rem = 0, loc = 0;
        for (int i = 0; i < n; i++) {
            rem += r->th[i].remote;
            loc += r->th[i].local;
        }
        sb_printf(&b, ",\"larson_remote_frees\":%llu,\"larson_local_frees\":%llu", (unsigned long long)rem,
                  (unsigned long long)loc);
    }
    if (r->wl == WL_PRODCONS)
        sb_printf(&b, ",\"prodcons_producers\":%d,\"prodcons_consumers\":%d,\"prodcons_solo\":%d", n / 2, n / 2, n % 2);
    if (r->wl == WL_BURST) {
        sb_printf(&b, ",\"burst_bytes\":%zu", r->cfg.burst_bytes);
        sb_rss(&b, "rss_base", r->rss_base);
        sb_rss(&b, "rss_full", r->rss_full);
        sb_rss(&b, "rss_after_free", r->rss_free);
        sb_rss(&b, "rss_after_1s", r->rss_1s);
        if (r->trim_kind) sb_rss(&b, "rss_after_trim", r->rss_trim);
        else sb_printf(&b, ",\"rss_after_trim\":null");
        sb_printf(&b, ",\"trim\":");
        sb_str(&b, r->trim_kind);
        sb_printf(&b, ",\"alloc_seconds\":%.9f,\"free_seconds\":%.9f",
                  pa1 > pa0 && pa0 != UINT64_MAX ? (double)(pa1 - pa0) / 1e9 : 0.0,
                  pf1 > pf0 && pf0 != UINT64_MAX ? (double)(pf1 - pf0) / 1e9 : 0.0);
    }
    if (r->wl == WL_FRAG) {
        size_t live[3] = {0, 0, 0};
        for (int i = 0; i < n; i++)
            for (int j = 0; j < 3; j++) live[j] += r->th[i].live[j];
        sb_rss(&b, "frag_rss_base", r->rss_base);
        static const char *ph[3] = {"alloc", "free90", "refill"};
        for (int j = 0; j < 3; j++) {
            sb_rss(&b, j == 0 ? "frag_rss_alloc" : j == 1 ? "frag_rss_free90" : "frag_rss_refill", r->frag_rss[j]);
            sb_printf(&b, ",\"frag_live_%s\":%zu,\"frag_ratio_%s\":%.4f", ph[j], live[j], ph[j],
                      ratio(r->frag_rss[j], r->rss_base, live[j]));
        }
        if (r->trim_kind) {      /* the same live bytes as after the refill */
            sb_rss(&b, "frag_rss_trim", r->frag_rss[3]);
            sb_printf(&b, ",\"frag_ratio_trim\":%.4f", ratio(r->frag_rss[3], r->rss_base, live[2]));
        } else {
            sb_printf(&b, ",\"frag_rss_trim\":null,\"frag_ratio_trim\":null");
        }
        sb_printf(&b, ",\"frag_trim_seconds\":%.6f,\"frag_trim\":", (double)r->frag_trim_ns / 1e9);
        sb_str(&b, r->trim_kind);
    }
    if (r->al == AL_KPOOL && r->st0) {
        kp_stats *s1 = calloc(1, sizeof(kp_stats));
        if (s1) {
            s1->struct_size = sizeof(kp_stats);
            if (kp_stats_get(s1) == 0) {
                kp_stats *s0 = r->st0;
                sb_printf(&b, ",\"kpool_stats\":{\"enabled\":%u,\"bytes_mapped\":%zu,\"bytes_in_use\":%zu,"
                              "\"bytes_released\":%zu,\"allocs\":%llu,\"frees\":%llu,\"tcache_hits\":%llu,"
                              "\"tcache_misses\":%llu,\"central_fetches\":%llu,\"central_returns\":%llu,"
                              "\"pageheap_grows\":%llu,\"lock_contended\":%llu,\"lock_wait_ns\":%llu,"
                              "\"os_releases\":%llu,\"meshes\":%llu,\"bytes_meshed\":%zu}",
                          s1->enabled, s1->bytes_mapped, s1->bytes_in_use, s1->bytes_released,
                          (unsigned long long)(s1->allocs - s0->allocs), (unsigned long long)(s1->frees - s0->frees),
                          (unsigned long long)(s1->tcache_hits - s0->tcache_hits),
                          (unsigned long long)(s1->tcache_misses - s0->tcache_misses),
                          (unsigned long long)(s1->central_fetches - s0->central_fetches),
                          (unsigned long long)(s1->central_returns - s0->central_returns),
                          (unsigned long long)(s1->pageheap_grows - s0->pageheap_grows),
                          (unsigned long long)(s1->lock_contended - s0->lock_contended),
                          (unsigned long long)(s1->lock_wait_ns - s0->lock_wait_ns),
                          (unsigned long long)(s1->os_releases - s0->os_releases),
                          (unsigned long long)(s1->meshes - s0->meshes), s1->bytes_meshed);
            }
            free(s1);
        }
    }
    if (r->al == AL_KPOOL_POOL && r->pool) {
        kp_pool_stats ps;
        memset(&ps, 0, sizeof ps);
        ps.struct_size = sizeof ps;
        if (kp_pool_stats_get(r->pool, &ps) == 0)
            sb_printf(&b, ",\"pool_stats\":{\"allocs\":%llu,\"frees\":%llu,\"hits\":%llu,\"misses\":%llu,"
                          "\"bytes_mapped\":%zu,\"chunks\":%zu,\"block_size\":%zu}",
                      (unsigned long long)ps.allocs, (unsigned long long)ps.frees, (unsigned long long)ps.hits,
                      (unsigned long long)ps.misses, ps.bytes_mapped, ps.chunks, ps.block_size);
    }
    sb_printf(&b, "}");
    free_arrays(r);
    atomic_fetch_sub_explicit(&kps_in_progress, 1, memory_order_relaxed);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

void kps_free_json(char *json) { free(json); }
