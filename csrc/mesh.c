/* mesh.c: meshing. Give back the physical pages of sparse small spans
 * without moving any object (Mesh: Powers, Tench, Berger and McGregor,
 * PLDI 2019).
 *
 * Job: two spans of one size class whose live slots do not overlap can
 * share one physical page: the source's live objects are copied into the
 * destination's page at the same offsets, and the source's address range is
 * mapped onto that page. Every pointer stays valid; the source's own page
 * goes back to the OS. central.c picks the pairs (from the spans' free
 * lists) and keeps the accounting; this file does the page work, the fault
 * handler, fork and the figures.
 *
 * Design:
 *  - A span is ordinary anonymous memory until it is meshed. A group's page
 *    lives in one memfd at the file offset equal to its primary's address:
 *    the file is sparse (only pages in use cost memory), and an address is
 *    never the offset of two groups, so offsets need no allocator.
 *  - A group is a primary span and up to KP_MESH_MAX_MEMBERS - 1 aliases.
 *    The primary's free list, allocated and carved are the group's (each
 *    slot index is on the free list, or live through exactly one member,
 *    so no physical slot is handed out twice); aliases stay SMALL in the
 *    pagemap, are never on the partial list, and point at their primary.
 *  - join(dst, src): if dst's page is still anonymous it first moves into
 *    the memfd (write-protect dst, copy it into its file page, mremap the
 *    file page over it). Then src is write-protected, its live slots are
 *    copied into the group's page, and the file page is mapped over src
 *    (MAP_FIXED replaces the mapping in one step; src's pages are freed).
 *  - Writers during the copy: a write to a write-protected span faults; the
 *    SIGSEGV handler sees the span's mesh_busy flag, waits until the span is
 *    remapped, and returns, and the write is retried on the new mapping. No
 *    write is lost and none lands on the old page after its copy. Reads
 *    never fault. Slots the copy writes into are free in the group: only
 *    the holder of the class lock touches them.
 *  - The kernel does not fault: a system call that writes into a block of
 *    a span during its window (microseconds) fails with EFAULT. That, and a
 *    SIGSEGV handler installed while meshing, are why KPOOL_MESH=1 turns
 *    meshing on and the default leaves it off.
 *  - fork(): a shared page would be shared with the child. The prepare
 *    handler gives every member of every group a private copy (write-
 *    protect, copy, mremap an anonymous copy over it). The group keeps
 *    working (its free list still names each slot once) but is never
 *    meshed again; it dissolves when its last block is freed. The child
 *    meshes into a memfd of its own: the parent's file offsets are the
 *    same addresses in both.
 *  - When a group's last block is freed, every member gets fresh private
 *    zero pages again (its kernel mapping merges back with its
 *    neighbours), the file page is punched out, and the spans go back to
 *    the page heap.
 *  - Each member of a group (shared or, after fork, private copies) is a
 *    kernel mapping (VMA) of its own, splitting its neighbour's: meshing
 *    stops at a quarter of vm.max_map_count members, counted until undone.
 *  - Failures (out of memory or mappings) change nothing that matters: a
 *    join whose last remap fails leaves the source as it was (the
 *    destination's overwritten free slots get their free list rebuilt); a
 *    member that cannot be given private pages back keeps its group alive,
 *    to be undone when it empties again; a failed private copy at fork
 *    keeps the file page (and says that the child shares it).
 *  - The handler calls the previous one directly for faults that are not
 *    meshing's (it stays installed); one that chains back into it (it was
 *    installed later, with kpool's as its previous) is detected by the
 *    nesting and given the default action, not a loop.
 *  - Not supported: OS pages larger than kpool's 8 KiB (a remap would
 *    cover a neighbour span); meshing then does not start.
 * Accounting: bytes_meshed = pages of aliases (address space that shares a
 *   primary's physical page); meshes counts joins.
 * Locks: the mesh lock, between the thread registry lock and the class
 *   locks in the order, is held by a pass (one at a time) and by fork's
 *   prepare handler; the class lock of a span is held while it is joined,
 *   split or undone. The fault handler takes no lock.
 */
#include "kp_internal.h"

#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

