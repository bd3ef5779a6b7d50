"""Every stress workload with verification on, for kpool (and kpool-pool
for the one-size workload pairs), at 1, 2, 4 and 8 threads, through
kpool.stress() (C threads, GIL released). Op counts come from the
environment (KPOOL_STRESS_OPS, default 20000) so CI stays short."""
import os

import pytest

import kpool

pytestmark = pytest.mark.slow

OPS = int(os.environ.get("KPOOL_STRESS_OPS", "20000"))
BURST_BYTES = max(1 << 20, OPS * 200)
THREADS = [1, 2, 4, 8]
WORKLOADS = ["pairs", "mixed", "random", "larson", "prodcons", "burst", "frag"]


def _run(workload, threads, allocator="kpool", seed=7):
    kw = {"burst_bytes": BURST_BYTES} if workload == "burst" else {}
    return kpool.stress(workload, threads=threads, ops=OPS, allocator=allocator, seed=seed, verify=True, **kw)


def _check(r, workload, threads, allocator):
    assert r["workload"] == workload
    assert r["allocator"] == allocator
    assert r["threads"] == threads
    assert r["corrupt"] == 0, r["error"]
    assert r["error"] is None
    assert r["stopped"] is False
    assert r["verify"] is True
    assert r["seconds"] > 0
    assert r["ops_per_sec"] > 0
    assert 0 <= r["p50_ns"] <= r["p99_ns"] <= r["p999_ns"] <= r["max_ns"]
    assert r["samples"] >= 1
    assert r["peak_rss"] > 0 and r["final_rss"] > 0
    if workload != "burst":
        assert r["ops"] == OPS
    else:
        assert r["ops"] > 0
        assert r["burst_bytes"] == BURST_BYTES


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_kpool_workload_verified(workload, threads):
    r = _run(workload, threads)
    _check(r, workload, threads, "kpool")
    st = r.get("kpool_stats")
    assert st is not None
    if st["enabled"]:
        assert st["allocs"] >= min(r["ops"], OPS)
        assert st["frees"] >= min(r["ops"], OPS)
    if workload == "larson" and threads > 1:
        assert r["larson_remote_frees"] > 0
    if workload == "burst":
        assert r["rss_full"] >= r["rss_base"]
        assert r["trim"] == "kp_trim"
        assert r["rss_after_trim"] is not None
        assert r["alloc_seconds"] > 0 and r["free_seconds"] > 0
    if workload == "frag":
        assert r["frag_live_refill"] >= r["frag_live_alloc"]
        assert r["frag_live_free90"] < r["frag_live_alloc"]


@pytest.mark.parametrize("threads", THREADS)
def test_kpool_pool_pairs_verified(threads):
    r = _run("pairs", threads, allocator="kpool-pool")
    _check(r, "pairs", threads, "kpool-pool")
    assert r["size"] == 32
    assert r["pool_stats"]["allocs"] == OPS


@pytest.mark.parametrize("size", [1, 7, 8, 24, 100, 4096, 70000])
def test_pairs_sizes_verified(size):
    for allocator in ("kpool", "kpool-pool", "system"):
        r = kpool.stress("pairs", threads=2, ops=OPS, allocator=allocator, size=size, verify=True)
        assert r["corrupt"] == 0 and r["error"] is None
        assert r["size"] == size


@pytest.mark.parametrize("workload", WORKLOADS)
def test_system_workload_verified(workload):
    """The driver itself on glibc: the same checks find nothing there."""
    r = _run(workload, 2, allocator="system")
    _check(r, workload, 2, "system")
    if workload == "burst":
        assert r["trim"] in ("malloc_trim", None)


@pytest.mark.parametrize("workload", ["pairs", "mixed", "random", "larson", "prodcons"])
def test_null_allocator_measures_driver(workload):
    r = kpool.stress(workload, threads=2, ops=OPS, allocator="null", verify=True)
    assert r["corrupt"] == 0 and r["error"] is None
    assert r["verify"] is False          # stamps mean nothing on one shared buffer
    assert r["ops"] == OPS


def test_seeded_runs_repeat():
    a = kpool.stress("frag", threads=1, ops=OPS, seed=42, verify=True)
    b = kpool.stress("frag", threads=1, ops=OPS, seed=42, verify=True)
    c = kpool.stress("frag", threads=1, ops=OPS, seed=43, verify=True)
    assert a["frag_live_alloc"] == b["frag_live_alloc"]
    assert a["frag_live_refill"] == b["frag_live_refill"]
    assert a["frag_live_alloc"] != c["frag_live_alloc"]
