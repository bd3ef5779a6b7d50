/* pageheap.c: spans of pages.
 *
 * Job: carve spans out of memory mapped from the OS, take them back,
 * coalesce a freed span with its free neighbours, serve large requests as
 * spans directly, and give idle pages back to the OS: at once when the free,
 * unreleased bytes pass the retention budget (oldest first, down to half of
 * it), after KP_DECAY_MS of idleness, and on kp_trim. The budget is a
 * quarter of the bytes in use (KP_RETAIN_DIV), within [KP_RETAIN_MIN,
 * KP_RETAIN_MAX]: a big heap that frees a part and grows back (a Python
 * program dropping one result for the next) keeps the pages instead of
 * faulting them in again, and a small program keeps little. Requests take
 * resident pages first: free spans, then the kept large spans (below),
 * then released ones.
 * Calls: pagemap (set entries), os (map, release), metadata (span structs).
 * Free lists: for 1..128 pages one list per size, one list above; each kind
 * twice, for spans with resident pages ("normal") and released ones; a
 * bitmap of non-empty exact lists finds the first fit in O(1). Normal spans
 * are also on an age list, oldest first, for the decay.
 * Large blocks: a large block is a span of its own, and its figures live
 * here, under the lock. A large span grows in place into a free neighbour,
 * shrinks in place, and otherwise moves with mremap (its pages change
 * address, nothing is copied). A freed large span of at most
 * KP_RECENT_MAX_PAGES pages is kept whole a while in `recent` (state CACHED:
 * class bytes cleared, ends still mapped, not coalesced), so that a program
 * that allocates and frees blocks of one large size skips carving,
 * coalescing and most page-map writes; the decay, a request no free span
 * can serve, and kp_trim put them back.
 * Zeroed pages: spans carved from released spans (fresh from the OS, or
 * given back with MADV_DONTNEED) read as zero, which calloc uses.
 * Invariants (_kp_pageheap_is_valid): no two adjacent free spans of the same
 *   released state; free_bytes == pages of normal free spans; every free
 *   span is on the list its size and state say; recent_bytes == pages of
 *   the recent spans, all CACHED.
 * Locks: the page heap lock. It may be taken while holding a central class
 *   lock or a pool lock, never the reverse; under it only the metadata lock
 *   is taken.
 */
#include "kp_internal.h"

typedef struct span_lists {
    kp_span exact[KP_EXACT_LISTS + 1];   /* sentinels; [0] unused */
    kp_span large;                       /* more than KP_EXACT_LISTS pages */
    uint64_t bitmap[(KP_EXACT_LISTS + 64) / 64];
} span_lists;

static struct {
    kp_lock lock;
    span_lists normal, released;
    kp_span age;                   /* sentinel: normal free spans, oldest first */
    size_t mapped_bytes;
    size_t free_bytes;             /* normal free spans */
    size_t released_bytes;
    uint64_t grows, os_releases;
    uint64_t last_decay_ms;
    size_t state_bytes[KP_SPAN_CACHED + 1];
    kp_span *recent[KP_RECENT_SPANS];   /* freed large spans kept whole, oldest first */
    unsigned nrecent;
    size_t recent_bytes;
    size_t large_bytes, large_requested;   /* live large blocks */
    uint64_t large_allocs, large_frees;
} ph;

/* Figures read without the lock by stats. */
static _Atomic size_t ph_mapped, ph_released, ph_free;

kp_lock *_kp_pageheap_lock(void) { return &ph.lock; }

/* The size lists' sentinels start zeroed, and next == NULL means empty: the
 * 258 heads are not written at start-up, so only the pages holding lists in
 * use become resident. */