int _kp_mesh_on;
static int memfd = -1;
static kp_lock mesh_lock = { .mutex = PTHREAD_MUTEX_INITIALIZER };
static _Atomic size_t meshed_bytes;        /* sum over groups of (members mapping the file page - 1) pages */
static _Atomic size_t mapped_members;      /* members of groups (each a kernel mapping of its own) */
static _Atomic size_t max_members;         /* the VMA budget, in members */
static _Atomic uint64_t joins, windows;    /* windows: write-protect windows closed */
static _Atomic uint64_t fault_waits;       /* writes that waited for a window (tests read it) */
static kp_span *groups[KP_NUM_CLASSES];    /* primaries of groups, under the class lock */
static __thread int meshing_here __attribute__((tls_model("initial-exec")));   /* this thread opens windows */

kp_lock *_kp_mesh_lock(void) { return &mesh_lock; }

static size_t span_bytes(const kp_span *s) { return s->npages * KP_PAGE_SIZE; }
static void *span_addr(const kp_span *s) { return (void *)(s->start << KP_PAGE_SHIFT); }
static off_t file_offset(const kp_span *primary) { return (off_t)(primary->start << KP_PAGE_SHIFT); }

/* bytes_meshed counts, per group, the members that show its file page
 * beyond the first: the memory they would cost without it. */
static size_t saving(const kp_span *p, unsigned mapped) { return mapped > 1 ? (mapped - 1) * span_bytes(p) : 0; }
static void set_mapped(kp_span *p, unsigned mapped) {
    size_t was = saving(p, p->mesh_mapped), now = saving(p, mapped);
    if (now > was) atomic_fetch_add(&meshed_bytes, now - was);
    else atomic_fetch_sub(&meshed_bytes, was - now);
    p->mesh_mapped = (uint8_t)mapped;
}

/* ---- test hooks: the mapping budget, and remaps that fail ------------------------- */
size_t _kp_mesh_budget(size_t members) {
    return members ? atomic_exchange(&max_members, members) : atomic_load(&max_members);
}
static _Atomic int fail_next[3];   /* KP_MESH_FAIL_FILE, _MOVE, _ANON */
void _kp_mesh_fail_next(int kind, int n) { atomic_store(&fail_next[kind], n); }
static int should_fail(int kind) {
    int n = atomic_load(&fail_next[kind]);
    while (n > 0)
        if (atomic_compare_exchange_weak(&fail_next[kind], &n, n - 1)) return 1;
    return 0;
}

/* ---- start ------------------------------------------------------------------- */
#if KP_MESH
static size_t read_max_map_count(void) {
    char buf[32];
    int fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 65530;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 65530;
    buf[n] = 0;
    long v = strtol(buf, NULL, 10);
    return v > 0 ? (size_t)v : 65530;
}

static int open_file(void) {
    int fd = memfd_create("kpool-mesh", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)1 << (KP_ADDRESS_BITS - 1)) != 0) {   /* every user address is an offset */
        close(fd);
        fd = -1;
    }
    return fd;
}
#endif

int _kp_mesh_start(void) {
#if KP_MESH
    /* A span must cover whole OS pages: write-protecting or remapping one
     * must not touch its neighbour. */
    if (_kp_os_page_size() > KP_PAGE_SIZE) {
        errno = ENOTSUP;
        return -1;
    }
    _kp_lock(&mesh_lock);
    int rc = 0;
    if (!_kp_mesh_on) {
        memfd = open_file();
        if (memfd < 0) {
            rc = -1;
        } else {
            max_members = read_max_map_count() / 4;
            _kp_mesh_on = 1;
        }
    }
    _kp_unlock(&mesh_lock);
    return rc;
#else
    errno = ENOSYS;
    return -1;
#endif
}

void _kp_mesh_init(void) {
    const char *env = getenv("KPOOL_MESH");
    if (env && env[0] == '1' && env[1] == 0) (void)_kp_mesh_start();
}

/* ---- the fault handler ----------------------------------------------------------- */
/* The handler that was there when kpool's went on top, double-buffered so a
 * fault in one thread never reads one being rewritten (ensure_handler,
 * under the mesh lock), and the very first one (kpool's guard handler, a
 * program's), which a handler that chains back to kpool's would hide. */
