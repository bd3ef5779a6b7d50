"""kpool.stress(): the Python entry point of the C stress driver (argument
checking, the result dict, kpool_stats, Ctrl-C). The workload suites
themselves live in tests/stress/."""
import pytest

from conftest import kpool, run_python

pytestmark = pytest.mark.skipif(not getattr(kpool._core, "HAVE_STRESS", 0), reason="no stress driver in this build")


def test_result_is_a_dict_with_kpool_stats():
    r = kpool.stress("pairs", threads=1, ops=20000)
    assert isinstance(r, dict)
    assert r["workload"] == "pairs" and r["allocator"] == "kpool"
    assert r["corrupt"] == 0
    assert r["ops"] >= 1
    assert isinstance(r["kpool_stats"], dict)
    assert "bytes_in_use" in r["kpool_stats"]


@pytest.mark.parametrize("workload", ["pairs", "mixed", "random", "larson", "prodcons", "frag"])
def test_every_workload_runs_verified(workload):
    r = kpool.stress(workload, threads=2, ops=20000, verify=True, seed=7)
    assert r["corrupt"] == 0
    assert r["workload"] == workload


def test_system_allocator_has_no_kpool_stats():
    r = kpool.stress("mixed", threads=2, ops=10000, allocator="system")
    assert "kpool_stats" not in r
    assert r["corrupt"] == 0


def test_pool_allocator():
    r = kpool.stress("pairs", threads=1, ops=10000, allocator="kpool-pool")
    assert r["corrupt"] == 0


def test_bad_names_are_value_errors():
    with pytest.raises(ValueError):
        kpool.stress("nosuch", ops=10)
    with pytest.raises(ValueError):
        kpool.stress("mixed", allocator="nosuch", ops=10)


@pytest.mark.parametrize("kw", [{"threads": 0}, {"threads": -1}, {"ops": 0}, {"ops": -5}])
def test_bad_counts_are_value_errors(kw):
    with pytest.raises(ValueError):
        kpool.stress("mixed", **kw)


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError):
        kpool.stress(1)
    with pytest.raises(TypeError):
        kpool.stress("mixed", threads="4")
    with pytest.raises(TypeError):
        kpool.stress("mixed", ops=1.5)
    with pytest.raises(TypeError):
        kpool.stress("mixed", allocator=None)
    with pytest.raises(TypeError):
        kpool.stress("mixed", seed="x")
    with pytest.raises(TypeError):
        kpool.stress("mixed", 4)  # options are keyword-only


def test_huge_values():
    with pytest.raises(OverflowError):
        kpool.stress("mixed", ops=1 << 80)
    with pytest.raises((ValueError, OverflowError)):
        kpool.stress("mixed", threads=1 << 40)


def test_ctrl_c_stops_the_workers():
    proc = run_python(
        """
        import os, signal, threading, time, kpool
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            kpool.stress('mixed', threads=2, ops=10**10)
        except KeyboardInterrupt:
            print('interrupted', time.monotonic() - t0 < 60)
        r = kpool.stress('pairs', threads=1, ops=1000)
        assert r['corrupt'] == 0
        print('OK')
        """, timeout=120)
    assert proc.stdout.split() == ["interrupted", "True", "OK"]


def test_corruption_error_is_a_kpool_error():
    assert issubclass(kpool.CorruptionError, kpool.Error)
