/* preload/malloc.c: libkpool-malloc.so, kpool as the process's malloc.
 *
 * LD_PRELOAD=libkpool-malloc.so (or linking it before libc) routes the C
 * allocation calls, and C++'s operator new and delete, to kpool's heap.
 * The library holds its own copy of the core, compiled with hidden
 * visibility; its version script exports exactly the symbols defined here.
 *
 * Semantics follow glibc's where C leaves a choice: malloc(0) and
 * realloc(NULL, 0) return a unique block; realloc(p, 0) frees p and returns
 * NULL; overflow in calloc and reallocarray gives ENOMEM; posix_memalign
 * returns EINVAL or ENOMEM and leaves *memptr (and errno) alone; memalign
 * rounds an alignment up to a power of two (EINVAL past 2^63); free keeps
 * errno. aligned_alloc with an alignment that is not a power of two is
 * EINVAL, as C17 and glibc 2.38 have it (older glibc rounded it up).
 *
 * Foreign pointers: a pointer kpool never mapped (glibc's own __libc_malloc
 * blocks, say) is handed to glibc: free to __libc_free, realloc to
 * __libc_realloc, malloc_usable_size to glibc's, so glibc judges it exactly
 * as it would without kpool. Telling the two apart is one lock-free load of
 * kpool's class map (kp_owns). Such frees are counted (KPOOL_STATS=1).
 *
 * C++: operator new calls the new_handler and retries, then throws
 * std::bad_alloc, through libstdc++'s own functions found at run time, so
 * this library stays C and adds no libstdc++ to C programs. Sized and
 * aligned deletes go to kp_free_sized / kp_free.
 *
 * Start-up: the first call initialises kpool (no stdio, no dlsym, no malloc
 * of its own on that path). Locks: none here; those of the core.
 */
#include "kp_internal.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* glibc's allocator, for pointers that are not kpool's. */
extern void __libc_free(void *p);
extern void *__libc_realloc(void *p, size_t size);

static _Atomic uint64_t foreign_frees;

static void hand_foreign_to_glibc(void *p) {
    atomic_fetch_add_explicit(&foreign_frees, 1, memory_order_relaxed);
    __libc_free(p);
}

static void report_foreign_at_exit(void) {
    uint64_t n = atomic_load_explicit(&foreign_frees, memory_order_relaxed);
    fprintf(stderr, "kpool-malloc: %llu frees of pointers kpool did not allocate went to glibc\n",
            (unsigned long long)n);
}

/* The core's weak hook, defined here: set before any call can reach it. */
void (*_kp_foreign_free_hook)(void *p) = hand_foreign_to_glibc;

/* kpool itself initialises on the first call (or in its own constructor). */
__attribute__((constructor)) static void preload_init(void) {
    const char *show = getenv("KPOOL_STATS");
    if (show && *show && *show != '0') atexit(report_foreign_at_exit);
}

EXPORT void *malloc(size_t size) { return kp_malloc(size); }

EXPORT void free(void *p) { kp_free(p); }   /* kp_free keeps errno */

EXPORT void *calloc(size_t count, size_t size) { return kp_calloc(count, size); }

EXPORT void *realloc(void *p, size_t size) {
    if (!p) return kp_malloc(size);
    if (KP_UNLIKELY(!kp_owns(p))) return __libc_realloc(p, size);
    if (size == 0) {
        free(p);
        return NULL;
    }
    return kp_realloc(p, size);
}

EXPORT void *reallocarray(void *p, size_t count, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, total);
}

/* glibc: an alignment past 2^63 is EINVAL; one that is not a power of two
 * is rounded up to one (2^63 at most: then ENOMEM, as no block fits). */
EXPORT void *memalign(size_t alignment, size_t size) {
    if (alignment <= KP_MIN_ALIGN) return kp_malloc(size);
    if (alignment > SIZE_MAX / 2 + 1) {
        errno = EINVAL;
        return NULL;
    }
    if (!_kp_is_pow2(alignment)) alignment = (size_t)1 << (64 - __builtin_clzll(alignment));
    void *p = kp_aligned_alloc(alignment, size);
    if (!p) errno = ENOMEM;   /* the alignment is valid: what failed is finding room */
    return p;
}