static struct sigaction prev_actions[2], first_action;
static _Atomic int prev_index = -1;
static __thread uintptr_t retry_addr __attribute__((tls_model("initial-exec")));
static __thread uint64_t retry_windows __attribute__((tls_model("initial-exec")));
static __thread void *chain_ctx __attribute__((tls_model("initial-exec")));       /* while calling the previous one */
static __thread uintptr_t chain_frame __attribute__((tls_model("initial-exec")));
static __thread int chained __attribute__((tls_model("initial-exec")));           /* a previous handler returned */
static __thread int calling_first __attribute__((tls_model("initial-exec")));     /* chain() is calling first_action */

static int is_default(const struct sigaction *a) {
    return !(a->sa_flags & SA_SIGINFO) && (a->sa_handler == SIG_DFL || a->sa_handler == SIG_IGN);
}

static void call_handler(const struct sigaction *a, int sig, siginfo_t *si, void *ctx) {
    if (a->sa_flags & SA_SIGINFO) a->sa_sigaction(sig, si, ctx);
    else a->sa_handler(sig);
}

/* The fault ends the process as it would have without kpool. */
static void die_of(int sig, siginfo_t *si) {
    signal(sig, SIG_DFL);
    if (si->si_code <= 0) raise(sig);     /* an MMU fault repeats by itself */
}

/* Not a mesh fault: to the handler that was there, called directly (it
 * stays installed under kpool's). One installed after kpool's takes kpool's
 * for its previous handler and may come back: at once, from inside this
 * call (the same context, a deeper frame), or by raise() once it returns
 * (Python's faulthandler: a signal from this process right after). Either
 * way the fault goes to the first handler instead (or the default action),
 * never round again. A handler that jumps out (siglongjmp) leaves nothing
 * behind that a later fault could be taken for. */
static void chain(int sig, siginfo_t *si, void *ctx, int nested) {
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    int back = nested || (chained && si->si_code <= 0);
    chained = 0;
    int i = atomic_load_explicit(&prev_index, memory_order_acquire);
    struct sigaction prev = i < 0 ? first_action : prev_actions[i];
    if (back) {
        if (calling_first || is_default(&first_action) || first_action.sa_sigaction == prev.sa_sigaction) {
            die_of(sig, si);
            return;
        }
        prev = first_action;
        calling_first = 1;
    }
    if (is_default(&prev)) {
        calling_first = 0;
        if (prev.sa_handler == SIG_IGN && si->si_code <= 0) return;   /* kill(SIGSEGV), ignored */
        die_of(sig, si);
        return;
    }
    void *outer_ctx = chain_ctx;
    uintptr_t outer_frame = chain_frame;
    chain_ctx = ctx;
    chain_frame = here;
    call_handler(&prev, sig, si, ctx);
    chain_ctx = outer_ctx;
    chain_frame = outer_frame;
    calling_first = 0;
    chained = 1;
}

/* A write to a span in a mesh window waits for the window to close and is
 * retried. A fault just after a window closed (the handler ran late) is
 * retried once. Anything else, and a fault of the thread that opened the
 * window (a span the program itself made inaccessible), is chained. */
static void on_fault(int sig, siginfo_t *si, void *ctx) {
    int saved_errno = errno;
    /* called by a previous handler from inside chain(): the same context,
     * deeper than chain's frame; anything else is a new fault (a record
     * left by a handler that jumped out is dropped) */
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    int nested = chain_ctx == ctx && here < chain_frame;
    if (!nested) chain_ctx = NULL;
    if (si->si_code > 0 && !meshing_here && !nested) {   /* raised by the MMU, not by kill() */
        uintptr_t at = (uintptr_t)si->si_addr;
        kp_span *s = _kp_pagemap_get(at >> KP_PAGE_SHIFT);
        if (s && s->state == KP_SPAN_SMALL) {
            if (atomic_load_explicit(&s->mesh_busy, memory_order_acquire)) {
                atomic_fetch_add_explicit(&fault_waits, 1, memory_order_relaxed);
                for (unsigned k = 0; atomic_load_explicit(&s->mesh_busy, memory_order_acquire); k++)
                    if (k > 100) sched_yield();
                chained = 0;
                errno = saved_errno;
                return;
            }
            uint64_t w = atomic_load_explicit(&windows, memory_order_acquire);
            if (retry_addr != at || retry_windows != w) {
                retry_addr = at;
                retry_windows = w;
                chained = 0;
                errno = saved_errno;
                return;
            }
        }
    }
    chain(sig, si, ctx, nested);
    errno = saved_errno;
}

