"""kpool.stats(), stats_reset(), stats_array(), trim(), thread_flush():
keys, types, and figures that move as the allocator works."""
import gc
import threading

import pytest

from conftest import bytes_in_use, class_record, kpool, run_python

KEYS = ["bytes_in_use", "bytes_requested", "bytes_mapped", "bytes_released", "allocs", "frees", "tcache_hits",
        "central_fetches", "pageheap_grows", "lock_acquires", "lock_contended", "lock_wait_ns",
        "internal_fragmentation", "external_fragmentation", "classes"]
CLASS_KEYS = ["size", "in_use", "free_in_central", "free_in_tcaches", "allocs", "frees"]


def test_stats_has_the_documented_keys():
    s = kpool.stats()
    for k in KEYS:
        assert k in s, k
    for k in KEYS[:-3]:
        assert isinstance(s[k], int) and s[k] >= 0, k
    for k in ("internal_fragmentation", "external_fragmentation"):
        assert isinstance(s[k], float) and 0.0 <= s[k] <= 1.0, k
    assert isinstance(s["classes"], list) and s["classes"]
    for c in s["classes"]:
        for k in CLASS_KEYS:
            assert isinstance(c[k], int) and c[k] >= 0, k
    sizes = [c["size"] for c in s["classes"]]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    assert sizes[0] <= 16 and sizes[-1] >= 65536


def test_stats_returns_fresh_dicts():
    a, b = kpool.stats(), kpool.stats()
    assert a is not b and a["classes"] is not b["classes"]


def test_size_class_steps():
    sizes = [c["size"] for c in kpool.stats()["classes"]]
    small = [s for s in sizes if s <= 128]
    assert all(b - a <= 16 for a, b in zip(small, small[1:]))
    mid = [s for s in sizes if 128 <= s <= 1024]
    assert all(b - a <= 16 for a, b in zip(mid, mid[1:]))
    big = [s for s in sizes if s >= 1024]
    assert all(b <= a * 1.125 + 128 for a, b in zip(big, big[1:]))


def test_mapped_memory_is_accounted_for():
    keep = [kpool.malloc(s) for s in (10, 100, 1000, 10000, 100000, 1 << 20)]
    s = kpool.stats()
    parts = (s["bytes_small_spans"] + s["bytes_meshed"] + s["bytes_large"] + s["bytes_pools"] + s["bytes_arenas"]
             + s["bytes_free_pageheap"] + s["bytes_released"])
    assert parts == s["bytes_mapped"]
    del keep


def test_n_allocations_move_allocs_and_bytes_in_use():
    n, size = 1000, 200
    gc.collect()
    before = kpool.stats()
    c_before = class_record(size, before)
    blocks = [kpool.malloc(size) for _ in range(n)]
    after = kpool.stats()
    c_after = class_record(size, after)
    assert after["allocs"] - before["allocs"] >= n
    assert after["bytes_in_use"] - before["bytes_in_use"] >= n * size
    if before["requested_exact"] and after["requested_exact"]:
        assert after["bytes_requested"] - before["bytes_requested"] >= n * size
    assert c_after["allocs"] - c_before["allocs"] >= n
    assert c_after["in_use"] - c_before["in_use"] >= n
    assert c_after["size"] >= size
    for b in blocks:
        b.release()
    done = kpool.stats()
    assert done["frees"] - after["frees"] >= n
    assert done["bytes_in_use"] == before["bytes_in_use"]
    if before["requested_exact"] and done["requested_exact"]:
        assert done["bytes_requested"] == before["bytes_requested"]
    assert class_record(size, done)["in_use"] == c_before["in_use"]


def test_bytes_requested_is_exact_for_python_blocks():
    """Exact while every free told its size (a fresh process: other tests
    free through plain kp_free via cffi and the stress driver)."""
    proc = run_python(
        """
        import kpool
        s0 = kpool.stats()
        assert s0["requested_exact"], s0["requested_exact"]
        sizes = (1, 2, 3, 100, 1001, 70000, 300000)
        blocks = [kpool.malloc(n) for n in sizes]
        pool = kpool.BufferPool(1000)
        pb = pool.acquire()
        s1 = kpool.stats()
        assert s1["requested_exact"]
        assert s1["bytes_requested"] - s0["bytes_requested"] == sum(sizes), (s0["bytes_requested"], s1["bytes_requested"])
        del blocks, pb
        s2 = kpool.stats()
        assert s2["bytes_requested"] == s0["bytes_requested"], s2["bytes_requested"]
        assert s2["requested_exact"]
        print("OK")
        """)
    assert proc.stdout.strip() == "OK"