static int list_empty(const kp_span *sentinel) { return !sentinel->next || sentinel->next == sentinel; }
static kp_span *list_first(kp_span *sentinel) { return list_empty(sentinel) ? NULL : sentinel->next; }
static kp_span *list_next(const kp_span *sentinel, const kp_span *s) { return s->next == sentinel ? NULL : s->next; }
static void list_push(kp_span *sentinel, kp_span *s) {
    if (!sentinel->next) sentinel->next = sentinel->prev = sentinel;
    s->next = sentinel->next;
    s->prev = sentinel;
    sentinel->next->prev = s;
    sentinel->next = s;
}
static void list_remove(kp_span *s) {
    s->prev->next = s->next;
    s->next->prev = s->prev;
    s->next = s->prev = NULL;
}
static void age_push_tail(kp_span *s) {
    s->age_prev = ph.age.age_prev;
    s->age_next = &ph.age;
    ph.age.age_prev->age_next = s;
    ph.age.age_prev = s;
}
static void age_remove(kp_span *s) {
    s->age_prev->age_next = s->age_next;
    s->age_next->age_prev = s->age_prev;
    s->age_next = s->age_prev = NULL;
}

static void publish_figures(void) {
    atomic_store_explicit(&ph_mapped, ph.mapped_bytes, memory_order_relaxed);
    atomic_store_explicit(&ph_released, ph.released_bytes, memory_order_relaxed);
    atomic_store_explicit(&ph_free, ph.free_bytes, memory_order_relaxed);
}

void _kp_pageheap_init(void) {
    _kp_lock_init(&ph.lock);
    ph.age.age_next = ph.age.age_prev = &ph.age;
}

/* ---- free-list membership ------------------------------------------------ */

/* Put a FREE span on its lists and map its boundary pages. REQUIRES lock. */
static void insert_free(kp_span *s) {
    span_lists *L = s->released ? &ph.released : &ph.normal;
    if (s->npages <= KP_EXACT_LISTS) {
        list_push(&L->exact[s->npages], s);
        L->bitmap[s->npages / 64] |= (uint64_t)1 << (s->npages % 64);
    } else {
        list_push(&L->large, s);
    }
    if (s->released) {
        ph.released_bytes += s->npages * KP_PAGE_SIZE;
    } else {
        ph.free_bytes += s->npages * KP_PAGE_SIZE;
        age_push_tail(s);
    }
    _kp_pagemap_set(s->start, s);
    _kp_pagemap_set(s->start + s->npages - 1, s);
}

static void remove_free(kp_span *s) {
    span_lists *L = s->released ? &ph.released : &ph.normal;
    list_remove(s);
    if (s->npages <= KP_EXACT_LISTS && list_empty(&L->exact[s->npages]))
        L->bitmap[s->npages / 64] &= ~((uint64_t)1 << (s->npages % 64));
    if (s->released) {
        ph.released_bytes -= s->npages * KP_PAGE_SIZE;
    } else {
        ph.free_bytes -= s->npages * KP_PAGE_SIZE;
        age_remove(s);
    }
}

static kp_span *new_span_struct(uintptr_t start, size_t npages) {
    kp_span *s = _kp_meta_alloc(sizeof(kp_span));
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->start = start;
    s->npages = npages;
    s->state = KP_SPAN_FREE;
    return s;
}

static void kill_span_struct(kp_span *s) {
    s->state = KP_SPAN_DEAD;
    _kp_meta_free(s, sizeof(kp_span));
}

/* The neighbour free span that ends right before / starts right after s, if
 * it has the same released state. REQUIRES lock. */
static kp_span *free_neighbour(kp_span *s, int after) {
    uintptr_t pn = after ? s->start + s->npages : s->start - 1;
    if (!after && s->start == 0) return NULL;
    kp_span *n = _kp_pagemap_get(pn);
    if (!n || n->state != KP_SPAN_FREE || n->released != s->released) return NULL;
    if (after ? n->start != pn : n->start + n->npages != s->start) return NULL;
    return n;
}

/* Insert a FREE span, merged with free neighbours of the same state. */
static void insert_coalesced(kp_span *s) {
    kp_span *prev = free_neighbour(s, 0);
    if (prev) {
        remove_free(prev);
        s->start = prev->start;
        s->npages += prev->npages;
        if (prev->free_since_ms < s->free_since_ms) s->free_since_ms = prev->free_since_ms;
        kill_span_struct(prev);
    }
    kp_span *next = free_neighbour(s, 1);
    if (next) {
        remove_free(next);
        s->npages += next->npages;
        if (next->free_since_ms < s->free_since_ms) s->free_since_ms = next->free_since_ms;
        kill_span_struct(next);
    }
    insert_free(s);
}

/* ---- finding and carving --------------------------------------------------- */