/* REQUIRES mesh lock. Put the handler on top (again, if a program or a
 * library such as Python's faulthandler installed its own since: that one
 * becomes the previous handler). */
static void ensure_handler(void) {
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) != 0 || ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fault)) return;
    int i = atomic_load_explicit(&prev_index, memory_order_relaxed);
    int next = i < 0 ? 0 : 1 - i;
    prev_actions[next] = cur;
    if (i < 0) first_action = cur;
    atomic_store_explicit(&prev_index, next, memory_order_release);
    _kp_install_segv(on_fault, NULL);
}

/* ---- page work ------------------------------------------------------------------- */
/* Copies of memory other threads may have written just before it was
 * write-protected: the protection (a TLB shootdown) orders those writes
 * before the copy, which ThreadSanitizer cannot see, so the loop is not
 * instrumented; volatile keeps the compiler from calling memcpy (which the
 * sanitizers intercept). Free blocks are inaccessible to memcheck. */
__attribute__((no_sanitize_thread)) static void copy_words(void *dst, const void *src, size_t n) {
    volatile uint64_t *d = dst;
    const volatile uint64_t *s = src;
    KP_VG_QUIET_BEGIN();
    for (size_t i = 0; i < n / 8; i++) d[i] = s[i];
    KP_VG_QUIET_END();
}

/* The remaps keep what the memory holds, so they bypass the sanitizers'
 * mmap interceptors, which take a mapping for fresh memory written by the
 * caller (ThreadSanitizer would report every later access by another
 * thread as racing with it). */
static void *remap_fixed(void *at, size_t len, int flags, int fd, off_t off) {
    if (should_fail((flags & MAP_ANONYMOUS) ? KP_MESH_FAIL_ANON : KP_MESH_FAIL_FILE)) return MAP_FAILED;
    long r = syscall(SYS_mmap, at, len, PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd, off);
    return r == -1 ? MAP_FAILED : (void *)r;
}
static void *move_fixed(void *from, size_t len, void *to) {
    if (should_fail(KP_MESH_FAIL_MOVE)) return MAP_FAILED;
    long r = syscall(SYS_mremap, from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    return r == -1 ? MAP_FAILED : (void *)r;
}

static int window_open(kp_span *s) {
    atomic_store(&s->mesh_busy, 1);
    if (mprotect(span_addr(s), span_bytes(s), PROT_READ) == 0) return 0;
    atomic_store(&s->mesh_busy, 0);
    return -1;
}

/* Writable again (when the window did not end in a new mapping). */
static void window_abort(kp_span *s) { (void)mprotect(span_addr(s), span_bytes(s), PROT_READ | PROT_WRITE); }

static void window_close(kp_span *s) {
    atomic_fetch_add_explicit(&windows, 1, memory_order_release);
    atomic_store_explicit(&s->mesh_busy, 0, memory_order_release);
}

/* Map primary's file page over s's range (s may be the primary). */
static int map_file_page(kp_span *s, const kp_span *primary) {
    void *at = span_addr(s);
    return remap_fixed(at, span_bytes(s), MAP_SHARED, memfd, file_offset(primary)) == at ? 0 : -1;
}

/* Give s's range private memory again: fresh zero pages, or (copy) a
 * private copy of what it shows now. */
static int map_private(kp_span *s, int copy) {
    void *at = span_addr(s);
    size_t len = span_bytes(s);
    if (!copy) return remap_fixed(at, len, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == at ? 0 : -1;
    void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tmp == MAP_FAILED) return -1;
    copy_words(tmp, at, len);
    if (move_fixed(tmp, len, at) == at) return 0;
    munmap(tmp, len);
    return -1;
}

static void punch(const kp_span *primary) {
    (void)fallocate(memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, file_offset(primary), (off_t)span_bytes(primary));
}

static void group_link(kp_span *p) {
    unsigned cls = p->sizeclass;
    p->group_prev = NULL;
    p->group_next = groups[cls];
    if (groups[cls]) groups[cls]->group_prev = p;
    groups[cls] = p;
}

static void group_unlink(kp_span *p) {
    if (p->group_prev) p->group_prev->group_next = p->group_next;
    else groups[p->sizeclass] = p->group_next;
    if (p->group_next) p->group_next->group_prev = p->group_prev;
    p->group_next = p->group_prev = NULL;
}

/* Move dst's page into the memfd, under write protection. */
static int share(kp_span *dst) {
    size_t len = span_bytes(dst);
    void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, file_offset(dst));
    if (tmp == MAP_FAILED) return -1;
    if (window_open(dst) != 0) {
        munmap(tmp, len);
        return -1;
    }
    copy_words(tmp, span_addr(dst), len);
    int ok = move_fixed(tmp, len, span_addr(dst)) == span_addr(dst);
    if (!ok) {
        window_abort(dst);
        munmap(tmp, len);
        punch(dst);
    }
    window_close(dst);
    if (!ok) return -1;
    dst->mesh_members = 1;
    dst->mesh_mapped = 1;
    dst->mesh_on_file = 1;
    group_link(dst);
    atomic_fetch_add(&mapped_members, 1);
    return 0;
}

