/* init.c: process-wide setup, fork handling and the error handler.
 *
 * Job: build the tables once (pthread_once), register the fork handlers and
 * the KPOOL_STATS=1 exit report, and route detected misuse to one handler.
 * fork(): the prepare handler takes every lock in the documented order
 * (kp_internal.h), so the child starts with consistent lists; the child
 * releases them (its thread is the one that took them) and gives back the
 * caches of the threads that do not exist in it, so it can allocate and
 * free at once.
 * Calls: every layer's init; tcache and pool for fork.
 * Locks: all of them, only in the fork handlers.
 */
#include "kp_internal.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/auxv.h>
#include <unistd.h>

_Atomic int _kp_initialized;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

void _kp_lock_init(kp_lock *l) {
    pthread_mutex_init(&l->mutex, NULL);
}

/* ---- fork ----------------------------------------------------------------- */

static void fork_prepare(void) {
    _kp_stats_fork_lock();
    _kp_pools_lock_all();
    _kp_registry_lock();
    _kp_mesh_fork_prepare();     /* meshed pages become private: fork would share them */
    for (unsigned c = 0; c < KP_NUM_CLASSES; c++) _kp_lock(&_kp_central(c)->lock);
    _kp_lock(_kp_pageheap_lock());
    _kp_lock(_kp_meta_lock());
}

static void fork_parent(void) {
    _kp_unlock(_kp_meta_lock());
    _kp_unlock(_kp_pageheap_lock());
    for (unsigned c = KP_NUM_CLASSES; c-- > 0;) _kp_unlock(&_kp_central(c)->lock);
    _kp_mesh_fork_release();
    _kp_registry_unlock();
    _kp_pools_unlock_all();
    _kp_stats_fork_unlock();
}

/* The child's one thread is the one that forked, and it holds every lock
 * (fork_prepare): it releases them as the parent does, then gives back the
 * caches of the threads that did not come along. */
static void fork_child(void) {
    _kp_mesh_fork_child();
    fork_parent();
    _kp_tcache_after_fork_child();
}

/* ---- init ------------------------------------------------------------------- */

KP_INTERNAL void _kp_pool_thread_flush(kp_tcache *tc);

uint64_t _kp_secret;
uintptr_t _kp_link_key, _kp_free_mark;

static void draw_secret(void) {
    uint64_t bits[2] = { 0, 0 };
    const void *random16 = (const void *)getauxval(AT_RANDOM);   /* 16 bytes from the kernel at exec */
    if (random16) memcpy(bits, random16, sizeof bits);
    _kp_secret = _kp_mix64(bits[0] ^ _kp_mix64(bits[1] ^ _kp_now_ns() ^ (uintptr_t)&bits));
    /* A key with low bits set turns a zeroed word into a misaligned link;
     * top bits neither 0 nor all ones turn a written pointer or small integer
     * into a link above 2^48 (_kp_link_ok). */
    _kp_link_key = (uintptr_t)_kp_mix64(_kp_secret ^ 0x6b706f6f6c6b6579u) | 0x9;
    uintptr_t top = _kp_link_key >> KP_ADDRESS_BITS;
    if (top == 0 || top == ((uintptr_t)1 << (64 - KP_ADDRESS_BITS)) - 1)
        _kp_link_key ^= (uintptr_t)0x5a5a << KP_ADDRESS_BITS;
    _kp_free_mark = (uintptr_t)_kp_mix64(_kp_secret ^ 0x6b706f6f6c6d6b21u) | 1;
}

void _kp_report_bad_link(const char *call, const void *obj) {
    _kp_error(call, obj, "a free block was written after it was freed (use after free, or an overflow from the "
                         "block before it): its free-list link is damaged; the rest of the list is dropped");
}

/* ---- guard sampling (KPOOL_GUARD) -------------------------------------------- */

unsigned _kp_guard_every;
static _Atomic unsigned guard_count;
static struct sigaction prev_segv;

int _kp_guard_sample(void) {
    return atomic_fetch_add_explicit(&guard_count, 1, memory_order_relaxed) % _kp_guard_every == 0;
}

/* Append s, or x in base 10 or 16, to buf at *n (async-signal-safe). */
static void put_str(char *buf, size_t *n, size_t cap, const char *s) {
    while (*s && *n + 1 < cap) buf[(*n)++] = *s++;
}
static void put_num(char *buf, size_t *n, size_t cap, uintptr_t x, unsigned base) {
    char tmp[24];
    int k = 0;
    do { tmp[k++] = "0123456789abcdef"[x % base]; x /= base; } while (x);
    if (base == 16) put_str(buf, n, cap, "0x");
    while (k && *n + 1 < cap) buf[(*n)++] = tmp[--k];
}