static kp_span *find_in(span_lists *L, size_t npages) {
    if (npages <= KP_EXACT_LISTS) {
        for (size_t w = npages / 64; w < sizeof L->bitmap / sizeof L->bitmap[0]; w++) {
            uint64_t bits = L->bitmap[w];
            if (w == npages / 64) bits &= ~(uint64_t)0 << (npages % 64);
            if (bits) {
                size_t n = w * 64 + (size_t)__builtin_ctzll(bits);
                if (n <= KP_EXACT_LISTS) return L->exact[n].next;
            }
        }
    }
    kp_span *best = NULL;   /* best fit, lowest address on ties */
    for (kp_span *s = list_first(&L->large); s; s = list_next(&L->large, s)) {
        if (s->npages < npages) continue;
        if (!best || s->npages < best->npages || (s->npages == best->npages && s->start < best->start)) best = s;
    }
    return best;
}

/* Map more memory into the free lists; 0 on success. REQUIRES lock. */
static int grow(size_t npages) {
    size_t want = npages * KP_PAGE_SIZE;
    size_t step = ph.mapped_bytes / 8;
    if (step < KP_GROW_MIN) step = KP_GROW_MIN;
    if (step > KP_GROW_MAX) step = KP_GROW_MAX;
    if (want < step) want = step;
    want = _kp_align_up(want, KP_PAGE_SIZE);
    void *mem = _kp_os_map(want, KP_PAGE_SIZE);
    if (!mem && want > npages * KP_PAGE_SIZE) {
        want = npages * KP_PAGE_SIZE;       /* near an address-space limit: only what is needed */
        mem = _kp_os_map(want, KP_PAGE_SIZE);
    }
    if (!mem) return -1;
    uintptr_t start = (uintptr_t)mem >> KP_PAGE_SHIFT;
    size_t pages = want >> KP_PAGE_SHIFT;
    if (_kp_pagemap_ensure(start, pages) != 0) {
        _kp_os_unmap(mem, want);
        errno = ENOMEM;
        return -1;
    }
    kp_span *s = new_span_struct(start, pages);
    if (!s) {
        _kp_os_unmap(mem, want);
        return -1;
    }
    ph.mapped_bytes += want;
    ph.grows++;
    /* Fresh pages are not resident: account them as released so that a
     * span is "normal" only once its pages have been touched. */
    s->released = 1;
    s->free_since_ms = _kp_now_coarse_ms();
    insert_coalesced(s);
    return 0;
}

/* Take npages off the front of free span s (removed from its lists already)
 * and give the rest back. */
static void carve(kp_span *s, size_t npages) {
    if (s->npages > npages) {
        kp_span *rest = new_span_struct(s->start + npages, s->npages - npages);
        if (rest) {
            rest->released = s->released;
            rest->free_since_ms = s->free_since_ms;
            s->npages = npages;
            insert_free(rest);
        }
        /* Without a struct for the rest, the whole span is handed out:
         * wasteful but correct. */
    }
}

static int release_span(kp_span *s);
static void decay(void);

/* *was_released (if not NULL) tells whether the pages came from a released
 * span, so that pieces given back stay filed as not resident. */
static void recent_flush(void);
static void recent_evict(unsigned i);

static kp_span *alloc_locked(size_t npages, kp_span_state state, int *was_released) {
    kp_span *s = find_in(&ph.normal, npages);
    /* Resident pages before released ones: the kept large spans, oldest
     * first, may give or coalesce into a fit. */
    while (!s && ph.nrecent) {
        recent_evict(0);
        s = find_in(&ph.normal, npages);
    }
    if (!s) s = find_in(&ph.released, npages);
    if (!s) {
        if (grow(npages) != 0) return NULL;
        s = find_in(&ph.normal, npages);
        if (!s) s = find_in(&ph.released, npages);
        if (!s) {
            errno = ENOMEM;
            return NULL;
        }
    }
    remove_free(s);
    carve(s, npages);
    if (was_released) *was_released = s->released;
    s->released = 0;
    s->state = (uint8_t)state;
    s->next = s->prev = NULL;
    ph.state_bytes[state] += s->npages * KP_PAGE_SIZE;
    return s;
}

