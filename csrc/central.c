/* central.c: one free list per size class, shared by all threads.
 *
 * Job: move objects to and from thread caches in batches. A whole batch
 * given back is kept as it is in one of a few transfer slots and handed to
 * the next thread that needs one, in O(1) (tcmalloc's transfer cache):
 * blocks freed by another thread than their allocator travel this way.
 * Other free objects live in their spans (each span keeps its own free list
 * plus a bump cursor over objects never carved, so a new span is not touched
 * until its objects are handed out). A span whose objects are all free goes
 * back to the page heap at once; the page heap keeps it resident a while.
 * Calls: pageheap (spans), pagemap (object -> span, class bytes).
 * Invariants (_kp_central_is_valid): free_objects == batch * used + sum
 *   over the class's spans of |freelist| + (capacity - carved); a span's
 *   list holds only its own slots (or its meshed group's); a span is on
 *   `partial` iff it has a free object; spans with allocated == 0 are not
 *   kept (but a meshed group whose members could not all be given private
 *   pages back, mesh.c); used <= transfer_slots, transfer_slots * batch * size <=
 *   KP_TRANSFER_BYTES.
 * Locks: one kp_lock per class, each on its own cache line. A class lock may
 *   be held while taking the page heap lock, never the reverse; no two class
 *   locks are held at once (except by fork's prepare handler, in class order).
 */
#include "kp_internal.h"

/* Nothing here is written before a class is first used (the lock's
 * initializer is all zeros with glibc, and an empty `partial` may have
 * next == NULL), so the pages of unused classes never become resident. */
static kp_central centrals[KP_NUM_CLASSES] = {
    [0 ... KP_NUM_CLASSES - 1] = { .lock = { .mutex = PTHREAD_MUTEX_INITIALIZER } },
};

kp_central *_kp_central(unsigned cls) { return &centrals[cls]; }

static kp_span *partial_first(kp_central *c) {
    kp_span *s = c->partial.next;
    return s == &c->partial ? NULL : s;
}

static void partial_push(kp_central *c, kp_span *s) {
    if (!c->partial.next) c->partial.next = c->partial.prev = &c->partial;
    s->next = c->partial.next;
    s->prev = &c->partial;
    c->partial.next->prev = s;
    c->partial.next = s;
    s->on_list = 1;
}

static void partial_remove(kp_span *s) {
    s->prev->next = s->next;
    s->next->prev = s->prev;
    s->next = s->prev = NULL;
    s->on_list = 0;
}

/* A fresh span for cls, on the partial list. REQUIRES class lock. */
static kp_span *new_span(kp_central *c, unsigned cls) {
    const kp_class_info *ci = &_kp_classes[cls];
    kp_span *s = _kp_pageheap_alloc(ci->npages, KP_SPAN_SMALL);
    if (!s) return NULL;
    s->sizeclass = (uint8_t)cls;
    s->capacity = ci->objects;
    __atomic_store_n(&s->carved, 0, __ATOMIC_RELEASE);   /* read lock-free by kp_usable_size */
    s->allocated = 0;
    s->freelist = s->freelist_tail = NULL;
    s->mesh_primary = s->mesh_next = s->group_next = s->group_prev = NULL;
    s->mesh_members = s->mesh_split = s->mesh_mapped = s->mesh_on_file = 0;
#if KP_DEBUG
    for (int i = 0; i < 8; i++) atomic_store(&s->live_bits[i], 0);
#endif
    /* The span is ours alone until its objects are handed out, so its class
     * bytes can be written without the page heap lock. */
    _kp_pagemap_set_class(s->start, s->npages, cls);
    partial_push(c, s);
    KP_BUMP(c->spans, 1);
    KP_BUMP(c->free_objects, s->capacity);
    return s;
}

/* The slot index of p in s (or in a member of s's meshed group), or -1 if
 * p is not a slot there. */
