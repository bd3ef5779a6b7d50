/* os.c: the bottom layer. Pages from the OS and kpool's own metadata.
 *
 * Job: map address space (mmap) at a requested alignment, give pages back
 * (madvise MADV_DONTNEED: the RSS drops at once and the pages read as zero
 * when touched again), hint huge pages, and hand out fixed-size metadata
 * structs (spans, thread caches, pools) carved from mapped chunks.
 * Calls: nothing of kpool's; only the kernel.
 * Invariants: metadata chunks are never unmapped, so a pointer to a span
 * struct stays dereferenceable forever (the pagemap relies on it); freed
 * metadata goes on a free list per struct size.
 * Locks: the metadata lock, last in the lock order (kp_internal.h); nothing
 * is taken while it is held.
 */
#include "kp_internal.h"

#include <sys/mman.h>
#include <unistd.h>

/* Test hooks: how many maps / metadata allocations are left to fail. */
static _Atomic int os_fail_next, meta_fail_next;

void _kp_os_fail_next(int n) { atomic_store(&os_fail_next, n); }
void _kp_meta_fail_next(int n) { atomic_store(&meta_fail_next, n); }

size_t _kp_os_page_size(void) {
    static _Atomic size_t cached;
    size_t ps = atomic_load_explicit(&cached, memory_order_relaxed);
    if (ps == 0) {
        long v = sysconf(_SC_PAGESIZE);
        ps = v > 0 ? (size_t)v : 4096;
        atomic_store_explicit(&cached, ps, memory_order_relaxed);
    }
    return ps;
}

static int should_fail(_Atomic int *left) {
    int n = atomic_load(left);
    while (n > 0) {
        if (atomic_compare_exchange_weak(left, &n, n - 1)) return 1;
    }
    return 0;
}

/* Without MAP_NORESERVE the kernel's overcommit check refuses requests far
 * beyond the machine's memory at once (ENOMEM), instead of kpool mapping
 * terabytes and filling a pagemap for them. */
void *_kp_os_map(size_t size, size_t align) {
    size_t ps = _kp_os_page_size();
    if (align < ps) align = ps;
    if (size == 0 || size > ((size_t)1 << KP_ADDRESS_BITS) || should_fail(&os_fail_next)) {
        errno = ENOMEM;
        return NULL;
    }
    size = _kp_align_up(size, ps);
    size_t span = size + (align > ps ? align - ps : 0);
    void *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        errno = ENOMEM;
        return NULL;
    }
    uintptr_t base = (uintptr_t)raw;
    uintptr_t aligned = (base + align - 1) & ~(uintptr_t)(align - 1);
    if (aligned > base) munmap(raw, aligned - base);
    size_t tail = (base + span) - (aligned + size);
    if (tail) munmap((void *)(aligned + size), tail);
    return (void *)aligned;
}

void *_kp_os_reserve(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_NOHUGEPAGE
    (void)madvise(p, size, MADV_NOHUGEPAGE);   /* one written byte must not make 2 MiB resident */
#endif
    return p;
}

int _kp_os_protect_none(void *p, size_t size) { return mprotect(p, size, PROT_NONE); }

/* 1 if [p, p + len) lies inside one kernel mapping. mremap moves a range
 * only inside one (else EFAULT, and with MREMAP_FIXED only after it has
 * unmapped the target), and a span may cross one: the pages of a block
 * moved before keep a mapping of their own once freed and coalesced. The
 * probe asks to grow the range in place by one page: EFAULT says it crosses
 * a mapping's end; ENOMEM says one mapping that cannot grow; success grew
 * one, and the page goes back at once. */
static int one_mapping(char *p, size_t len) {
    size_t ps = _kp_os_page_size();
    int saved_errno = errno;   /* a probe: a successful kp_realloc leaves errno as it was */
    int one = 1;
    if (mremap(p, len, len + ps, 0) == MAP_FAILED) one = errno != EFAULT;
    else munmap(p + len, ps);
    errno = saved_errno;
    return one;
}