/* Map an in-use span's pages once its final shape is known: every page of
 * SMALL and POOL spans (objects and blocks find their span by page), the
 * ends of the others, whose pages are told by their class byte. The class
 * bytes of SMALL and POOL spans are their owners' to write. REQUIRES lock. */
static void publish(kp_span *s) {
    if (s->state == KP_SPAN_SMALL || s->state == KP_SPAN_POOL) {
        _kp_pagemap_set_range(s->start, s->npages, s);
        return;
    }
    _kp_pagemap_set_ends(s->start, s->npages, s);
    _kp_pagemap_set_class(s->start, s->npages, s->state == KP_SPAN_LARGE ? KP_CLASS_LARGE : KP_CLASS_ARENA);
}

/* A span of npages pages, its first page aligned to align_pages (a power
 * of two), in state `state` and published; *zeroed (if not NULL) says its
 * pages read as zero. NULL + ENOMEM. REQUIRES lock. */
static kp_span *take_span(size_t npages, size_t align_pages, kp_span_state state, int *zeroed) {
    if (npages == 0 || npages + align_pages > ((size_t)1 << (KP_PAGEMAP_BITS - 1))) {
        errno = ENOMEM;
        return NULL;
    }
    int was_released = 0;
    if (align_pages <= 1) {
        kp_span *s = alloc_locked(npages, state, &was_released);
        if (s) publish(s);
        if (zeroed) *zeroed = was_released;
        return s;
    }
    kp_span *s = alloc_locked(npages + align_pages - 1, state, &was_released);
    if (!s) return NULL;
    uintptr_t aligned = (s->start + align_pages - 1) & ~(uintptr_t)(align_pages - 1);
    size_t lead = aligned - s->start;
    size_t trail = s->npages - lead - npages;
    kp_span *lead_span = NULL, *trail_span = NULL;
    if (lead) lead_span = new_span_struct(s->start, lead);
    if (trail) trail_span = new_span_struct(aligned + npages, trail);
    if ((lead && !lead_span) || (trail && !trail_span)) {
        if (lead_span) kill_span_struct(lead_span);
        if (trail_span) kill_span_struct(trail_span);
        ph.state_bytes[state] -= s->npages * KP_PAGE_SIZE;
        s->state = KP_SPAN_FREE;
        s->released = (uint8_t)was_released;
        s->free_since_ms = _kp_now_coarse_ms();
        insert_coalesced(s);
        errno = ENOMEM;
        return NULL;
    }
    uint64_t now = _kp_now_coarse_ms();
    ph.state_bytes[state] -= (lead + trail) * KP_PAGE_SIZE;
    s->start = aligned;
    s->npages = npages;
    publish(s);
    kp_span *pieces[2] = { lead_span, trail_span };
    for (int i = 0; i < 2; i++) {
        if (!pieces[i]) continue;
        pieces[i]->free_since_ms = now;
        pieces[i]->released = (uint8_t)was_released;
        insert_coalesced(pieces[i]);
    }
    if (zeroed) *zeroed = was_released;
    return s;
}

kp_span *_kp_pageheap_alloc_aligned(size_t npages, size_t align_pages, kp_span_state state) {
    _kp_lock(&ph.lock);
    kp_span *s = take_span(npages, align_pages, state, NULL);
    /* Under valgrind a span carved into blocks is inaccessible until a block
     * is handed out (kp_valgrind.h): an access to a slot never handed out,
     * or past a block into one, is reported. */
    KP_VG(if (s) VALGRIND_MAKE_MEM_NOACCESS((void *)(s->start << KP_PAGE_SHIFT), s->npages * KP_PAGE_SIZE));
    decay();
    publish_figures();
    _kp_unlock(&ph.lock);
    return s;
}

kp_span *_kp_pageheap_alloc(size_t npages, kp_span_state state) {
    return _kp_pageheap_alloc_aligned(npages, 1, state);
}

/* ---- large blocks ------------------------------------------------------------ */

