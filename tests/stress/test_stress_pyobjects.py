"""Many Python threads on one BufferPool and one Arena (issue 16 item 4),
checking the invariants as they go: a buffer handed out is nobody else's
(its address is not live elsewhere, its contents stay as its holder wrote
them), in_use never exceeds the capacity, the counters add up at the end
(acquires == releases, in_use == 0, high_water <= capacity), arena blocks
are aligned and never overlap within a generation, a reset kills every
older block and refuses while a view is alive, and the live Block counts
come back to where they started.

With the GIL (a GIL build, where the GIL guards these objects' state;
csrc/python/kpy.h) the threads interleave at the interpreter's switch points; the switch interval is cut
to 10 us for the test so that they switch often, inside acquire/release
and alloc/reset sequences. Each test has a short form (100
operations per thread, in every run) and a long one (marked slow;
KPOOL_STRESS_OPS operations per thread, 20000 by default).

The race tests at the end run tests/stress/nogil_races.py's scenarios:
release() against release() and the Block's uses, resize() against its
readers, BufferPool.close() against acquire()/release() and waiters,
Arena.reset() against the arena Blocks' uses, Blocks handed between
threads, and all that with tracemalloc tracing. Here they run with the GIL
at 10 us switches; `make -C csrc pytsan` runs the same scenarios on a
kpool._core whose locked sections run without the GIL (KPY_NOGIL_EMULATE)
under ThreadSanitizer, where without the binding's locks they race and
crash (make -C csrc pytsan-check).
"""
import os
import random
import sys
import threading

import pytest

import kpool
import nogil_races

OPS = int(os.environ.get("KPOOL_STRESS_OPS", "20000"))
# operations per thread
SCALES = [pytest.param(100, id="short"), pytest.param(OPS, id="long", marks=pytest.mark.slow)]
THREADS = 16


