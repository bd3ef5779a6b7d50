/* stats.c: what the memory is doing, read without slowing the allocator.
 *
 * Job: kp_stats_get merges the per-thread counters (written by their owners
 * with relaxed stores, no atomics or locks on the fast path), the counters
 * of exited threads, the central lists, the locks and the page heap into
 * one versioned struct; kp_stats_reset moves a baseline so event counters
 * read zero again while gauges (bytes in use, ...) stay; kp_stats_print
 * writes a summary (KPOOL_STATS=1 prints it at exit).
 * bytes_requested is exact while every free told its size (kp_free_sized,
 * the Python API, pools, the stress driver); a plain kp_free counts the
 * block's class size as its request, and requested_exact turns 0.
 * external_fragmentation = 1 - largest contiguous free piece / free bytes
 * held (thread caches, central lists, unreleased page-heap spans); the
 * largest piece is the largest free span, or the largest class with a free
 * object if that is bigger.
 * Calls: tcache (registry), central, pageheap, heap (large figures), os.
 * Locks: the registry lock (inside _kp_tcache_totals), then the page heap
 * lock, one after the other; counters of the other locks are read with
 * relaxed loads. The baseline has a mutex of its own, taken alone (first
 * in the lock order, for fork).
 */
#include "kp_internal.h"

#include <stdlib.h>

typedef struct counters {
    kp_tcache_totals t;
    kp_pageheap_figures ph;
    size_t large_bytes, large_requested;
    uint64_t large_allocs, large_frees, grows, os_releases;
    uint64_t lock_acquires, lock_contended, lock_wait_ns;
    size_t meshed_bytes;
    uint64_t meshes;
} counters;

static pthread_mutex_t baseline_lock = PTHREAD_MUTEX_INITIALIZER;
static counters baseline;   /* under baseline_lock */

/* fork: the baseline lock comes first in the order (init.c takes it first). */
void _kp_stats_fork_lock(void) { pthread_mutex_lock(&baseline_lock); }
void _kp_stats_fork_unlock(void) { pthread_mutex_unlock(&baseline_lock); }

static void add_lock(counters *c, kp_lock *l) {
    c->lock_acquires += KP_LOAD(l->acquires);
    c->lock_contended += KP_LOAD(l->contended);
    c->lock_wait_ns += KP_LOAD(l->wait_ns);
}

/* Raw totals since start. */
static void collect(counters *c) {
    memset(c, 0, sizeof *c);
    _kp_tcache_totals(&c->t);
    for (unsigned k = 0; k < KP_NUM_CLASSES; k++) add_lock(c, &_kp_central(k)->lock);
    add_lock(c, _kp_pageheap_lock());
    add_lock(c, _kp_meta_lock());
    add_lock(c, _kp_registry_lock_ptr());
    add_lock(c, _kp_mesh_lock());
    _kp_mesh_figures(&c->meshed_bytes, &c->meshes);
    _kp_pageheap_figures(&c->ph);
    c->large_bytes = c->ph.large_bytes;
    c->large_requested = c->ph.large_requested;
    c->large_allocs = c->ph.large_allocs;
    c->large_frees = c->ph.large_frees;
    c->grows = c->ph.grows;
    c->os_releases = c->ph.os_releases;
}

static uint64_t since(uint64_t now, uint64_t base) { return now >= base ? now - base : 0; }