/* The longest prefix of [p, p + len) inside one mapping (a page at least). */
static size_t one_mapping_prefix(char *p, size_t len) {
    size_t ps = _kp_os_page_size(), lo = ps, hi = len;   /* lo fits, hi may not */
    if (one_mapping(p, len)) return len;
    while (hi - lo > ps) {
        size_t mid = lo + ((hi - lo) / 2 & ~(ps - 1));
        if (one_mapping(p, mid)) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Move [old, old + old_size) to dst (mapped, new_size bytes; its tail past
 * old_size stays zero), mapping by mapping: pages are moved, not copied
 * (json.dumps growing its buffers: 142 of 365 moves crossed a mapping and
 * were copied and faulted in before). A piece the kernel will not move (out
 * of mappings: checked before dst is touched) is copied. */
int _kp_os_move(void *old, size_t old_size, size_t new_size, void *dst) {
    if (should_fail(&os_fail_next)) return -1;
    char *from = old, *to = dst;
    if (one_mapping(from, old_size))
        return mremap(from, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, to) == (void *)to ? 0 : -1;
    for (size_t done = 0; done < old_size;) {
        size_t len = one_mapping_prefix(from + done, old_size - done);
        if (mremap(from + done, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to + done) != (void *)(to + done)) {
            memcpy(to + done, from + done, len);
            munmap(from + done, len);
        }
        done += len;
    }
    return 0;
}

void _kp_os_unmap(void *p, size_t size) {
    if (p) munmap(p, _kp_align_up(size, _kp_os_page_size()));
}

int _kp_os_release(void *p, size_t size) {
    return madvise(p, size, MADV_DONTNEED);
}

void _kp_os_hint_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size, MADV_HUGEPAGE);
#else
    (void)p; (void)size;
#endif
}

/* ---- metadata ------------------------------------------------------------
 * Structs are rounded to 64 bytes and served from 1 MiB chunks; each rounded
 * size has its own free list. Few distinct sizes exist (span, tcache, pool,
 * arena, pool batch), so a small table with linear search is enough. */
#define META_CHUNK ((size_t)1 << 20)
#define META_KINDS 16

typedef struct meta_free { struct meta_free *next; } meta_free;

static kp_lock meta_lock = { .mutex = PTHREAD_MUTEX_INITIALIZER };
static struct { size_t size; meta_free *free; } meta_kinds[META_KINDS];
static char *meta_cursor, *meta_end;
static _Atomic size_t meta_mapped;

kp_lock *_kp_meta_lock(void) { return &meta_lock; }
size_t _kp_meta_bytes(void) { return atomic_load_explicit(&meta_mapped, memory_order_relaxed); }

static meta_free **meta_list(size_t size) {
    for (int i = 0; i < META_KINDS; i++) {
        if (meta_kinds[i].size == size) return &meta_kinds[i].free;
        if (meta_kinds[i].size == 0) {
            meta_kinds[i].size = size;
            return &meta_kinds[i].free;
        }
    }
    return NULL;
}

void *_kp_meta_alloc(size_t size) {
    if (should_fail(&meta_fail_next)) {
        errno = ENOMEM;
        return NULL;
    }
    size = _kp_align_up(size, KP_CACHELINE);
    void *p = NULL;
    _kp_lock(&meta_lock);
    meta_free **list = meta_list(size);
    if (list && *list) {
        p = *list;
        *list = (*list)->next;
        _kp_unlock(&meta_lock);
        memset(p, 0, size);
        return p;
    }
    if ((size_t)(meta_end - meta_cursor) < size) {
        size_t chunk = size > META_CHUNK ? _kp_align_up(size, META_CHUNK) : META_CHUNK;
        char *c = _kp_os_map(chunk, KP_PAGE_SIZE);
        if (!c) {
            _kp_unlock(&meta_lock);
            return NULL;
        }
        atomic_fetch_add_explicit(&meta_mapped, chunk, memory_order_relaxed);
        meta_cursor = c;
        meta_end = c + chunk;
    }
    p = meta_cursor;       /* fresh pages from mmap are already zero */
    meta_cursor += size;
    _kp_unlock(&meta_lock);
    return p;
}

void _kp_meta_free(void *p, size_t size) {
    if (!p) return;
    size = _kp_align_up(size, KP_CACHELINE);
    _kp_lock(&meta_lock);
    meta_free **list = meta_list(size);
    if (list) {
        meta_free *f = p;
        f->next = *list;
        *list = f;
    }
    _kp_unlock(&meta_lock);
}