/* Put recent span i back into the free lists. REQUIRES lock. */
static void recent_evict(unsigned i) {
    kp_span *s = ph.recent[i];
    memmove(&ph.recent[i], &ph.recent[i + 1], (ph.nrecent - i - 1) * sizeof ph.recent[0]);
    ph.nrecent--;
    ph.recent_bytes -= s->npages * KP_PAGE_SIZE;
    ph.state_bytes[KP_SPAN_CACHED] -= s->npages * KP_PAGE_SIZE;
    s->state = KP_SPAN_FREE;
    s->released = 0;
    insert_coalesced(s);     /* free_since_ms: when it was freed */
}

static void recent_flush(void) {
    while (ph.nrecent) recent_evict(0);
}

static void count_large(kp_span *s, size_t requested) {
    s->requested = requested;
    ph.large_bytes += s->npages * KP_PAGE_SIZE;
    ph.large_requested += requested;
    ph.large_allocs++;
}

/* The other half: large block s is freed. Returns its bytes. */
static size_t uncount_large(const kp_span *s) {
    size_t bytes = s->npages * KP_PAGE_SIZE;
    ph.large_bytes -= bytes;
    ph.large_requested -= s->requested;
    ph.large_frees++;
    return bytes;
}

kp_span *_kp_pageheap_large_alloc(size_t npages, size_t align_pages, size_t requested, int *zeroed) {
    _kp_lock(&ph.lock);
    kp_span *s = NULL;
    for (unsigned i = ph.nrecent; align_pages <= 1 && i-- > 0;) {
        if (ph.recent[i]->npages != npages) continue;
        s = ph.recent[i];
        memmove(&ph.recent[i], &ph.recent[i + 1], (ph.nrecent - i - 1) * sizeof ph.recent[0]);
        ph.nrecent--;
        ph.recent_bytes -= npages * KP_PAGE_SIZE;
        ph.state_bytes[KP_SPAN_CACHED] -= npages * KP_PAGE_SIZE;
        ph.state_bytes[KP_SPAN_LARGE] += npages * KP_PAGE_SIZE;
        s->state = KP_SPAN_LARGE;
        _kp_pagemap_set_class(s->start, npages, KP_CLASS_LARGE);   /* its ends are still mapped */
        *zeroed = 0;
        break;
    }
    if (!s) {
        s = take_span(npages, align_pages, KP_SPAN_LARGE, zeroed);
        decay();
    }
    if (s) count_large(s, requested);
    publish_figures();
    _kp_unlock(&ph.lock);
    return s;
}

void _kp_pageheap_large_free_locked(kp_span *s) {
    size_t bytes = uncount_large(s);
    if (s->npages > KP_RECENT_MAX_PAGES || bytes > KP_RECENT_BYTES) {
        _kp_pageheap_free_locked(s);
        return;
    }
    while (ph.nrecent == KP_RECENT_SPANS || (ph.nrecent && ph.recent_bytes + bytes > KP_RECENT_BYTES)) recent_evict(0);
    _kp_pagemap_set_class(s->start, s->npages, 0);
    ph.state_bytes[KP_SPAN_LARGE] -= bytes;
    ph.state_bytes[KP_SPAN_CACHED] += bytes;
    s->state = KP_SPAN_CACHED;
    s->free_since_ms = _kp_now_coarse_ms();
    ph.recent[ph.nrecent++] = s;
    ph.recent_bytes += bytes;
    publish_figures();
}

void _kp_pageheap_large_requested_locked(kp_span *s, size_t requested) {
    ph.large_requested += requested - s->requested;
    s->requested = requested;
}

int _kp_pageheap_large_resize_locked(kp_span *s, size_t npages) {
    if (npages == s->npages) return 0;
    if (npages < s->npages) {                 /* give the tail back */
        size_t tail = s->npages - npages;
        kp_span *t = new_span_struct(s->start + npages, tail);
        if (!t) return -1;
        _kp_pagemap_set_class(t->start, tail, 0);
        s->npages = npages;
        _kp_pagemap_set(s->start + npages - 1, s);
        ph.state_bytes[KP_SPAN_LARGE] -= tail * KP_PAGE_SIZE;
        ph.large_bytes -= tail * KP_PAGE_SIZE;
        t->free_since_ms = _kp_now_coarse_ms();
        insert_coalesced(t);
        decay();
        publish_figures();
        return 0;
    }
    uintptr_t after = s->start + s->npages;
    size_t more = npages - s->npages;
    kp_span *n = _kp_pagemap_get(after);
    if (!n || n->state != KP_SPAN_FREE || n->start != after || n->npages < more) return -1;
    remove_free(n);
    if (n->npages == more) {
        kill_span_struct(n);
    } else {
        n->start += more;
        n->npages -= more;
        insert_free(n);
    }
    _kp_pagemap_set(s->start + npages - 1, s);
    _kp_pagemap_set_class(after, more, KP_CLASS_LARGE);
    s->npages = npages;
    ph.state_bytes[KP_SPAN_LARGE] += more * KP_PAGE_SIZE;
    ph.large_bytes += more * KP_PAGE_SIZE;
    publish_figures();
    return 0;
}