int kp_stats_get(kp_stats *out) {
    if (!out || out->struct_size < offsetof(kp_stats, classes)) {
        errno = EINVAL;
        return -1;
    }
    _kp_init();
    size_t want = out->struct_size;
    kp_stats *st = calloc(1, sizeof *st);   /* libc, not kpool: stats must not disturb the heap */
    if (!st) {
        errno = ENOMEM;
        return -1;
    }
    counters now, base;
    collect(&now);
    pthread_mutex_lock(&baseline_lock);
    base = baseline;
    pthread_mutex_unlock(&baseline_lock);
    st->threads = now.t.threads;
    const kp_pageheap_figures ph = now.ph;
    const size_t large_bytes = now.large_bytes, large_requested = now.large_requested;

    st->version = KP_STATS_VERSION;
    st->enabled = KP_STATS;
    st->nclasses = KP_NUM_CLASSES - 1;
    size_t in_use_small = 0, free_tc = 0, free_central = 0, capacity_bytes = 0, largest_class_free = 0;
    uint64_t allocs = 0, frees = 0, unsized = 0, unsized_bytes = 0;
    for (unsigned k = 1; k < KP_NUM_CLASSES; k++) {
        kp_class_stats *cs = &st->classes[k - 1];
        const kp_class_info *ci = &_kp_classes[k];
        kp_central *c = _kp_central(k);
        int64_t live = (int64_t)(now.t.allocs[k] - now.t.frees[k]);
        cs->size = ci->size;
        /* Counters of other threads move while they are summed: keep the
         * figure within what the class's spans can hold. */
        size_t can_live = KP_LOAD(c->spans) * (size_t)ci->objects;
        cs->in_use = live <= 0 ? 0 : (size_t)live < can_live ? (size_t)live : can_live;
        cs->free_in_tcaches = now.t.cached[k];
        cs->free_in_central = KP_LOAD(c->free_objects);
        cs->spans = KP_LOAD(c->spans);
        cs->allocs = since(now.t.allocs[k], base.t.allocs[k]);
        cs->frees = since(now.t.frees[k], base.t.frees[k]);
        unsized_bytes += now.t.unsized[k] * ci->size;
        unsized += now.t.unsized[k];
        in_use_small += cs->in_use * ci->size;
        free_tc += cs->free_in_tcaches * ci->size;
        free_central += cs->free_in_central * ci->size;
        capacity_bytes += cs->spans * (size_t)ci->objects * ci->size;
        if (cs->free_in_tcaches + cs->free_in_central > 0) largest_class_free = ci->size;
        allocs += cs->allocs;
        frees += cs->frees;
    }
    st->bytes_in_use = in_use_small + large_bytes;
    int64_t req = (int64_t)(now.t.requested - unsized_bytes);
    st->bytes_requested = (req > 0 ? (size_t)req : 0) + large_requested;
    if (st->bytes_requested > st->bytes_in_use) st->bytes_requested = st->bytes_in_use;
    st->requested_exact = unsized == 0;
    st->bytes_mapped = ph.mapped;
    st->bytes_released = ph.released;
    st->bytes_free_tcaches = free_tc;
    st->bytes_free_central = free_central;
    st->bytes_free_pageheap = ph.free_bytes;
    st->bytes_metadata = _kp_meta_bytes() + _kp_pagemap_bytes();
    st->largest_free_span = ph.largest_free;
    st->bytes_meshed = now.meshed_bytes;
    st->meshes = since(now.meshes, base.meshes);
    if (st->bytes_meshed > ph.state_bytes[KP_SPAN_SMALL]) st->bytes_meshed = ph.state_bytes[KP_SPAN_SMALL];
    st->bytes_small_spans = ph.state_bytes[KP_SPAN_SMALL] - st->bytes_meshed;
    st->bytes_span_waste = st->bytes_small_spans > capacity_bytes ? st->bytes_small_spans - capacity_bytes : 0;
    st->bytes_large = ph.state_bytes[KP_SPAN_LARGE];
    st->bytes_pools = ph.state_bytes[KP_SPAN_POOL];
    st->bytes_arenas = ph.state_bytes[KP_SPAN_ARENA];

    st->allocs = allocs + since(now.large_allocs, base.large_allocs);
    st->frees = frees + since(now.large_frees, base.large_frees);
    uint64_t misses = since(now.t.tcache_misses, base.t.tcache_misses);
    st->tcache_misses = misses;
    st->tcache_hits = allocs > misses ? allocs - misses : 0;
    st->central_fetches = since(now.t.central_fetches, base.t.central_fetches);
    st->central_returns = since(now.t.central_returns, base.t.central_returns);
    st->pageheap_grows = since(now.grows, base.grows);
    st->large_allocs = since(now.large_allocs, base.large_allocs);
    st->lock_acquires = since(now.lock_acquires, base.lock_acquires);
    st->lock_contended = since(now.lock_contended, base.lock_contended);
    st->lock_wait_ns = since(now.lock_wait_ns, base.lock_wait_ns);
    st->os_releases = since(now.os_releases, base.os_releases);
    st->uncached_ops = since(now.t.uncached_ops, base.t.uncached_ops);
    st->tcaches_unavailable = (uint32_t)_kp_tcache_disabled();

    st->internal_fragmentation =
        st->bytes_in_use ? 1.0 - (double)st->bytes_requested / (double)st->bytes_in_use : 0.0;
    size_t held = free_tc + free_central + ph.free_bytes;
    size_t largest = ph.largest_free > largest_class_free ? ph.largest_free : largest_class_free;
    st->external_fragmentation = held ? 1.0 - (double)(largest < held ? largest : held) / (double)held : 0.0;

    size_t rows_covered = (want - offsetof(kp_stats, classes)) / sizeof(kp_class_stats);
    if (rows_covered < st->nclasses) st->nclasses = rows_covered;   /* the rows it holds in whole */
    size_t n = want < sizeof *st ? want : sizeof *st;
    memcpy(out, st, n);
    out->struct_size = want;
    free(st);
    return 0;
}