def test_thread_flush_empties_this_threads_cache():
    size = 3000
    blocks = [kpool.malloc(size) for _ in range(200)]
    for b in blocks:
        b.release()
    assert class_record(size)["free_in_tcaches"] > 0 or class_record(size)["free_in_central"] > 0
    kpool.thread_flush()
    assert class_record(size)["free_in_tcaches"] == 0


def test_thread_exit_flushes_its_cache():
    size = 5000
    before = class_record(size)["free_in_tcaches"]

    def work():
        bs = [kpool.malloc(size) for _ in range(100)]
        del bs

    t = threading.Thread(target=work)
    t.start()
    t.join()
    # join() returns when the Python thread is done; its OS thread (whose
    # exit flushes the cache) may still be finishing
    import time

    deadline = time.monotonic() + 5
    while class_record(size)["free_in_tcaches"] > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert class_record(size)["free_in_tcaches"] <= before


def test_tcache_hits_and_central_fetches_move():
    kpool.thread_flush()
    before = kpool.stats()
    for _ in range(1000):
        kpool.malloc(48).release()
    after = kpool.stats()
    assert after["tcache_hits"] - before["tcache_hits"] >= 900
    kpool.thread_flush()
    mid = kpool.stats()
    bs = [kpool.malloc(112) for _ in range(2000)]
    assert kpool.stats()["central_fetches"] > mid["central_fetches"]
    del bs


def test_pageheap_grows_and_large_allocs():
    before = kpool.stats()
    # larger than everything mapped so far: the page heap must grow
    size = before["bytes_mapped"] + (16 << 20)
    big = kpool.malloc(size)
    after = kpool.stats()
    assert after["pageheap_grows"] > before["pageheap_grows"]
    assert after["bytes_mapped"] >= before["bytes_mapped"] + size
    assert after["bytes_large"] >= size
    assert after["large_allocs"] > before["large_allocs"]
    del big


def test_stats_reset_zeroes_counters_not_gauges():
    keep = [kpool.malloc(100) for _ in range(10)]
    in_use = kpool.stats()["bytes_in_use"]
    kpool.stats_reset()
    s = kpool.stats()
    assert s["allocs"] == 0 and s["frees"] == 0 and s["tcache_hits"] == 0
    assert s["lock_contended"] == 0 and s["lock_wait_ns"] == 0
    assert s["bytes_in_use"] == in_use
    kpool.malloc(10).release()
    assert kpool.stats()["allocs"] == 1
    del keep


def test_trim_returns_memory():
    bs = [kpool.malloc(100_000) for _ in range(100)]
    del bs
    kpool.thread_flush()
    released_before = kpool.stats()["bytes_released"]
    n = kpool.trim()
    assert isinstance(n, int) and n >= 0
    s = kpool.stats()
    assert s["bytes_released"] >= released_before
    assert s["bytes_free_pageheap"] == 0 or n > 0


def test_lock_contention_moves_when_threads_fight():
    """Several C threads hammering shared lists make lock_contended and
    lock_wait_ns move (the stress driver runs real threads, no GIL)."""
    if not getattr(kpool._core, "HAVE_STRESS", 0):
        pytest.skip("no stress driver in this build")
    kpool.stats_reset()
    for attempt in range(6):
        kpool.stress("larson", threads=4, ops=200_000 * (attempt + 1), verify=False)
        kpool.stress("prodcons", threads=4, ops=200_000 * (attempt + 1), verify=False)
        s = kpool.stats()
        if s["lock_contended"] > 0 and s["lock_wait_ns"] > 0:
            break
    assert s["lock_contended"] > 0
    assert s["lock_wait_ns"] > 0
    assert s["lock_acquires"] >= s["lock_contended"]


def test_python_threads_keep_lock_counters_consistent():
    kpool.stats_reset()

    def work():
        for _ in range(3000):
            kpool.malloc(64).release()
        kpool.thread_flush()

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    s = kpool.stats()
    assert s["lock_acquires"] > 0
    assert s["lock_contended"] <= s["lock_acquires"]