int _kp_pageheap_large_move_locked(kp_span *s, size_t npages) {
    size_t old_bytes = s->npages * KP_PAGE_SIZE, new_bytes = npages * KP_PAGE_SIZE;
    char *old = (char *)(s->start << KP_PAGE_SHIFT);
    char *dst = _kp_os_map(new_bytes, KP_PAGE_SIZE);    /* where the pages go: aligned to kpool's page */
    if (!dst) return -1;
    uintptr_t dpn = (uintptr_t)dst >> KP_PAGE_SHIFT;
    if (_kp_pagemap_ensure(dpn, npages) != 0 || _kp_os_move(old, old_bytes, new_bytes, dst) != 0) {
        _kp_os_unmap(dst, new_bytes);
        return -1;
    }
    /* The old range is no longer mapped: no entry of it may name a span, so
     * that whatever the kernel puts there later is not taken for kpool's. */
    _kp_pagemap_set_class(s->start, s->npages, 0);
    _kp_pagemap_set_range(s->start, s->npages, NULL);
    ph.mapped_bytes += new_bytes - old_bytes;
    ph.state_bytes[KP_SPAN_LARGE] += new_bytes - old_bytes;
    ph.large_bytes += new_bytes - old_bytes;
    s->start = dpn;
    s->npages = npages;
    publish(s);
    publish_figures();
    return 0;
}

void _kp_pageheap_free(kp_span *s) {
    _kp_lock(&ph.lock);
    _kp_pageheap_free_locked(s);
    _kp_unlock(&ph.lock);
}

void _kp_pageheap_free_locked(kp_span *s) {
    kp_assert(s->state != KP_SPAN_FREE && s->state != KP_SPAN_DEAD);
    _kp_pagemap_set_class(s->start, s->npages, 0);
    ph.state_bytes[s->state] -= s->npages * KP_PAGE_SIZE;
    s->state = KP_SPAN_FREE;
    s->released = 0;
    s->freelist = s->freelist_tail = NULL;
    s->owner = NULL;
    s->free_since_ms = _kp_now_coarse_ms();
    insert_coalesced(s);
    decay();
    publish_figures();
}

/* ---- guarded blocks (KPOOL_GUARD) --------------------------------------------
 * A sampled block gets a mapping of its own: its pages, then one
 * inaccessible kpool page. The block ends where that page starts (as near
 * as its alignment allows), so a write past its end faults at once; the
 * guard page maps to the span so the fault handler (init.c) can name the
 * block. Freed guarded blocks are unmapped. They count as large blocks. */