void kp_stats_reset(void) {
    _kp_init();
    counters now;
    collect(&now);
    pthread_mutex_lock(&baseline_lock);
    baseline = now;
    pthread_mutex_unlock(&baseline_lock);
}

static void human(char *buf, size_t n, double bytes) {
    const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int u = 0;
    while (bytes >= 1024 && u < 4) { bytes /= 1024; u++; }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
}

void kp_stats_print(FILE *out) {
    if (!out) return;
    kp_stats st = { .struct_size = sizeof st };
    if (kp_stats_get(&st) != 0) return;
    char a[32], b[32];
    fprintf(out, "kpool %s statistics%s\n", kp_version(), st.enabled ? "" : " (counters compiled out)");
    human(a, sizeof a, (double)st.bytes_mapped);
    fprintf(out, "  mapped                %12zu  (%s)\n", st.bytes_mapped, a);
#define ROW(label, v) do { human(a, sizeof a, (double)(v)); \
        fprintf(out, "  %-22s%12zu  (%s)\n", label, (size_t)(v), a); } while (0)
    ROW("  small spans", st.bytes_small_spans);
    ROW("    in use", st.bytes_small_spans - st.bytes_free_tcaches - st.bytes_free_central - st.bytes_span_waste);
    ROW("    free, thread caches", st.bytes_free_tcaches);
    ROW("    free, central lists", st.bytes_free_central);
    ROW("    span tail waste", st.bytes_span_waste);
    if (st.bytes_meshed || st.meshes) ROW("  meshed (no memory)", st.bytes_meshed);
    ROW("  large blocks", st.bytes_large);
    ROW("  pool chunks", st.bytes_pools);
    ROW("  arena chunks", st.bytes_arenas);
    ROW("  free, page heap", st.bytes_free_pageheap);
    ROW("  released to the OS", st.bytes_released);
    ROW("metadata", st.bytes_metadata);
    ROW("in use (blocks)", st.bytes_in_use);
    human(b, sizeof b, (double)st.bytes_requested);
    fprintf(out, "  %-22s%12zu  (%s)%s\n", "requested", st.bytes_requested, b, st.requested_exact ? "" : "  estimate: some frees did not tell their size");
#undef ROW
    double hit = st.allocs ? 100.0 * (double)st.tcache_hits / (double)st.allocs : 0.0;
    fprintf(out, "fragmentation: internal %.1f%%, external %.1f%%\n", 100 * st.internal_fragmentation,
            100 * st.external_fragmentation);
    fprintf(out, "allocs %llu, frees %llu, thread-cache hits %.2f%%, central fetches %llu, returns %llu\n",
            (unsigned long long)st.allocs, (unsigned long long)st.frees, hit,
            (unsigned long long)st.central_fetches, (unsigned long long)st.central_returns);
    fprintf(out, "page heap grows %llu, large allocs %llu, OS releases %llu, threads %zu, uncached ops %llu%s\n",
            (unsigned long long)st.pageheap_grows, (unsigned long long)st.large_allocs,
            (unsigned long long)st.os_releases, st.threads, (unsigned long long)st.uncached_ops,
            st.tcaches_unavailable ? " (thread caches unavailable: no pthread key)" : "");
    if (st.meshes) fprintf(out, "meshing: %llu spans meshed into others\n", (unsigned long long)st.meshes);
    fprintf(out, "locks: %llu acquired, %llu contended, %.3f ms waiting\n", (unsigned long long)st.lock_acquires,
            (unsigned long long)st.lock_contended, (double)st.lock_wait_ns / 1e6);
    fprintf(out, "%8s %10s %10s %10s %12s %12s %6s\n", "class", "in use", "central", "tcaches", "allocs", "frees", "spans");
    for (size_t k = 0; k < st.nclasses; k++) {
        const kp_class_stats *c = &st.classes[k];
        if (!c->allocs && !c->in_use && !c->free_in_central && !c->free_in_tcaches) continue;
        fprintf(out, "%8zu %10zu %10zu %10zu %12llu %12llu %6zu\n", c->size, c->in_use, c->free_in_central,
                c->free_in_tcaches, (unsigned long long)c->allocs, (unsigned long long)c->frees, c->spans);
    }
}

void _kp_stats_print_at_exit(void) { kp_stats_print(stderr); }