def test_fragmentation_figures():
    """Freeing every other small block fragments (free memory sits in
    half-used spans, unusable for a large request); freeing all of them
    does not. Internal: 65-byte requests in 80-byte classes waste more than
    64 in 64. In a fresh process, where bytes_requested is exact."""
    proc = run_python(
        """
        import kpool
        blocks = [kpool.malloc(96) for _ in range(40000)]
        del blocks[::2]
        kpool.thread_flush()
        fragmented = kpool.stats()["external_fragmentation"]
        del blocks
        kpool.thread_flush()
        whole = kpool.stats()["external_fragmentation"]
        odd = [kpool.malloc(65) for _ in range(40000)]
        s = kpool.stats()
        assert s["requested_exact"]
        odd_internal = s["internal_fragmentation"]
        del odd
        even = [kpool.malloc(64) for _ in range(40000)]
        even_internal = kpool.stats()["internal_fragmentation"]
        del even
        print(fragmented, whole, odd_internal, even_internal)
        """)
    fragmented, whole, odd_internal, even_internal = map(float, proc.stdout.split())
    assert fragmented > 0.9
    assert fragmented > whole + 0.3
    assert odd_internal > even_internal
    assert odd_internal > 0.1
    assert even_internal < 0.05


def test_pool_and_arena_bytes_appear():
    before = kpool.stats()
    pool = kpool.BufferPool(1 << 16)
    bs = [pool.acquire() for _ in range(16)]
    arena = kpool.Arena()
    arena.alloc(1000)
    s = kpool.stats()
    assert s["bytes_pools"] >= before["bytes_pools"] + 16 * (1 << 16)
    assert s["bytes_arenas"] >= before["bytes_arenas"] + 1000
    del bs


def test_stats_array():
    np = pytest.importorskip("numpy")
    keep = [kpool.malloc(100) for _ in range(10)]
    arr = kpool.stats_array()
    assert isinstance(arr, np.ndarray)
    for k in CLASS_KEYS:
        assert k in arr.dtype.names
    snap = kpool.stats()
    assert len(arr) == len(snap["classes"])
    assert list(arr["size"]) == [c["size"] for c in snap["classes"]]
    assert (np.diff(arr["size"].astype(np.int64)) > 0).all()
    row = arr[np.searchsorted(arr["size"], 100)]
    assert row["in_use"] >= 10
    # from a given snapshot
    arr2 = kpool.stats_array(snap)
    assert (arr2["allocs"] == np.array([c["allocs"] for c in snap["classes"]])).all()
    del keep


def test_stats_array_without_numpy_says_so():
    proc = run_python(
        """
        import sys
        sys.modules['numpy'] = None
        import kpool
        try:
            kpool.stats_array()
        except ImportError as e:
            print('numpy' in str(e))
        """)
    assert proc.stdout.strip() == "True"


def test_bytes_in_use_helper_consistent():
    gc.collect()
    a = bytes_in_use()
    b = kpool.malloc(12345)
    assert bytes_in_use() >= a + 12345
    b.release()
    assert bytes_in_use() == a


def test_stats_says_whether_thread_caches_are_available():
    """uncached_ops counts calls served without a thread cache;
    tcaches_unavailable is False unless the process ran out of pthread keys
    (the C test test_nokeys covers that case)."""
    s = kpool.stats()
    assert s["tcaches_unavailable"] is False
    assert isinstance(s["uncached_ops"], int) and s["uncached_ops"] >= 0


@pytest.mark.parametrize("value,shown", [("1", True), ("0", False), ("", False)])
def test_kpool_stats_env_prints_the_summary_at_exit(value, shown):
    """kpool.h: KPOOL_STATS=1 prints kp_stats_print's summary to stderr at
    exit (also in a Python process, which links kpool's core); 0 or empty: nothing."""
    proc = run_python("import kpool\nb = kpool.malloc(100)\nb.release()\n", env={"KPOOL_STATS": value})
    header = "kpool %s statistics" % kpool.__version__
    assert (header in proc.stderr) == shown, proc.stderr[-2000:]
    if shown:
        assert "allocs 1, frees 1" in proc.stderr   # the one malloc above, and its release