@pytest.fixture(autouse=True)
def fast_switches():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def _run(threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        assert not t.is_alive(), "a worker hung"


def _stamp(b, word):
    """Fill b with the 8-byte pattern word (as memoryview slices)."""
    pattern = word.to_bytes(8, "little")
    n = len(b)
    b[:] = (pattern * (n // 8 + 1))[:n]


def _check(b, word):
    pattern = word.to_bytes(8, "little")
    n = len(b)
    return bytes(b) == (pattern * (n // 8 + 1))[:n]


@pytest.mark.parametrize("ops", SCALES)
@pytest.mark.parametrize("capacity", [None, 8])
def test_threads_share_one_bufferpool(ops, capacity):
    live_before = kpool._core.live_blocks()
    pool = kpool.BufferPool(200, capacity=capacity, zero=capacity is not None)
    live = {}              # address -> owner thread, of every buffer handed out and not released
    live_lock = threading.Lock()
    handoff = []           # buffers released by another thread than the one that acquired them
    errors = []
    max_in_use = [0]
    per_thread = ops
    # a bounded pool: each thread holds one buffer at most and hands none off,
    # so that waiting threads always get one (16 threads, 8 buffers)
    max_held, handoff_share = (3, 0.2) if capacity is None else (1, 0.0)

    def worker(k):
        rng = random.Random(k)
        held = []
        try:
            for i in range(per_thread):
                if held and (len(held) >= max_held or rng.random() < 0.5):
                    b, word = held.pop(rng.randrange(len(held)))
                    if not _check(b, word):
                        errors.append("thread %d: a buffer's contents changed while held" % k)
                    with live_lock:
                        if live.pop(b.address, None) != k:
                            errors.append("thread %d: address %#x was not live as its own" % (k, b.address))
                    if rng.random() < handoff_share:
                        with live_lock:
                            handoff.append((b, word))
                    else:
                        b.release()
                    continue
                if rng.random() < 0.1:      # release something another thread handed off
                    with live_lock:
                        got = handoff.pop() if handoff else None
                    if got is not None:
                        if not _check(*got):
                            errors.append("thread %d: a handed-off buffer changed" % k)
                        got[0].release()
                try:
                    b = pool.acquire(timeout=60.0)
                except kpool.PoolExhausted:
                    errors.append("thread %d: waited 60 s for a buffer" % k)
                    return
                word = (k << 32) | i
                with live_lock:
                    if b.address in live:
                        errors.append("thread %d: address %#x handed out twice" % (k, b.address))
                    live[b.address] = k
                    max_in_use[0] = max(max_in_use[0], pool.in_use)
                if capacity is not None and not _check(b, 0):
                    errors.append("thread %d: a zero=True buffer was not zeroed" % k)
                _stamp(b, word)
                held.append((b, word))
            for b, word in held:
                if not _check(b, word):
                    errors.append("thread %d: a buffer's contents changed while held" % k)
                with live_lock:
                    live.pop(b.address, None)
                b.release()
        except Exception as e:  # pragma: no cover - reported below
            errors.append("thread %d: %r" % (k, e))

    _run([threading.Thread(target=worker, args=(k,)) for k in range(THREADS)])
    for b, word in handoff:
        assert _check(b, word)
        b.release()
    assert not errors, errors[:10]
    st = pool.stats()
    assert st["in_use"] == 0 and pool.in_use == 0
    assert st["acquires"] == st["releases"] and st["acquires"] >= per_thread * THREADS // 2
    assert st["pool_allocs"] == st["pool_frees"]
    if capacity is not None:
        assert st["high_water"] <= capacity and max_in_use[0] <= capacity
    assert st["idle"] >= 0
    assert kpool._core.live_blocks() == live_before
    pool.close()


@pytest.mark.parametrize("ops", SCALES)
def test_threads_share_one_arena(ops):
    live_before = kpool._core.live_blocks()
    arena = kpool.Arena(chunk_size=64 << 10)
    lock = threading.Lock()
    current = {}           # generation -> [(address, size, block, word)]
    errors = []
    resets = [0]
    refused = [0]
    per_thread = ops
    done = threading.Event()

    def worker(k):
        rng = random.Random(k)
        try:
            for i in range(per_thread):
                size = rng.choice([1, 8, 24, 100, 1000, 5000, 70000])
                align = rng.choice([1, 8, 16, 64, 4096])
                b = arena.alloc(size, align)
                gen = arena.generation
                word = (k << 32) | i
                try:
                    address = b.address
                    _stamp(b, word)
                    ok = _check(b, word)
                except ValueError:       # reset meanwhile: the block died, as it should
                    if not b.released:
                        errors.append("thread %d: ValueError from a live arena block" % k)
                    continue
                if address % align:
                    errors.append("thread %d: %d-byte block at %#x is not %d-aligned" % (k, size, address, align))
                if not ok and not b.released:
                    errors.append("thread %d: an arena block changed under its holder" % k)
                with lock:
                    current.setdefault(gen, []).append((address, size, b, word))
                if rng.random() < 0.05:   # hold a view across switches: a reset must refuse meanwhile
                    try:
                        with memoryview(b) as m:
                            m[0] = m[0]
                    except ValueError:
                        pass
        except Exception as e:  # pragma: no cover - reported below
            errors.append("thread %d: %r" % (k, e))

    def resetter():
        rng = random.Random(99)
        while not done.is_set():
            done.wait(rng.random() * 0.01)
            with lock:
                gen = arena.generation
                blocks = current.pop(gen, [])
                # within one generation no two blocks overlap, and each still holds what its writer wrote
                spans = sorted((a, a + n) for a, n, b, w in blocks if not b.released)
                for (a0, e0), (a1, e1) in zip(spans, spans[1:]):
                    if a1 < e0:
                        errors.append("arena blocks overlap: [%#x, %#x) and [%#x, %#x)" % (a0, e0, a1, e1))
                for a, n, b, w in blocks:
                    try:
                        if not _check(b, w):
                            errors.append("an arena block was overwritten within its generation")
                    except ValueError:
                        pass
                try:
                    arena.reset()
                except BufferError:      # a view was alive: nothing was freed
                    refused[0] += 1
                    current.setdefault(gen, []).extend(blocks)
                    continue
                resets[0] += 1
                for a, n, b, w in blocks:
                    if not b.released:
                        errors.append("a block outlived its arena's reset")
                    try:
                        len(b)
                    except ValueError:
                        pass
                    else:
                        errors.append("a block of a reset arena still works")

    r = threading.Thread(target=resetter)
    r.start()
    _run([threading.Thread(target=worker, args=(k,)) for k in range(THREADS)])
    done.set()
    r.join()
    assert not errors, errors[:10]
    arena.reset()
    assert arena.used == 0
    current.clear()
    assert kpool._core.live_blocks() == live_before
    assert resets[0] >= 1


@pytest.mark.parametrize("ops", SCALES)
def test_blocks_released_and_collected_from_many_threads(ops):
    """Heap, pool and arena Blocks made in one thread and released, collected
    or reset in others keep the live counts exact."""
    live_before = kpool._core.live_blocks()
    pool = kpool.BufferPool(64)
    arena = kpool.Arena()
    queue, errors = [], []
    lock = threading.Lock()
    per_thread = ops

    def worker(k):
        rng = random.Random(k)
        try:
            for i in range(per_thread):
                kind = rng.randrange(3)
                b = kpool.malloc(rng.randrange(1, 3000)) if kind == 0 else pool.acquire() if kind == 1 \
                    else arena.alloc(rng.randrange(1, 300))
                with lock:
                    queue.append(b)
                    other = queue.pop(rng.randrange(len(queue))) if len(queue) > 50 else None
                if other is not None:
                    if rng.random() < 0.5:
                        other.release()
                    del other            # collected here, or released above
        except Exception as e:  # pragma: no cover
            errors.append("thread %d: %r" % (k, e))

    _run([threading.Thread(target=worker, args=(k,)) for k in range(THREADS)])
    assert not errors, errors[:10]
    heap, pooled, arena_n = kpool._core.live_blocks()
    assert heap + pooled + arena_n - sum(live_before) == len(queue)
    arena.reset()
    assert kpool._core.live_blocks()[2] == live_before[2]
    queue.clear()
    assert kpool._core.live_blocks() == live_before
    assert pool.in_use == 0
    pool.close()


# ---- races on one object (nogil_races.py) ---------------------------------------

RACE_SCALES = [pytest.param(1, id="short"), pytest.param(max(1, OPS // 2000), id="long", marks=pytest.mark.slow)]


@pytest.mark.parametrize("scale", RACE_SCALES)
def test_release_races_release_and_uses(scale):
    """release() from many threads at once frees a Block once; reads during
    it get the contents or ValueError; a release under a view frees nothing."""
    nogil_races.release_races(rounds=20 * scale)


@pytest.mark.parametrize("scale", RACE_SCALES)
def test_resize_races_readers_and_views(scale):
    res = nogil_races.resize_races(rounds=20 * scale)
    assert res["resized"] + res["refused"] == 20 * scale * 6


@pytest.mark.parametrize("scale", RACE_SCALES)
@pytest.mark.parametrize("wait", [False, True], ids=["nowait", "waiters"])
def test_close_races_acquire_and_release(scale, wait):
    """close() refuses while a buffer is in use and, once it succeeds, every
    acquire (a waiter at capacity too) is ValueError, a second release() is a
    no-op and the counters add up."""
    res = nogil_races.close_races(rounds=8 * scale, wait=wait)
    assert res["acquired"] > 0


@pytest.mark.parametrize("scale", RACE_SCALES)
def test_reset_races_arena_block_uses(scale):
    res = nogil_races.reset_races(rounds=10 * scale)
    assert res["resets"] > 0


@pytest.mark.parametrize("scale", RACE_SCALES)
def test_handoff_races_live_counts(scale):
    nogil_races.handoff_races(rounds=10 * scale)


def test_tracemalloc_races_leave_no_trace():
    nogil_races.tracemalloc_races(rounds=5)


def test_nogil_races_script_runs():
    """The script form that make -C csrc pytsan runs (here on this build)."""
    assert nogil_races.main(["--rounds", "2", "--threads", "4", "--expect-mode", kpool._core._FT_MODE]) == 0