static int64_t slot_of_span(const kp_span *s, const void *p) {
    if (!_kp_link_ok(p)) return -1;
    const kp_span *m = s;
    uintptr_t pn = (uintptr_t)p >> KP_PAGE_SHIFT;
    if (pn - s->start >= s->npages) {
        m = s->mesh_members ? _kp_pagemap_get(pn) : NULL;
        if (!m || m->mesh_primary != s) return -1;
    }
    const kp_class_info *ci = &_kp_classes[s->sizeclass];
    uint64_t off = (uintptr_t)p - (m->start << KP_PAGE_SHIFT);
    uint64_t i = (off * ci->recip) >> 32;
    return i < s->capacity && i * ci->size == off ? (int64_t)i : -1;
}

/* The chain a fetch hands out is built in order, appended at its tail:
 * objects carved from a span come out in ascending address order, so a
 * program that walks its objects in allocation order (a garbage collector,
 * a list of records) walks memory forwards, as hardware prefetchers expect.
 * (Prepending carved objects handed them out backwards: CPython's GC walk
 * of a json.loads result took 28% more samples than under tcmalloc.) */
unsigned _kp_central_fetch(unsigned cls, unsigned n, unsigned room, void **head_out) {
    kp_central *c = &centrals[cls];
    const size_t size = _kp_classes[cls].size;
    void *head = NULL, *tail = NULL;
    unsigned got = 0;
#define APPEND(first, last) do { if (tail) _kp_set_next(tail, (first)); else head = (first); tail = (last); } while (0)
    _kp_lock(&c->lock);
    if (n == _kp_classes[cls].batch && c->used > 0) {
        head = c->slots[--c->used];   /* a whole batch, already terminated */
        got = n;
    }
    while (got < n) {
        kp_span *s = partial_first(c);
        if (!s) {
            s = new_span(c, cls);
            if (!s) break;
        }
        /* A span's free list (carved - allocated objects) that fits in the
         * room left goes onto the chain whole, without walking it: its
         * objects were freed a while ago, or by other threads, so every link
         * read under the lock would miss the cache (a CPython ast run spent
         * 2% of its time on those reads, walking lists for 32 objects). */
        unsigned listed = s->carved - s->allocated;
        if (s->freelist && listed <= room - got) {
            APPEND(s->freelist, s->freelist_tail);
            s->freelist = s->freelist_tail = NULL;
            s->allocated += listed;
            got += listed;
        }
        char *base = (char *)(s->start << KP_PAGE_SHIFT);
        while (got < n) {
            void *obj;
            if (s->freelist) {
                obj = s->freelist;
                void *next = _kp_next(obj);
                if (next && slot_of_span(s, next) < 0) {
                    /* a write after free damaged obj's link: the rest of the
                     * list is out of reach, counted out of the span for good */
                    _kp_report_bad_link("kp_malloc", obj);
                    unsigned lost = s->carved - s->allocated - 1;
                    s->allocated += lost;
                    KP_STORE(c->free_objects, KP_LOAD(c->free_objects) - lost);
                    next = NULL;
                }
                s->freelist = next;
                if (!s->freelist) s->freelist_tail = NULL;
            } else if (s->carved < s->capacity) {
                /* Never-carved objects go on as one run, linked in address
                 * order, each marked free until it is handed out. */
                unsigned k = s->capacity - s->carved;
                if (k > n - got) k = n - got;
                char *first = base + (size_t)s->carved * size, *last = first + (size_t)(k - 1) * size;
                for (char *p = first; p < last; p += size) {
                    _kp_mark_free(p);
                    _kp_set_next(p, p + size);
                }
                _kp_mark_free(last);
                APPEND(first, last);
                __atomic_store_n(&s->carved, s->carved + k, __ATOMIC_RELEASE);   /* after the marks */
                s->allocated += k;
                got += k;
                continue;
            } else {
                break;
            }
            APPEND(obj, obj);
            s->allocated++;
            got++;
        }
        if (!s->freelist && s->carved == s->capacity) partial_remove(s);
    }
#undef APPEND
    if (tail) _kp_set_next(tail, NULL);
    KP_STORE(c->free_objects, KP_LOAD(c->free_objects) - got);
    _kp_unlock(&c->lock);
    *head_out = head;
    if (got == 0) errno = ENOMEM;
    return got;
}