EXPORT void *aligned_alloc(size_t alignment, size_t size) {
    if (!_kp_is_pow2(alignment)) {
        errno = EINVAL;
        return NULL;
    }
    return kp_aligned_alloc(alignment, size);
}

EXPORT int posix_memalign(void **memptr, size_t alignment, size_t size) {
    if (!_kp_is_pow2(alignment) || alignment % sizeof(void *)) return EINVAL;
    int saved = errno;
    void *p = kp_aligned_alloc(alignment, size);
    if (!p) {
        int err = errno;
        errno = saved;
        return err == EINVAL ? EINVAL : ENOMEM;
    }
    *memptr = p;
    return 0;
}

static size_t os_page(void) {
    static _Atomic size_t page;
    size_t n = atomic_load_explicit(&page, memory_order_relaxed);
    if (!n) {
        n = (size_t)sysconf(_SC_PAGESIZE);
        atomic_store_explicit(&page, n, memory_order_relaxed);
    }
    return n;
}

EXPORT void *valloc(size_t size) { return kp_aligned_alloc(os_page(), size); }

EXPORT void *pvalloc(size_t size) {
    size_t page = os_page();
    if (size > SIZE_MAX - page) {
        errno = ENOMEM;
        return NULL;
    }
    return kp_aligned_alloc(page, size ? _kp_align_up(size, page) : page);
}

EXPORT size_t malloc_usable_size(void *p) {
    if (!p) return 0;
    if (KP_LIKELY(kp_owns(p))) return kp_usable_size(p);
    static size_t (*glibc_usable)(void *);
    if (!glibc_usable) glibc_usable = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
    return glibc_usable ? glibc_usable(p) : 0;
}

/* C23. A foreign pointer reaches the core's foreign-free hook, as in free. */
EXPORT void free_sized(void *p, size_t size) { kp_free_sized(p, size); }

EXPORT void free_aligned_sized(void *p, size_t alignment, size_t size) {
    (void)alignment;
    free_sized(p, size);
}

EXPORT int malloc_trim(size_t pad) {
    (void)pad;
    return kp_trim() > 0;
}

/* glibc's figures, answered from kpool's with glibc's meanings: large
 * blocks (over 256 KiB, their own spans) stand for glibc's mmapped chunks
 * (hblks, hblkhd) and are not in arena or uordblks; arena = uordblks +
 * fordblks, the small heap's bytes in use plus the free bytes kpool holds
 * resident (caches, central lists, page heap; pages given back to the OS
 * are not counted, so arena falls after malloc_trim); ordblks = free spans;
 * keepcost = the largest free span. smblks, usmblks, fsmblks are 0. */
EXPORT struct mallinfo2 mallinfo2(void) {
    kp_stats st = { .struct_size = offsetof(kp_stats, classes) };
    struct mallinfo2 mi = { 0 };
    if (kp_stats_get(&st) != 0) return mi;
    kp_pageheap_figures ph;
    _kp_pageheap_figures(&ph);
    mi.hblks = ph.large_allocs - ph.large_frees;
    mi.hblkhd = st.bytes_large;
    mi.uordblks = st.bytes_in_use > st.bytes_large ? st.bytes_in_use - st.bytes_large : 0;
    mi.fordblks = st.bytes_free_tcaches + st.bytes_free_central + st.bytes_free_pageheap;
    mi.arena = mi.uordblks + mi.fordblks;
    mi.ordblks = ph.spans_free;
    mi.keepcost = st.largest_free_span;
    return mi;
}