kp_span *_kp_pageheap_guarded_alloc(size_t size, size_t align) {
    size_t npages = (size + KP_PAGE_SIZE - 1) >> KP_PAGE_SHIFT;
    if (npages == 0) npages = 1;
    size_t bytes = (npages + 1) * KP_PAGE_SIZE;
    char *base = _kp_os_map(bytes, align > KP_PAGE_SIZE ? align : KP_PAGE_SIZE);
    if (!base) return NULL;
    uintptr_t pn = (uintptr_t)base >> KP_PAGE_SHIFT;
    char *guard = base + npages * KP_PAGE_SIZE;
    if (_kp_os_protect_none(guard, KP_PAGE_SIZE) != 0) {
        _kp_os_unmap(base, bytes);
        return NULL;
    }
    _kp_lock(&ph.lock);
    kp_span *s = _kp_pagemap_ensure(pn, npages + 1) == 0 ? new_span_struct(pn, npages) : NULL;
    if (!s) {
        _kp_unlock(&ph.lock);
        _kp_os_unmap(base, bytes);
        errno = ENOMEM;
        return NULL;
    }
    uintptr_t block = ((uintptr_t)guard - _kp_align_up(size ? size : 1, KP_MIN_ALIGN)) & ~(uintptr_t)(align - 1);
    s->state = KP_SPAN_LARGE;
    s->guarded = 1;
    s->freelist = (void *)block;
    _kp_pagemap_set_ends(pn, npages, s);
    _kp_pagemap_set(pn + npages, s);                 /* the guard page names its block */
    _kp_pagemap_set_class(pn, npages, KP_CLASS_LARGE);
    ph.mapped_bytes += npages * KP_PAGE_SIZE;        /* the guard page is address space only */
    ph.state_bytes[KP_SPAN_LARGE] += npages * KP_PAGE_SIZE;
    count_large(s, size);
    publish_figures();
    _kp_unlock(&ph.lock);
    return s;
}

void _kp_pageheap_guarded_free_locked(kp_span *s) {
    size_t bytes = uncount_large(s);
    ph.mapped_bytes -= bytes;
    ph.state_bytes[KP_SPAN_LARGE] -= bytes;
    _kp_pagemap_set_class(s->start, s->npages, 0);
    _kp_pagemap_set_range(s->start, s->npages + 1, NULL);   /* the range goes back to the OS */
    _kp_os_unmap((void *)(s->start << KP_PAGE_SHIFT), bytes + KP_PAGE_SIZE);
    kill_span_struct(s);
    publish_figures();
}

/* ---- giving memory back ------------------------------------------------------ */

/* Release a normal free span's pages and re-file it as released, merged
 * with released neighbours. REQUIRES lock. */
static int release_span(kp_span *s) {
    remove_free(s);
    int ok = _kp_os_release((void *)(s->start << KP_PAGE_SHIFT), s->npages * KP_PAGE_SIZE) == 0;
    if (ok) {
        s->released = 1;
        ph.os_releases++;
    }
    insert_coalesced(s);
    return ok;
}

/* Release what has been idle too long, and whatever exceeds the retention
 * budget (oldest first, down to half the budget). REQUIRES lock. */
static size_t retain_budget(void) {
    size_t in_use = ph.mapped_bytes - ph.free_bytes - ph.released_bytes;
    size_t b = in_use / KP_RETAIN_DIV;
    return b < KP_RETAIN_MIN ? KP_RETAIN_MIN : b > KP_RETAIN_MAX ? KP_RETAIN_MAX : b;
}

static void decay(void) {
    uint64_t now_ms = _kp_now_coarse_ms();
    size_t budget = retain_budget();
    while (ph.nrecent && (now_ms - ph.recent[0]->free_since_ms >= KP_DECAY_MS ||
                          ph.free_bytes + ph.recent_bytes > budget))
        recent_evict(0);
    if (ph.free_bytes > budget) {
        while (ph.free_bytes > budget / 2 && ph.age.age_next != &ph.age)
            if (!release_span(ph.age.age_next)) return;
    }
    uint64_t now = _kp_now_coarse_ms();
    if (now - ph.last_decay_ms < KP_DECAY_CHECK_MS) return;
    ph.last_decay_ms = now;
    while (ph.age.age_next != &ph.age && now - ph.age.age_next->free_since_ms >= KP_DECAY_MS)
        if (!release_span(ph.age.age_next)) return;
}

size_t _kp_pageheap_trim(void) {
    _kp_lock(&ph.lock);
    recent_flush();
    size_t before = ph.released_bytes;
    while (ph.age.age_next != &ph.age)
        if (!release_span(ph.age.age_next)) break;
    size_t released = ph.released_bytes - before;
    publish_figures();
    _kp_unlock(&ph.lock);
    return released;
}

/* Run the time-based decay now (called by paths that free memory without
 * passing through the page heap, so idle pages still go back). */