/* s's free list becomes every slot not set in live (NULL: every slot), in
 * address order, each marked free; every slot counts as carved. The number
 * of free objects does not change. REQUIRES class lock. */
static void rebuild_freelist(kp_span *s, const uint64_t *live) {
    const size_t size = _kp_classes[s->sizeclass].size;
    char *base = (char *)(s->start << KP_PAGE_SHIFT);
    void *head = NULL, *tail = NULL;
    for (uint32_t i = 0; i < s->capacity; i++) {
        if (live && (live[i / 64] >> (i % 64) & 1)) continue;
        void *obj = base + (size_t)i * size;
        _kp_mark_free(obj);
        if (tail) _kp_set_next(tail, obj);
        else head = obj;
        tail = obj;
    }
    if (tail) _kp_set_next(tail, NULL);
    s->freelist = head;
    s->freelist_tail = tail;
    __atomic_store_n(&s->carved, s->capacity, __ATOMIC_RELEASE);
}

/* Put n objects back into their spans. Consecutive objects of one span
 * (a thread frees what it allocated together) go onto its list as the run
 * they already form: one splice and one count per run, no relinking, and
 * one pagemap lookup; json.loads results and parse trees come back this
 * way. REQUIRES class lock. */
static void return_to_spans(kp_central *c, void *head, unsigned n) {
    size_t freed_objects = 0;
    unsigned i = 0;
    while (i < n && head) {
        void *first = head;
        kp_span *s = _kp_link_ok(first) ? _kp_pagemap_get((uintptr_t)first >> KP_PAGE_SHIFT) : NULL;
        if (!s || s->state != KP_SPAN_SMALL || &centrals[s->sizeclass] != c) {
            _kp_report_bad_link("kp_free", first);   /* a damaged link led here: drop the rest */
            break;
        }
        kp_span *owner = s->mesh_primary ? s->mesh_primary : s;   /* a meshed span's slots are its group's */
        if (owner->allocated == 0) {
            _kp_report_bad_link("kp_free", first);   /* every object of it is free already */
            break;
        }
        const uintptr_t base = s->start << KP_PAGE_SHIFT, bytes = (uintptr_t)s->npages << KP_PAGE_SHIFT;
        /* More than `allocated` objects of a span would be a double free:
         * the run stops there, and the span (freed below) rejects the rest. */
        void *last = first;
        uint32_t run = 1;
        head = _kp_next(first);
        for (i++; i < n && head && run < owner->allocated; i++, run++) {
            if (!_kp_link_ok(head) || (uintptr_t)head - base >= bytes) break;
            last = head;
            head = _kp_next(head);
        }
        _kp_set_next(last, owner->freelist);
        if (!owner->freelist) owner->freelist_tail = last;
        owner->freelist = first;
        owner->allocated -= run;
        freed_objects += run;
        if (owner->allocated == 0 && owner->mesh_members && _kp_mesh_undo(owner) != 0) {
            rebuild_freelist(owner, NULL);   /* a member could not be remapped: the group stays, all free */
            if (!owner->on_list) partial_push(c, owner);
        } else if (owner->allocated == 0) {
            if (owner->on_list) partial_remove(owner);
            KP_STORE(c->free_objects, KP_LOAD(c->free_objects) + freed_objects - owner->capacity);
            freed_objects = 0;
            KP_STORE(c->spans, KP_LOAD(c->spans) - 1);
            _kp_pageheap_free(owner);
        } else if (!owner->on_list) {
            partial_push(c, owner);
        }
    }
    KP_STORE(c->free_objects, KP_LOAD(c->free_objects) + freed_objects);
}