/* A fault on a guard page: name the block, then die of the signal as the
 * program would have. Any other fault goes to the handler that was there. */
static void on_fault(int sig, siginfo_t *si, void *ctx) {
    uintptr_t at = (uintptr_t)si->si_addr;
    kp_span *s = _kp_pagemap_get(at >> KP_PAGE_SHIFT);
    if (s && s->state == KP_SPAN_LARGE && s->guarded && (at >> KP_PAGE_SHIFT) == s->start + s->npages) {
        char msg[256];
        size_t n = 0;
        uintptr_t block = (uintptr_t)s->freelist;
        put_str(msg, &n, sizeof msg, "kpool: KPOOL_GUARD caught an access at ");
        put_num(msg, &n, sizeof msg, at, 16);
        put_str(msg, &n, sizeof msg, ", ");
        put_num(msg, &n, sizeof msg, at - (block + s->requested), 10);
        put_str(msg, &n, sizeof msg, " bytes past the end of a block of ");
        put_num(msg, &n, sizeof msg, s->requested, 10);
        put_str(msg, &n, sizeof msg, " bytes at ");
        put_num(msg, &n, sizeof msg, block, 16);
        put_str(msg, &n, sizeof msg, " (a heap overflow)\n");
        if (write(2, msg, n) < 0) {}
        signal(sig, SIG_DFL);                 /* the access faults again and ends the process */
        return;
    }
    if (prev_segv.sa_flags & SA_SIGINFO) {
        prev_segv.sa_sigaction(sig, si, ctx);
    } else if (prev_segv.sa_handler == SIG_DFL || prev_segv.sa_handler == SIG_IGN) {
        signal(sig, SIG_DFL);
    } else {
        prev_segv.sa_handler(sig);
    }
}

static void start_guard_sampling(void) {
    const char *env = getenv("KPOOL_GUARD");
    unsigned long every = env && *env ? strtoul(env, NULL, 10) : 0;
    if (every == 0 || every > UINT32_MAX) return;
    _kp_guard_every = (unsigned)every;
    _kp_install_segv(on_fault, &prev_segv);
}

void _kp_install_segv(void (*handler)(int, siginfo_t *, void *), struct sigaction *prev) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, prev);
}

#if KP_VALGRIND
int _kp_vg_on;
#endif

static void init_once_body(void) {
    KP_VG_INIT();             /* before any block exists (kp_valgrind.h) */
    draw_secret();
    start_guard_sampling();
    _kp_pagemap_init();
    _kp_sizeclass_init();
    _kp_pageheap_init();
    _kp_mesh_init();
    _kp_tcache_pool_hook = _kp_pool_thread_flush;
    /* The heap works from here on. pthread_atfork and atexit may call
     * malloc, which is kpool's own under a preload: such a call must find
     * kpool ready instead of waiting for this pthread_once to finish. */
    atomic_store(&_kp_initialized, 1);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    const char *show = getenv("KPOOL_STATS");
    if (show && *show && *show != '0') atexit(_kp_stats_print_at_exit);
}

void _kp_init(void) {
    if (KP_LIKELY(atomic_load_explicit(&_kp_initialized, memory_order_acquire))) return;
    pthread_once(&init_once, init_once_body);
}

__attribute__((constructor)) static void kp_constructor(void) { _kp_init(); }

/* ---- errors ------------------------------------------------------------------- */

static void default_handler(const char *call, const void *ptr, const char *what) {
    fprintf(stderr, "kpool: %s(%p): %s\n", call, ptr, what);
    fflush(stderr);
    abort();
}

static _Atomic(kp_error_handler) error_handler = default_handler;

kp_error_handler kp_set_error_handler(kp_error_handler h) {
    kp_error_handler prev = atomic_exchange(&error_handler, h ? h : default_handler);
    return prev == default_handler ? NULL : prev;
}

void _kp_error(const char *call, const void *ptr, const char *what) {
    int saved_errno = errno;   /* a returning handler leaves the call's errno as it was */
    atomic_load(&error_handler)(call, ptr, what);
    errno = saved_errno;
}

void _kp_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "kpool: assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}

const char *kp_version(void) { return KPOOL_VERSION_STRING; }
