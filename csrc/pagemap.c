/* pagemap.c: page number -> span, and page number -> size class.
 *
 * Job: a two-level radix tree over the 48-bit address space in 8 KiB pages
 * (2^17 root slots, leaves of 2^18 pages mapped on demand) holds the span
 * pointer of pages; one byte per page, the class byte, says what a page
 * holds: the size class of an in-use small span (1..128), a pool tag, or
 * KP_CLASS_LARGE / KP_CLASS_ARENA, 0 for anything else (free, foreign).
 * kp_free, kp_pool_free and kp_owns read only that byte. Class bytes live
 * in the flat class map, one byte per page of a window of KP_CLASSMAP_PAGES
 * pages (256 GiB of address space, 32 MiB reserved with MAP_NORESERVE:
 * only the pages holding bytes of kpool's spans become resident) placed
 * where kpool's own mappings land, so a lookup is one subtraction, one
 * compare and one load. A page outside the window keeps its class byte in
 * its radix leaf instead, so correctness never depends on where the kernel
 * puts a mapping. KPOOL_CLASSMAP_PAGES=N in the environment sets the
 * window's size (0: none, the radix tree answers everything).
 * Calls: os (to map leaves and reserve the window).
 * Invariants: every page of an in-use SMALL or POOL span maps to it; other
 *   in-use spans (LARGE, ARENA) and free spans map their first and last page
 *   (for coalescing and validation; their interior pages are told by the
 *   class byte); other entries may be stale, so a lookup of an untrusted
 *   pointer validates the span's bounds and state (_kp_span_of, under the
 *   page heap lock). A page's class byte is in exactly one place: the window
 *   if the page is inside it, else its leaf. Leaves are never unmapped.
 * Locks: writes happen under the page heap lock (class bytes of a span that
 *   is not yet handed out may be written by its only owner); reads take
 *   none (atomic acquire of the leaf, relaxed/acquire of the entries).
 */
#include "kp_internal.h"

#include <stdlib.h>

_Atomic(kp_pagemap_leaf *) _kp_pagemap_root[(size_t)1 << KP_ROOT_BITS];
kp_classmap _kp_classmap;
static _Atomic size_t leaf_bytes;

/* The window: KPOOL_CLASSMAP_PAGES pages (default KP_CLASSMAP_PAGES), of
 * which 1/8 lies above the map's own address and 7/8 below it: the kernel
 * places anonymous mappings top-down, so kpool's later ones land below. */
void _kp_pagemap_init(void) {
    size_t pages = KP_CLASSMAP_PAGES;
    const char *env = getenv("KPOOL_CLASSMAP_PAGES");
    if (env && *env) pages = (size_t)strtoull(env, NULL, 0);
    if (pages > KP_CLASSMAP_PAGES_MAX) pages = KP_CLASSMAP_PAGES_MAX;
    if (pages == 0) return;
    void *bytes = _kp_os_reserve(pages);
    if (!bytes) return;              /* no address space for it: the radix tree answers */
    uintptr_t here = (uintptr_t)bytes >> KP_PAGE_SHIFT;
    uintptr_t base = here > pages - pages / 8 ? here - (pages - pages / 8) : 0;
    atomic_store_explicit(&_kp_classmap.base, base, memory_order_relaxed);
    atomic_store_explicit(&_kp_classmap.bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&_kp_classmap.pages, pages, memory_order_release);
}

size_t _kp_pagemap_bytes(void) { return atomic_load_explicit(&leaf_bytes, memory_order_relaxed); }

unsigned _kp_pagemap_class_radix(const void *p) {
    uintptr_t pn = (uintptr_t)p >> KP_PAGE_SHIFT;
    if (pn >> KP_PAGEMAP_BITS) return 0;
    kp_pagemap_leaf *leaf = atomic_load_explicit(&_kp_pagemap_root[pn >> KP_LEAF_BITS], memory_order_acquire);
    if (leaf == NULL) return 0;
    return atomic_load_explicit(&leaf->classes[pn & (KP_LEAF_PAGES - 1)], memory_order_relaxed);
}