int _kp_mesh_join(kp_span *dst, kp_span *src, const uint64_t *src_live) {
    if (atomic_load(&mapped_members) + (dst->mesh_mapped ? 1 : 2) > max_members) return -1;
    if (!dst->mesh_mapped && share(dst) != 0) return -1;
    const size_t size = _kp_classes[src->sizeclass].size;
    char *from = span_addr(src), *to = span_addr(dst);
    if (window_open(src) != 0) return -1;
    for (uint32_t i = 0; i < src->capacity; i++)
        if (src_live[i / 64] >> (i % 64) & 1) copy_words(to + (size_t)i * size, from + (size_t)i * size, size);
    if (map_file_page(src, dst) != 0) {
        /* src's own page still holds its objects; the slots of dst's page
         * the copy wrote were free, but their free-list words are gone */
        window_abort(src);
        window_close(src);
        return -2;
    }
    window_close(src);
    src->mesh_primary = dst;
    src->mesh_on_file = 1;
    src->mesh_next = dst->mesh_next;
    dst->mesh_next = src;
    dst->mesh_members++;
    set_mapped(dst, dst->mesh_mapped + 1u);
    atomic_fetch_add(&mapped_members, 1);
    atomic_fetch_add_explicit(&joins, 1, memory_order_relaxed);
    return 0;
}

/* Every member gets fresh private pages (its kernel mapping merges back
 * with its neighbours); a member whose remap fails stays in the group,
 * which then lives on (its caller keeps it) and is undone another time. */
int _kp_mesh_undo(kp_span *p) {
    kp_span **link = &p->mesh_next;
    for (kp_span *a = *link; a; a = *link) {
        if (map_private(a, 0) != 0) {
            link = &a->mesh_next;     /* still a member */
            continue;
        }
        *link = a->mesh_next;
        if (a->mesh_on_file) set_mapped(p, p->mesh_mapped - 1u);
        a->mesh_primary = a->mesh_next = NULL;
        a->mesh_on_file = 0;
        p->mesh_members--;
        atomic_fetch_sub(&mapped_members, 1);
        _kp_pageheap_free(a);
    }
    if (p->mesh_next || map_private(p, 0) != 0) return -1;
    if (p->mesh_on_file) set_mapped(p, p->mesh_mapped - 1u);
    punch(p);   /* every group got a file page when it was made (share); nothing maps it now */
    atomic_fetch_sub(&mapped_members, 1);
    group_unlink(p);
    p->mesh_members = p->mesh_split = p->mesh_mapped = p->mesh_on_file = 0;
    return 0;
}

/* Give every member of p's group a private copy of the page (fork): all
 * are write-protected first, so no write lands between two copies. The
 * group keeps its members (and their mappings) until it is undone. */