void _kp_central_return(unsigned cls, void *head, unsigned n) {
    kp_central *c = &centrals[cls];
    _kp_lock(&c->lock);
    if (n == _kp_classes[cls].batch && c->used < _kp_classes[cls].transfer_slots) {
        c->slots[c->used++] = head;
        KP_STORE(c->free_objects, KP_LOAD(c->free_objects) + n);
    } else {
        return_to_spans(c, head, n);
    }
    _kp_unlock(&c->lock);
}

void _kp_central_drain(unsigned cls) {
    kp_central *c = &centrals[cls];
    _kp_lock(&c->lock);
    while (c->used > 0) {
        void *chain = c->slots[--c->used];
        KP_STORE(c->free_objects, KP_LOAD(c->free_objects) - _kp_classes[cls].batch);
        return_to_spans(c, chain, _kp_classes[cls].batch);
    }
    _kp_unlock(&c->lock);
}

/* ---- meshing ------------------------------------------------------------------
 * Candidates are the class's spans at most half full (a group's primary
 * counts the group). Each one's live slots are every carved slot not on its
 * free list: blocks in thread caches and transfer slots are live here, as
 * their links are in them. Sources are taken sparsest first, each tried
 * against up to KP_MESH_PROBES destinations from the fullest down; a source
 * joins the first whose live slots it misses (Mesh's SplitMesher does the
 * same with random pairs). A source is a span of no group. */
typedef struct mesh_candidate {
    kp_span *span;
    uint32_t nlive;
    uint32_t taken;               /* joined into another this round */
    uint64_t live[8];
} mesh_candidate;
static mesh_candidate *candidates;              /* KP_MESH_CANDIDATES, under the mesh lock */
static uint16_t order[KP_MESH_CANDIDATES];
_Static_assert(KP_MESH_CANDIDATES <= 65536, "order holds an index");

/* UINT32_MAX if the free list is damaged (a write after free): the span
 * is left alone, and the next pop reports it. */
static uint32_t live_slots(const kp_span *s, uint64_t live[8]) {
    memset(live, 0, 8 * sizeof live[0]);
    for (uint32_t i = 0; i < s->carved; i++) live[i / 64] |= (uint64_t)1 << (i % 64);
    uint32_t listed = 0;
    for (void *p = s->freelist; p; p = _kp_next(p)) {
        int64_t i = slot_of_span(s, p);
        if (i < 0 || ++listed > s->capacity) return UINT32_MAX;
        if (!(live[i / 64] >> (i % 64) & 1)) return UINT32_MAX;   /* listed twice */
        live[i / 64] &= ~((uint64_t)1 << (i % 64));
    }
    return s->allocated;
}

static int disjoint(const uint64_t *a, const uint64_t *b) {
    uint64_t both = 0;
    for (int w = 0; w < 8; w++) both |= a[w] & b[w];
    return both == 0;
}

/* src's slots are dst's group's now: dst's free list becomes every slot
 * free in both, in address order. REQUIRES class lock. */
static void merge_accounting(kp_central *c, kp_span *dst, kp_span *src, const uint64_t *live) {
    dst->allocated += src->allocated;
    src->allocated = 0;
    src->freelist = src->freelist_tail = NULL;
    __atomic_store_n(&src->carved, src->capacity, __ATOMIC_RELEASE);
    if (src->on_list) partial_remove(src);
    rebuild_freelist(dst, live);
    if (!dst->freelist && dst->on_list) partial_remove(dst);
    KP_STORE(c->free_objects, KP_LOAD(c->free_objects) - dst->capacity);
    KP_STORE(c->spans, KP_LOAD(c->spans) - 1);
}

