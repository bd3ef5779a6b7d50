/* arena.c: region allocation (kp_arena_*).
 *
 * Job: hand out memory by bumping a cursor through chunks (page-heap spans
 * in state ARENA); free everything at once with kp_arena_reset, which keeps
 * the first regular chunk for reuse and gives the others back. A request
 * that does not fit in a chunk gets a chunk of its own, and the cursor stays
 * where it was.
 * Calls: pageheap (chunks).
 * Invariants: used == bytes handed out since the last reset; reserved ==
 *   bytes of the chunks held; cursor <= end, both inside the current chunk.
 * Locks: none of its own. One arena must not be used by two threads at once
 *   (the caller serialises; the Python Arena holds a lock); chunks come from
 *   the page heap under its lock.
 */
#include "kp_internal.h"

struct kp_arena {
    size_t chunk_size;
    kp_span chunks;         /* sentinel: every chunk, newest first */
    kp_span *keep;          /* the first regular chunk, kept by reset */
    char *cursor, *end;
    size_t used, reserved;
};

#define ARENA_MAX_ALIGN ((size_t)1 << 30)
#define ARENA_MAX_SIZE ((size_t)1 << 46)

kp_arena *kp_arena_create(size_t chunk_size) {
    _kp_init();
    if (chunk_size == 0) chunk_size = (size_t)1 << 20;
    if (chunk_size > ARENA_MAX_SIZE) {
        errno = EINVAL;
        return NULL;
    }
    kp_arena *a = _kp_meta_alloc(sizeof(kp_arena));
    if (!a) return NULL;
    memset(a, 0, sizeof *a);
    a->chunk_size = _kp_align_up(chunk_size, KP_PAGE_SIZE);
    a->chunks.next = a->chunks.prev = &a->chunks;
    KP_VG(VALGRIND_CREATE_MEMPOOL(a, 0, 0));        /* kp_valgrind.h */
    return a;
}

static kp_span *new_chunk(kp_arena *a, size_t bytes, size_t align) {
    size_t npages = (bytes + KP_PAGE_SIZE - 1) >> KP_PAGE_SHIFT;
    size_t align_pages = align > KP_PAGE_SIZE ? align >> KP_PAGE_SHIFT : 1;
    kp_span *s = _kp_pageheap_alloc_aligned(npages, align_pages, KP_SPAN_ARENA);
    if (!s) return NULL;
    s->owner = a;
    s->next = a->chunks.next;
    s->prev = &a->chunks;
    a->chunks.next->prev = s;
    a->chunks.next = s;
    a->reserved += s->npages * KP_PAGE_SIZE;
    return s;
}

static void drop_chunk(kp_arena *a, kp_span *s) {
    s->prev->next = s->next;
    s->next->prev = s->prev;
    a->reserved -= s->npages * KP_PAGE_SIZE;
    _kp_pageheap_free(s);
}

#if KP_VALGRIND
static void *vg_block(kp_arena *a, void *p, size_t size) {
    KP_VG(VALGRIND_MEMPOOL_ALLOC(a, p, size));
    return p;
}
#define VG_BLOCK(a, p, size) vg_block(a, p, size)   /* a block handed out, registered */
#else
#define VG_BLOCK(a, p, size) (p)
#endif

void *kp_arena_alloc(kp_arena *a, size_t size, size_t align) {
    if (!a) {
        errno = EINVAL;
        return NULL;
    }
    if (align == 0) align = KP_MIN_ALIGN;
    if (!_kp_is_pow2(align) || align > ARENA_MAX_ALIGN) {
        errno = EINVAL;
        return NULL;
    }
    if (size > ARENA_MAX_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    if (size == 0) size = 1;          /* unique pointers for empty requests */
    if (a->cursor) {
        uintptr_t p = _kp_align_up((uintptr_t)a->cursor, align);
        if (p <= (uintptr_t)a->end && size <= (uintptr_t)a->end - p) {
            a->cursor = (char *)(p + size);
            a->used += size;
            return VG_BLOCK(a, (void *)p, size);
        }
    }
    if (size + (align > KP_PAGE_SIZE ? 0 : align) > a->chunk_size || align > a->chunk_size) {
        kp_span *own = new_chunk(a, size, align);
        if (!own) return NULL;
        a->used += size;
        return VG_BLOCK(a, (void *)(own->start << KP_PAGE_SHIFT), size);
    }
    kp_span *s = NULL;
    if (!a->cursor && a->keep) {
        /* after a reset: start over in the kept chunk, if the request fits */
        uintptr_t base = a->keep->start << KP_PAGE_SHIFT;
        uintptr_t end = base + a->keep->npages * KP_PAGE_SIZE;
        uintptr_t p = _kp_align_up(base, align);
        if (p <= end && size <= end - p) s = a->keep;
    }
    if (!s) {
        s = new_chunk(a, a->chunk_size, align);   /* aligned to align: the request fits */
        if (!s) return NULL;
        if (!a->keep) a->keep = s;
    }
    char *base = (char *)(s->start << KP_PAGE_SHIFT);
    a->cursor = base;
    a->end = base + s->npages * KP_PAGE_SIZE;
    uintptr_t p = _kp_align_up((uintptr_t)a->cursor, align);
    a->cursor = (char *)(p + size);
    a->used += size;
    return VG_BLOCK(a, (void *)p, size);
}

void kp_arena_reset(kp_arena *a) {
    if (!a) return;
    KP_VG(VALGRIND_DESTROY_MEMPOOL(a); VALGRIND_CREATE_MEMPOOL(a, 0, 0));   /* every block at once */
    for (kp_span *s = a->chunks.next; s != &a->chunks;) {
        kp_span *next = s->next;
        if (s != a->keep) drop_chunk(a, s);
        s = next;
    }
    a->cursor = a->end = NULL;
    a->used = 0;
}

void kp_arena_destroy(kp_arena *a) {
    if (!a) return;
    KP_VG(VALGRIND_DESTROY_MEMPOOL(a));
    while (a->chunks.next != &a->chunks) drop_chunk(a, a->chunks.next);
    _kp_meta_free(a, sizeof(kp_arena));
}

size_t kp_arena_used(const kp_arena *a) { return a ? a->used : 0; }
size_t kp_arena_reserved(const kp_arena *a) { return a ? a->reserved : 0; }
