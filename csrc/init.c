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

#include <stdlib.h>
#include <sys/auxv.h>

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
    for (unsigned c = 0; c < KP_NUM_CLASSES; c++) _kp_lock(&_kp_central(c)->lock);
    _kp_lock(_kp_pageheap_lock());
    _kp_lock(_kp_meta_lock());
}

static void fork_parent(void) {
    _kp_unlock(_kp_meta_lock());
    _kp_unlock(_kp_pageheap_lock());
    for (unsigned c = KP_NUM_CLASSES; c-- > 0;) _kp_unlock(&_kp_central(c)->lock);
    _kp_registry_unlock();
    _kp_pools_unlock_all();
    _kp_stats_fork_unlock();
}

/* The child's one thread is the one that forked, and it holds every lock
 * (fork_prepare): it releases them as the parent does, then gives back the
 * caches of the threads that did not come along. */
static void fork_child(void) {
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
    /* A key with low bits set turns a zeroed word into a misaligned link. */
    _kp_link_key = (uintptr_t)_kp_mix64(_kp_secret ^ 0x6b706f6f6c6b6579u) | 0x9;
    _kp_free_mark = (uintptr_t)_kp_mix64(_kp_secret ^ 0x6b706f6f6c6d6b21u) | 1;
}

void _kp_report_bad_link(const char *call, const void *obj) {
    _kp_error(call, obj, "a free block was written after it was freed (use after free, or an overflow from the "
                         "block before it): its free-list link is damaged; the rest of the list is dropped");
}

static void init_once_body(void) {
    draw_secret();
    _kp_pagemap_init();
    _kp_sizeclass_init();
    _kp_pageheap_init();
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
    atomic_load(&error_handler)(call, ptr, what);
}

void _kp_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "kpool: assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}

const char *kp_version(void) { return KPOOL_VERSION_STRING; }