int _kp_pagemap_ensure(uintptr_t pn, size_t npages) {
    if (((pn + npages) >> KP_PAGEMAP_BITS) != 0) return -1;
    for (uintptr_t key = pn >> KP_LEAF_BITS; key <= (pn + npages - 1) >> KP_LEAF_BITS; key++) {
        if (atomic_load_explicit(&_kp_pagemap_root[key], memory_order_relaxed)) continue;
        kp_pagemap_leaf *leaf = _kp_os_map(sizeof(kp_pagemap_leaf), 0);
        if (!leaf) return -1;
        atomic_fetch_add_explicit(&leaf_bytes, sizeof(kp_pagemap_leaf), memory_order_relaxed);
        atomic_store_explicit(&_kp_pagemap_root[key], leaf, memory_order_release);
    }
    return 0;
}

static kp_pagemap_leaf *leaf_of(uintptr_t pn) {
    return atomic_load_explicit(&_kp_pagemap_root[pn >> KP_LEAF_BITS], memory_order_relaxed);
}

void _kp_pagemap_set(uintptr_t pn, kp_span *s) {
    kp_pagemap_leaf *leaf = leaf_of(pn);
    kp_assert(leaf != NULL);
    atomic_store_explicit(&leaf->spans[pn & (KP_LEAF_PAGES - 1)], s, memory_order_release);
}

void _kp_pagemap_set_range(uintptr_t pn, size_t npages, kp_span *s) {
    for (size_t i = 0; i < npages; i++) _kp_pagemap_set(pn + i, s);
}

void _kp_pagemap_set_ends(uintptr_t pn, size_t npages, kp_span *s) {
    _kp_pagemap_set(pn, s);
    _kp_pagemap_set(pn + npages - 1, s);
}

/* Class bytes of pages outside the window, in their leaves. */
static void set_class_in_leaves(uintptr_t pn, size_t npages, unsigned cls) {
    for (size_t i = 0; i < npages; i++) {
        kp_pagemap_leaf *leaf = leaf_of(pn + i);
        atomic_store_explicit(&leaf->classes[(pn + i) & (KP_LEAF_PAGES - 1)], (uint8_t)cls, memory_order_relaxed);
    }
}

/* n class bytes from b. Eight at a time where aligned: a large block's pages
 * are written at every alloc and free. Readers load single bytes; an
 * aligned 8-byte store is single-copy atomic on x86-64, so each byte a
 * reader sees is the old or the new one. ThreadSanitizer builds store byte
 * by byte, so the race checker sees only accesses it models. */
static void set_class_bytes(_Atomic uint8_t *b, size_t n, unsigned cls) {
    size_t i = 0;
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    typedef uint64_t __attribute__((may_alias)) word;
    uint64_t w = (uint64_t)(uint8_t)cls * 0x0101010101010101u;
    for (; i < n && ((uintptr_t)(b + i) & 7); i++) atomic_store_explicit(&b[i], (uint8_t)cls, memory_order_relaxed);
    for (; i + 8 <= n; i += 8) __atomic_store_n((word *)(void *)(b + i), w, __ATOMIC_RELAXED);
#endif
    for (; i < n; i++) atomic_store_explicit(&b[i], (uint8_t)cls, memory_order_relaxed);
}

void _kp_pagemap_set_class(uintptr_t pn, size_t npages, unsigned cls) {
    size_t pages = atomic_load_explicit(&_kp_classmap.pages, memory_order_acquire);
    uintptr_t base = atomic_load_explicit(&_kp_classmap.base, memory_order_relaxed);
    _Atomic uint8_t *bytes = atomic_load_explicit(&_kp_classmap.bytes, memory_order_relaxed);
    uintptr_t end = pn + npages, lo = pn > base ? pn : base, hi = end < base + pages ? end : base + pages;
    if (!pages || lo >= hi) {                     /* wholly outside the window */
        set_class_in_leaves(pn, npages, cls);
        return;
    }
    if (pn < lo) set_class_in_leaves(pn, lo - pn, cls);
    set_class_bytes(bytes + (lo - base), hi - lo, cls);
    if (hi < end) set_class_in_leaves(hi, end - hi, cls);
}

kp_span *_kp_span_of(const void *p) {
    uintptr_t pn = (uintptr_t)p >> KP_PAGE_SHIFT;
    kp_span *s = _kp_pagemap_get(pn);
    if (!s) return NULL;
    if (s->state == KP_SPAN_DEAD || s->state == KP_SPAN_FREE) return NULL;
    if (pn < s->start || pn >= s->start + s->npages) return NULL;
    return s;
}