EXPORT struct mallinfo mallinfo(void) {
    struct mallinfo2 m = mallinfo2();
    struct mallinfo mi = { 0 };
#define CLAMP_INT(x) ((x) > (size_t)INT32_MAX ? INT32_MAX : (int)(x))
    mi.arena = CLAMP_INT(m.arena);
    mi.ordblks = CLAMP_INT(m.ordblks);
    mi.hblks = CLAMP_INT(m.hblks);
    mi.hblkhd = CLAMP_INT(m.hblkhd);
    mi.uordblks = CLAMP_INT(m.uordblks);
    mi.fordblks = CLAMP_INT(m.fordblks);
    mi.keepcost = CLAMP_INT(m.keepcost);
#undef CLAMP_INT
    return mi;
}

EXPORT void malloc_stats(void) { kp_stats_print(stderr); }

/* ---- C++ operators ------------------------------------------------------------
 * The mangled names of operator new/delete. new: loop on the new_handler,
 * then throw std::bad_alloc; the nothrow forms return NULL, through
 * libstdc++'s own nothrow new when a handler is set (its try/catch stops a
 * handler's exception, which must not leave a noexcept function). libstdc++'s
 * functions are looked up when first needed, in the global scope and else in
 * the scope of the library that called new: a program that calls operator
 * new has libstdc++ loaded, but a library that Python or dlopen loaded with
 * RTLD_LOCAL may have brought it in where the global scope cannot see it. */
typedef void (*new_handler_fn)(void);
typedef struct { char unused; } nothrow_tag;  /* std::nothrow_t, passed by reference */
typedef void *(*nothrow_new_fn)(size_t, const nothrow_tag *);
typedef void *(*nothrow_new_aligned_fn)(size_t, size_t, const nothrow_tag *);

/* name in the scope of the object that holds caller (its dependencies
 * included), or NULL. */
static void *symbol_near(const char *name, const void *caller) {
    Dl_info info;
    if (!caller || !dladdr(caller, &info) || !info.dli_fname || !info.dli_fname[0]) return NULL;
    void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return NULL;
    void *s = dlsym(h, name);
    dlclose(h);
    return s;
}

static void *cxx_symbol(const char *name, const void *caller) {
    void *s = dlsym(RTLD_DEFAULT, name);
    return s ? s : symbol_near(name, caller);
}

/* libstdc++'s definition of name, not this library's (self), or NULL. */
static void *cxx_next_symbol(const char *name, const void *caller, const void *self) {
    void *s = dlsym(RTLD_NEXT, name);
    if (!s || s == self) s = symbol_near(name, caller);
    return s == self ? NULL : s;
}

static new_handler_fn current_new_handler(const void *caller) {
    static new_handler_fn (*_Atomic get_handler)(void);
    new_handler_fn (*get)(void) = atomic_load_explicit(&get_handler, memory_order_acquire);
    if (!get) {
        get = (new_handler_fn (*)(void))cxx_symbol("_ZSt15get_new_handlerv", caller);
        if (get) atomic_store_explicit(&get_handler, get, memory_order_release);
    }
    return get ? get() : NULL;
}

/* 0 when there is no new_handler (then the caller fails). */
static int call_new_handler(const void *caller) {
    new_handler_fn h = current_new_handler(caller);
    if (!h) return 0;
    h();
    return 1;
}

__attribute__((noreturn)) static void throw_bad_alloc(const void *caller) {
    void *(*allocate_exception)(size_t) = (void *(*)(size_t))cxx_symbol("__cxa_allocate_exception", caller);
    void (*cxa_throw)(void *, void *, void (*)(void *)) =
        (void (*)(void *, void *, void (*)(void *)))cxx_symbol("__cxa_throw", caller);
    void *type_info = cxx_symbol("_ZTISt9bad_alloc", caller);
    char *vtable = cxx_symbol("_ZTVSt9bad_alloc", caller);
    void (*destroy)(void *) = (void (*)(void *))cxx_symbol("_ZNSt9bad_allocD1Ev", caller);
    if (allocate_exception && cxa_throw && type_info && vtable && destroy) {
        void **e = allocate_exception(sizeof(void *));
        *e = vtable + 2 * sizeof(void *);   /* the object's vptr: past offset-to-top and typeinfo */
        cxa_throw(e, type_info, destroy);
    }
    static const char msg[] = "kpool-malloc: operator new: out of memory, and std::bad_alloc cannot be thrown\n";
    if (write(2, msg, sizeof msg - 1) < 0) {}
    abort();
}

EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const nothrow_tag *t);
EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_tag *t);

static void *cxx_new(size_t size, size_t align, int nothrow, const void *caller) {
    for (;;) {
        void *p = align > KP_MIN_ALIGN ? kp_aligned_alloc(align, size) : kp_malloc(size);
        if (KP_LIKELY(p != NULL)) return p;
        if (nothrow && current_new_handler(caller)) {
            /* libstdc++'s nothrow new calls the throwing one (this
             * library's) inside its try/catch: NULL if the handler throws */
            static const nothrow_tag tag;
            if (align > KP_MIN_ALIGN) {
                nothrow_new_aligned_fn f = (nothrow_new_aligned_fn)cxx_next_symbol(
                    "_ZnwmSt11align_val_tRKSt9nothrow_t", caller, (const void *)_ZnwmSt11align_val_tRKSt9nothrow_t);
                if (f) return f(size, align, &tag);
            } else {
                nothrow_new_fn f = (nothrow_new_fn)cxx_next_symbol("_ZnwmRKSt9nothrow_t", caller,
                                                                     (const void *)_ZnwmRKSt9nothrow_t);
                if (f) return f(size, &tag);
            }
        }
        if (!call_new_handler(caller)) {
            if (nothrow) return NULL;
            throw_bad_alloc(caller);
        }
    }
}

static void cxx_delete(void *p) { free(p); }
static void cxx_delete_sized(void *p, size_t size) { free_sized(p, size); }

/* operator new(size_t) and new[](size_t); the same with std::nothrow */
#define CALLER __builtin_return_address(0)
EXPORT void *_Znwm(size_t n) { return cxx_new(n, 0, 0, CALLER); }
EXPORT void *_Znam(size_t n) { return cxx_new(n, 0, 0, CALLER); }
EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const nothrow_tag *t) { (void)t; return cxx_new(n, 0, 1, CALLER); }
EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const nothrow_tag *t) { (void)t; return cxx_new(n, 0, 1, CALLER); }
/* aligned (C++17) */
EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t a) { return cxx_new(n, a, 0, CALLER); }
EXPORT void *_ZnamSt11align_val_t(size_t n, size_t a) { return cxx_new(n, a, 0, CALLER); }
EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_tag *t) {
    (void)t;
    return cxx_new(n, a, 1, CALLER);
}
EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_tag *t) {
    (void)t;
    return cxx_new(n, a, 1, CALLER);
}
#undef CALLER
/* delete and delete[]: plain, sized (C++14), nothrow, aligned, aligned sized */
EXPORT void _ZdlPv(void *p) { cxx_delete(p); }
EXPORT void _ZdaPv(void *p) { cxx_delete(p); }
EXPORT void _ZdlPvm(void *p, size_t n) { cxx_delete_sized(p, n); }
EXPORT void _ZdaPvm(void *p, size_t n) { cxx_delete_sized(p, n); }
EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const nothrow_tag *t) { (void)t; cxx_delete(p); }
EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const nothrow_tag *t) { (void)t; cxx_delete(p); }
EXPORT void _ZdlPvSt11align_val_t(void *p, size_t a) { (void)a; cxx_delete(p); }
EXPORT void _ZdaPvSt11align_val_t(void *p, size_t a) { (void)a; cxx_delete(p); }
EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t a) { (void)a; cxx_delete_sized(p, n); }
EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t a) { (void)a; cxx_delete_sized(p, n); }
EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const nothrow_tag *t) { (void)a; (void)t; cxx_delete(p); }
EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const nothrow_tag *t) { (void)a; (void)t; cxx_delete(p); }
