/* pagemap.c: page number -> span, and page number -> size class.
 *
 * Job: a two-level radix tree over the 48-bit address space in 8 KiB pages
 * (2^17 root slots, leaves of 2^18 pages mapped on demand). Each leaf holds
 * the span pointer of every page and, beside it, one byte per page: the
 * size class of an in-use small span (1..128), KP_CLASS_POOL_SLOT0 + slot
 * for a cached pool's chunk, KP_CLASS_POOL for any other pool chunk, 0
 * otherwise. kp_free reads only that byte on its fast path, from a flat
 * copy of the class bytes (one byte per page of the 47-bit user address
 * space, 16 GiB of address space reserved with MAP_NORESERVE: only the pages
 * holding bytes of kpool's spans are ever written). Without that reservation
 * the radix tree answers.
 * Calls: os (to map leaves).
 * Invariants: every page of an in-use span maps to it; a free span maps its
 *   first and last page (for coalescing); other entries may be stale, so a
 *   lookup of an untrusted pointer validates the span's bounds and state
 *   (_kp_span_of, under the page heap lock). Leaves are never unmapped.
 * Locks: writes happen under the page heap lock; reads take none (atomic
 *   acquire of the leaf, relaxed/acquire of the entries).
 */
#include "kp_internal.h"

_Atomic(kp_pagemap_leaf *) _kp_pagemap_root[(size_t)1 << KP_ROOT_BITS];
kp_classmap _kp_classmap;

void _kp_pagemap_init(void) {
    size_t pages = (size_t)1 << KP_CLASSMAP_BITS;
    void *bytes = _kp_os_reserve(pages);
    if (!bytes) return;              /* no address space for it: the radix tree answers */
    atomic_store_explicit(&_kp_classmap.bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&_kp_classmap.pages, pages, memory_order_release);
}

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

void _kp_pagemap_set_class(uintptr_t pn, size_t npages, unsigned cls) {
    size_t flat = atomic_load_explicit(&_kp_classmap.pages, memory_order_acquire);
    _Atomic uint8_t *bytes = atomic_load_explicit(&_kp_classmap.bytes, memory_order_relaxed);
    for (size_t i = 0; i < npages; i++) {
        kp_pagemap_leaf *leaf = leaf_of(pn + i);
        atomic_store_explicit(&leaf->classes[(pn + i) & (KP_LEAF_PAGES - 1)], (uint8_t)cls, memory_order_relaxed);
        if (pn + i < flat) atomic_store_explicit(&bytes[pn + i], (uint8_t)cls, memory_order_relaxed);
    }
}

kp_span *_kp_span_of(const void *p) {
    uintptr_t pn = (uintptr_t)p >> KP_PAGE_SHIFT;
    kp_span *s = _kp_pagemap_get(pn);
    if (!s) return NULL;
    if (s->state == KP_SPAN_DEAD || s->state == KP_SPAN_FREE) return NULL;
    if (pn < s->start || pn >= s->start + s->npages) return NULL;
    return s;
}