void _kp_pageheap_tick(void) {
    static _Atomic uint64_t last_tick_ms;
    if (atomic_load_explicit(&ph_free, memory_order_relaxed) == 0) return;
    uint64_t now = _kp_now_coarse_ms();
    if (now - atomic_load_explicit(&last_tick_ms, memory_order_relaxed) < KP_DECAY_CHECK_MS) return;
    atomic_store_explicit(&last_tick_ms, now, memory_order_relaxed);
    if (pthread_mutex_trylock(&ph.lock.mutex) != 0) return;
    KP_BUMP(ph.lock.acquires, 1);
    decay();
    publish_figures();
    _kp_unlock(&ph.lock);
}

/* ---- figures and validity ----------------------------------------------------- */

void _kp_pageheap_figures(kp_pageheap_figures *out) {
    _kp_lock(&ph.lock);
    out->mapped = ph.mapped_bytes;
    out->released = ph.released_bytes;
    out->free_bytes = ph.free_bytes;
    out->free_bytes += ph.recent_bytes;     /* kept large spans are free and resident */
    out->grows = ph.grows;
    out->os_releases = ph.os_releases;
    out->large_allocs = ph.large_allocs;
    out->large_frees = ph.large_frees;
    out->large_bytes = ph.large_bytes;
    out->large_requested = ph.large_requested;
    memcpy(out->state_bytes, ph.state_bytes, sizeof out->state_bytes);
    size_t largest = 0, count = 0;
    for (int i = KP_EXACT_LISTS; i >= 1; i--) {
        if (!(ph.normal.bitmap[i / 64] & ((uint64_t)1 << (i % 64)))) continue;
        for (kp_span *s = list_first(&ph.normal.exact[i]); s; s = list_next(&ph.normal.exact[i], s)) {
            count++;
            if (s->npages > largest) largest = s->npages;
        }
    }
    for (kp_span *s = list_first(&ph.normal.large); s; s = list_next(&ph.normal.large, s)) {
        count++;
        if (s->npages > largest) largest = s->npages;
    }
    for (unsigned i = 0; i < ph.nrecent; i++)
        if (ph.recent[i]->npages > largest) largest = ph.recent[i]->npages;
    out->largest_free = largest * KP_PAGE_SIZE;
    out->spans_free = count;
    _kp_unlock(&ph.lock);
}

static int lists_valid(span_lists *L, int released, size_t *bytes) {
    for (int i = 1; i <= KP_EXACT_LISTS + 1; i++) {
        kp_span *head = i <= KP_EXACT_LISTS ? &L->exact[i] : &L->large;
        if (i <= KP_EXACT_LISTS && !!(L->bitmap[i / 64] & ((uint64_t)1 << (i % 64))) == list_empty(head)) return 0;
        for (kp_span *s = list_first(head); s; s = list_next(head, s)) {
            if (s->state != KP_SPAN_FREE || s->released != released) return 0;
            if (i <= KP_EXACT_LISTS ? s->npages != (size_t)i : s->npages <= KP_EXACT_LISTS) return 0;
            if (_kp_pagemap_get(s->start) != s || _kp_pagemap_get(s->start + s->npages - 1) != s) return 0;
            if (free_neighbour(s, 0) || free_neighbour(s, 1)) return 0;
            *bytes += s->npages * KP_PAGE_SIZE;
        }
    }
    return 1;
}

int _kp_pageheap_is_valid(void) {
    _kp_lock(&ph.lock);
    size_t normal = 0, released = 0;
    int ok = lists_valid(&ph.normal, 0, &normal) && lists_valid(&ph.released, 1, &released);
    ok = ok && normal == ph.free_bytes && released == ph.released_bytes;
    size_t aged = 0;
    for (kp_span *s = ph.age.age_next; ok && s != &ph.age; s = s->age_next) aged += s->npages * KP_PAGE_SIZE;
    ok = ok && aged == ph.free_bytes;
    size_t kept = 0;
    for (unsigned i = 0; ok && i < ph.nrecent; i++) {
        kp_span *r = ph.recent[i];
        ok = r->state == KP_SPAN_CACHED && _kp_pagemap_get(r->start) == r && _kp_pagemap_get(r->start + r->npages - 1) == r;
        kept += r->npages * KP_PAGE_SIZE;
    }
    ok = ok && kept == ph.recent_bytes && kept == ph.state_bytes[KP_SPAN_CACHED];
    _kp_unlock(&ph.lock);
    return ok;
}
