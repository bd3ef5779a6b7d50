"""tracemalloc sees kpool (issue 16 item 2): heap Blocks, pool buffers and
arena blocks are traced in the domain kpool.TRACEMALLOC_DOMAIN with the
line that allocated them, and untracked when their memory goes back
(release, collection, arena reset)."""
import gc
import sys
import threading
import tracemalloc

import pytest

from conftest import kpool, run_python

DOMAIN = kpool.TRACEMALLOC_DOMAIN


@pytest.fixture
def tracing():
    """tracemalloc on for the test (1 frame), as it was afterwards."""
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start(1)
    yield
    if not was:
        tracemalloc.stop()


def kpool_traces():
    """{(filename, lineno): [sizes]} of the traces in kpool's domain."""
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, DOMAIN)])
    out = {}
    for t in snap.traces:
        frame = t.traceback[0]
        out.setdefault((frame.filename, frame.lineno), []).append(t.size)
    return out


def here():
    """(this file, the caller's next line number)."""
    f = sys._getframe(1)
    return f.f_code.co_filename, f.f_lineno + 1


def test_domain_is_an_int_constant_of_its_own():
    assert isinstance(DOMAIN, int) and DOMAIN == kpool._core.TRACEMALLOC_DOMAIN
    assert DOMAIN not in (0, 389047)  # Python's own domain, numpy's
    assert "TRACEMALLOC_DOMAIN" in kpool.__all__


def test_snapshot_shows_the_allocating_line_of_each_kind(tracing):
    pool = kpool.BufferPool(256)
    arena = kpool.Arena()
    at_heap = here()
    heap = kpool.malloc(1000)
    at_zero = here()
    zeroed = kpool.malloc(3000, zero=True)
    at_pool = here()
    buf = pool.acquire()
    at_arena = here()
    blocks = [arena.alloc(333), arena.alloc(17, align=64)]
    traces = kpool_traces()
    assert traces[at_heap] == [1000]
    assert traces[at_zero] == [3000]
    assert traces[at_pool] == [256]
    assert sorted(traces[at_arena]) == [17, 333]
    # a DomainFilter(False, ...) snapshot (Python's own memory) has none of them
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(False, DOMAIN)])
    assert not any(t.domain == DOMAIN for t in snap.traces)
    heap.release(), zeroed.release(), buf.release()
    arena.reset()
    del blocks
    pool.close()


def test_untracked_after_release_and_collection(tracing):
    pool = kpool.BufferPool(64)
    at = here()
    a, b, c, d = kpool.malloc(10), kpool.malloc(20), pool.acquire(), pool.acquire()
    assert sorted(kpool_traces()[at]) == [10, 20, 64, 64]
    a.release()                 # release()
    del b                       # collected
    with c:                     # the context manager
        pass
    pool.release(d)             # BufferPool.release
    assert not any(k[0] == __file__ for k in kpool_traces())
    pool.close()


def test_reused_pool_buffer_is_traced_where_it_is_acquired_again(tracing):
    pool = kpool.BufferPool(128)
    first = here()
    b = pool.acquire()
    address = b.address
    b.release()
    second = here()
    b = pool.acquire()
    assert b.address == address
    traces = kpool_traces()
    assert first not in traces and traces[second] == [128]
    b.release()
    pool.close()


def test_arena_reset_and_dealloc_untrack_its_blocks(tracing):
    arena = kpool.Arena(chunk_size=4096)
    at = here()
    blocks = [arena.alloc(100 + i) for i in range(200)]   # many chunks
    assert len(kpool_traces()[at]) == 200
    blocks[0].release()         # an arena block's memory is the arena's until reset: still traced
    assert len(kpool_traces()[at]) == 200
    arena.reset()
    assert at not in kpool_traces()
    at2 = here()
    again = [arena.alloc(50) for _ in range(10)]
    assert kpool_traces()[at2] == [50] * 10
    del again, blocks
    gc.collect()
    assert kpool_traces()[at2] == [50] * 10   # reset or dealloc untracks, not the Blocks
    del arena
    gc.collect()
    assert at2 not in kpool_traces()


def test_resize_moves_the_trace(tracing):
    b = kpool.malloc(16)
    at = here()
    b.resize(100000)
    assert kpool_traces()[at] == [100000]
    b.resize(8)
    assert at not in kpool_traces() or kpool_traces()[at] != [100000]
    assert sum(len(v) for k, v in kpool_traces().items() if k[0] == __file__) == 1
    b.release()
    assert not any(k[0] == __file__ for k in kpool_traces())


def test_tracing_started_and_stopped_later():
    """Blocks made while tracemalloc is off have no trace and are released
    without one; tracing started later sees new blocks at once; a stop
    clears them and a new start begins afresh."""
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc was started outside this test")
    before = [kpool.malloc(64), kpool.BufferPool(64)]
    early = before[1].acquire()
    tracemalloc.start(1)
    try:
        assert kpool_traces() == {}
        at = here()
        late = kpool.malloc(77)
        assert kpool_traces()[at] == [77]
        before[0].release()
        early.release()
        assert list(kpool_traces()) == [at]
        tracemalloc.stop()
        tracemalloc.start(1)
        assert kpool_traces() == {}     # stop() cleared every trace, kpool's too
        late.release()                  # its trace is gone already: nothing to do
        at2 = here()
        again = kpool.malloc(5)
        assert kpool_traces() == {at2: [5]}
        again.release()
        assert kpool_traces() == {}
    finally:
        tracemalloc.stop()
        before[1].close()


def test_blocks_made_in_other_threads_are_traced(tracing):
    out = []
    at = here()
    t = threading.Thread(target=lambda: out.append(kpool.malloc(4321)))
    t.start()
    t.join()
    assert kpool_traces()[at] == [4321]
    out.clear()
    assert at not in kpool_traces()


def test_numpy_arrays_on_kpool_stay_in_numpys_domain(tracing):
    """numpy traces its data buffers itself (domain 389047), with kpool's handler too."""
    np = pytest.importorskip("numpy")
    with kpool.use_for_numpy():
        at = here()
        a = np.empty(12345, np.uint8)
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, 389047)])
    assert any(t.size == 12345 and (t.traceback[0].filename, t.traceback[0].lineno) == at for t in snap.traces)
    assert at not in kpool_traces()
    del a


def test_x_tracemalloc_from_the_start():
    """python -X tracemalloc: blocks made at import time are traced too."""
    proc = run_python(
        """
        import tracemalloc, kpool
        b = kpool.malloc(999)
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, kpool.TRACEMALLOC_DOMAIN)])
        print([(t.size, t.traceback[0].lineno) for t in snap.traces])
        """, env={"PYTHONTRACEMALLOC": "3"})
    assert proc.stdout.strip() == "[(999, 3)]"