static void split(kp_span *p) {
    static const char cannot[] = "kpool: meshing: could not give a meshed span a private copy before fork; "
                                 "the child shares its page with the parent\n";
    kp_span *m;
    for (m = p; m; m = m->mesh_next)
        if (m->mesh_on_file && window_open(m) != 0) break;
    if (m) {                                       /* not every member could be protected: no copies */
        for (kp_span *q = p; q != m; q = q->mesh_next)
            if (q->mesh_on_file) {
                window_abort(q);
                window_close(q);
            }
        if (write(2, cannot, sizeof cannot - 1) < 0) {}
        p->mesh_split = 1;
        return;
    }
    unsigned mapped = p->mesh_mapped;
    for (m = p; m; m = m->mesh_next) {
        if (!m->mesh_on_file) continue;
        if (map_private(m, 1) == 0) {
            m->mesh_on_file = 0;
            mapped--;
        } else {
            window_abort(m);
        }
    }
    for (m = p; m; m = m->mesh_next)
        if (atomic_load(&m->mesh_busy)) window_close(m);
    if (mapped) {
        if (write(2, cannot, sizeof cannot - 1) < 0) {}
    } else {
        punch(p);
    }
    set_mapped(p, mapped);
    p->mesh_split = 1;
}

/* ---- passes ------------------------------------------------------------------------ */
static size_t pass(unsigned max_joins, size_t min_free, unsigned max_rounds) {
    size_t bytes = 0;
    ensure_handler();
    meshing_here = 1;
    for (unsigned c = 1; c < KP_NUM_CLASSES && max_joins > 0; c++) {
        unsigned n = _kp_central_mesh(c, max_joins, min_free, max_rounds);
        bytes += (size_t)n * _kp_classes[c].npages * KP_PAGE_SIZE;
        max_joins -= n;
    }
    meshing_here = 0;
    return bytes;
}

size_t _kp_mesh_all(void) {
    if (!_kp_mesh_on) return 0;
    _kp_lock(&mesh_lock);
    size_t bytes = pass(UINT32_MAX, 0, UINT32_MAX);
    _kp_unlock(&mesh_lock);
    return bytes;
}

void _kp_mesh_tick(void) {
    static _Atomic uint64_t last_ms;
    uint64_t now = _kp_now_coarse_ms();
    if (now - atomic_load_explicit(&last_ms, memory_order_relaxed) < KP_MESH_PERIOD_MS) return;
    atomic_store_explicit(&last_ms, now, memory_order_relaxed);
    if (pthread_mutex_trylock(&mesh_lock.mutex) != 0) return;
    KP_BUMP(mesh_lock.acquires, 1);
    pass(KP_MESH_TICK_JOINS, KP_MESH_MIN_FREE, 1);   /* one round a class: a bounded pause */
    _kp_unlock(&mesh_lock);
}

/* ---- fork ---------------------------------------------------------------------------- */
void _kp_mesh_fork_prepare(void) {
    _kp_lock(&mesh_lock);
    if (!_kp_mesh_on) return;
    ensure_handler();
    meshing_here = 1;
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        kp_central *central = _kp_central(c);
        _kp_lock(&central->lock);
        for (kp_span *p = groups[c]; p; p = p->group_next)
            if (p->mesh_mapped) split(p);
        _kp_unlock(&central->lock);
    }
    meshing_here = 0;
}

void _kp_mesh_fork_release(void) { _kp_unlock(&mesh_lock); }

/* The child's groups are private (prepare split them), but the memfd is
 * the parent's: its file offsets are addresses the parent uses too, so the
 * child takes a file of its own (or meshes no more if it cannot). */
void _kp_mesh_fork_child(void) {
#if KP_MESH
    if (!_kp_mesh_on) return;
    close(memfd);
    memfd = open_file();
    if (memfd < 0) _kp_mesh_on = 0;
#endif
}

/* ---- figures -------------------------------------------------------------------------- */
uint64_t _kp_mesh_fault_waits(void) { return atomic_load(&fault_waits); }

void _kp_mesh_figures(size_t *bytes, uint64_t *count) {
    *bytes = atomic_load_explicit(&meshed_bytes, memory_order_relaxed);
    *count = atomic_load_explicit(&joins, memory_order_relaxed);
}