unsigned _kp_central_mesh(unsigned cls, unsigned max_joins, size_t min_free, unsigned max_rounds) {
    kp_central *c = &centrals[cls];
    const kp_class_info *ci = &_kp_classes[cls];
    if (ci->objects < 4 || KP_LOAD(c->spans) < 2 || KP_LOAD(c->free_objects) * ci->size < min_free) return 0;
    if (!candidates) {
        candidates = _kp_os_map(KP_MESH_CANDIDATES * sizeof *candidates, 0);
        if (!candidates) return 0;
    }
    unsigned joined = 0;
    _kp_lock(&c->lock);
    unsigned rounds = 0;
    for (kp_span *next = partial_first(c); next && joined < max_joins && rounds++ < max_rounds;) {
        unsigned n = 0, seen = 0;                       /* a round: up to KP_MESH_CANDIDATES spans */
        for (; next && next != &c->partial && n < KP_MESH_CANDIDATES && seen++ < 4 * KP_MESH_CANDIDATES;
             next = next->next) {
            if (next->mesh_split || next->mesh_members >= KP_MESH_MAX_MEMBERS) continue;
            mesh_candidate *m = &candidates[n];
            m->span = next;
            m->taken = 0;
            m->nlive = live_slots(next, m->live);
            if (m->nlive != UINT32_MAX) n++;
        }
        if (next == &c->partial) next = NULL;
        uint32_t first[512 + 2] = { 0 };                /* order: sparsest first (counting sort) */
        for (unsigned i = 0; i < n; i++) first[candidates[i].nlive + 1]++;
        for (unsigned v = 1; v < 512 + 2; v++) first[v] += first[v - 1];
        for (unsigned i = 0; i < n; i++) order[first[candidates[i].nlive]++] = (uint16_t)i;
        for (unsigned a = 0; a < n && joined < max_joins; a++) {
            mesh_candidate *src = &candidates[order[a]];
            if (src->taken || src->span->mesh_members || src->nlive * 2 > ci->objects) continue;
            unsigned probes = 0;
            for (unsigned b = n; b-- > a + 1 && probes < KP_MESH_PROBES;) {
                mesh_candidate *dst = &candidates[order[b]];
                if (dst->taken || dst->span->mesh_members >= KP_MESH_MAX_MEMBERS) continue;
                probes++;
                if (dst->nlive + src->nlive > ci->objects || !disjoint(dst->live, src->live)) continue;
                int rc = _kp_mesh_join(dst->span, src->span, src->live);
                if (rc == -2) rebuild_freelist(dst->span, dst->live);
                if (rc != 0) goto out;
                for (int w = 0; w < 8; w++) dst->live[w] |= src->live[w];
                dst->nlive += src->nlive;
                merge_accounting(c, dst->span, src->span, dst->live);
                src->taken = 1;
                joined++;
                break;
            }
        }
        /* Spans joined this round left the partial list; `next` was not one of them. */
    }
out:
    _kp_unlock(&c->lock);
    return joined;
}

int _kp_central_is_valid(unsigned cls) {
    kp_central *c = &centrals[cls];
    _kp_lock(&c->lock);
    size_t free_objects = 0;
    int ok = c->used <= _kp_classes[cls].transfer_slots;
    for (uint32_t i = 0; ok && i < c->used; i++) {
        size_t n = 0;
        for (void *p = c->slots[i]; p && _kp_link_ok(p); p = _kp_next(p)) n++;
        ok = n == _kp_classes[cls].batch;
        free_objects += n;
    }
    for (kp_span *s = partial_first(c); ok && s && s != &c->partial; s = s->next) {
        size_t listed = 0;
        void *last = NULL;
        for (void *p = s->freelist; p && _kp_link_ok(p); p = _kp_next(p)) {
            if (slot_of_span(s, p) < 0) ok = 0;   /* each span lists only its own slots */
            listed++;
            last = p;
        }
        size_t free_here = listed + (s->capacity - s->carved);
        ok = ok && s->state == KP_SPAN_SMALL && s->sizeclass == cls && s->on_list && free_here > 0 &&
             last == s->freelist_tail &&
             s->allocated + free_here == s->capacity && (s->allocated > 0 || s->mesh_members);
        free_objects += free_here;
    }
    ok = ok && free_objects == KP_LOAD(c->free_objects);
    _kp_unlock(&c->lock);
    return ok;
}
