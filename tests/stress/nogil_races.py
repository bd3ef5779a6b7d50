"""Races on one Block, BufferPool or Arena from many threads: release()
against release() and the Block's uses, resize() against its readers,
BufferPool.close() against acquire()/release() (and waiters at capacity),
Arena.reset() against the arena Blocks' uses (b[i], slices, bytes(b),
memoryview), Blocks made in one thread and released or collected in
others, and the same with tracemalloc tracing.

Each scenario lines its threads up on a barrier every round so that the
calls overlap, and checks what a correct binding guarantees: memory is
given back once (kpool aborts on a double free of a pool or large block;
the live counts and the pool's counters would drift), never while a view
is alive, never used after a release or reset (such a use raises
ValueError), contents stay as their holder wrote them, a closed pool
refuses acquire() with ValueError and a release() after close() is a
no-op, and everything comes back to where it started.

Two ways to run them:
  - tests/stress/test_stress_pyobjects.py, with the GIL: the threads
    interleave at the interpreter's switch points (switch interval 10 us);
  - `make -C csrc pytsan`: `python tests/stress/nogil_races.py` on a
    kpool._core built with -DKPY_NOGIL_EMULATE and ThreadSanitizer, where
    everything the binding does under its locks runs in several threads at
    once, as in a free-threaded CPython; TSan must report nothing (and
    `make -C csrc pytsan-check` shows it reports races once the binding's
    locks are compiled out).

    python tests/stress/nogil_races.py [--rounds N] [--threads T] [--only a,b] [--no-wait]
"""
import argparse
import random
import sys
import threading
import time

import kpool

PATTERN = bytes(range(256))


def _run(threads, timeout=300):
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker hung"


def _fill(b, seed):
    """Write the pattern for seed into b (through a slice assignment)."""
    n = len(b)
    p = PATTERN[seed % 256:] + PATTERN[:seed % 256]
    b[:] = (p * (n // 256 + 1))[:n]


def _expected(n, seed):
    p = PATTERN[seed % 256:] + PATTERN[:seed % 256]
    return (p * (n // 256 + 1))[:n]


class Errors:
    """Thread-safe list of what went wrong."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items = []

    def add(self, msg):
        with self.lock:
            self.items.append(msg)

    def check(self, name):
        assert not self.items, "%s: %s" % (name, self.items[:10])


# ---- release() against release() and uses of the memory --------------------------


def release_races(rounds=50, threads=8, **_):
    """Each round: one Block (heap, pool or arena, with the pattern in it)
    and `threads` threads that, at once, release it, read it (b[i], slices,
    len, bytes(b), a memoryview), ask for its size and address. Exactly one
    release frees it; a reader gets the pattern or ValueError; a release
    while a view is alive is BufferError and frees nothing."""
    live_before = kpool._core.live_blocks()
    pool = kpool.BufferPool(256)
    arena = kpool.Arena()
    errors = Errors()
    barrier = threading.Barrier(threads)
    box = [None]

    def worker(k):
        rng = random.Random(k)
        for r in range(rounds):
            if k == 0:
                kind = r % 3
                b = kpool.malloc(256) if kind == 0 else pool.acquire() if kind == 1 else arena.alloc(256)
                _fill(b, r)
                box[0] = (b, r)
            barrier.wait()
            b, seed = box[0]
            want = _expected(256, seed)
            for _ in range(4):
                op = rng.randrange(7)
                try:
                    if op == 0:
                        b.release()
                    elif op == 1:
                        if b[7] != want[7] or b[-1] != want[-1]:
                            errors.add("b[i] read a wrong byte")
                    elif op == 2:
                        if b[3:40] != want[3:40] or b[::17] != want[::17]:
                            errors.add("a slice read wrong bytes")
                    elif op == 3:
                        if bytes(b) != want:
                            errors.add("bytes(b) read wrong bytes")
                    elif op == 4:
                        with memoryview(b) as m:
                            if m[5] != want[5] or len(m) != 256:
                                errors.add("a memoryview read a wrong byte")
                            if b.released:
                                errors.add("a Block with a live view counts as released")
                    elif op == 5:
                        if len(b) != 256 or b.size != 256 or b.usable_size < 256:
                            errors.add("a live Block's size changed")
                        b.address
                    else:
                        repr(b)
                        b.released
                except ValueError:
                    if not b.released:
                        errors.add("ValueError from a live Block")
                except BufferError:      # release() while another thread's view is alive
                    if op != 0:
                        errors.add("BufferError from a use: %d" % op)
            barrier.wait()
            if k == 0:
                b.release()              # whoever did not
                if not b.released:
                    errors.add("release() did not release")
                box[0] = None
            barrier.wait()

    _run([threading.Thread(target=worker, args=(k,)) for k in range(threads)])
    errors.check("release_races")
    assert pool.in_use == 0 and pool.stats()["acquires"] == pool.stats()["releases"]
    arena.reset()
    assert kpool._core.live_blocks() == live_before, (kpool._core.live_blocks(), live_before)
    pool.close()
    return {"rounds": rounds}


# ---- resize() against the Block's readers -----------------------------------------


def resize_races(rounds=50, threads=8, **_):
    """One heap Block resized by one thread between sizes while the others
    read it (len, slices, usable_size, address), write single bytes into it
    and open views (resize() is BufferError meanwhile). Its first 64 bytes
    are 0xAB and stay so (a resize keeps them: 64 is the smallest size), and
    every length seen is one of the sizes it was given."""
    live_before = kpool._core.live_blocks()
    b = kpool.malloc(64)
    b[:] = b"\xab" * 64
    errors = Errors()
    barrier = threading.Barrier(threads)
    sizes = [64, 100, 1000, 4096, 70000, 300000]
    counts = {"resized": 0, "refused": 0}

    def worker(k):
        rng = random.Random(k)
        for r in range(rounds):
            barrier.wait()
            for _ in range(6):
                try:
                    if k == 0:
                        try:
                            b.resize(rng.choice(sizes))
                            counts["resized"] += 1
                        except BufferError:
                            counts["refused"] += 1
                    else:
                        op = rng.randrange(5)
                        if op == 0:
                            n = len(b)
                            if n not in sizes:
                                errors.add("len(b) = %d, never a size of b" % n)
                        elif op == 1:
                            if b[:64] != b"\xab" * 64 or b[10] != 0xAB:
                                errors.add("the first 64 bytes changed")
                            if len(b[:]) not in sizes:
                                errors.add("b[:] has a length b never had")
                        elif op == 2:
                            b[rng.randrange(64)] = 0xAB
                        elif op == 3:
                            if b.usable_size < 64 or not b.address:
                                errors.add("usable_size or address wrong")
                        else:
                            with memoryview(b) as m:
                                if len(m) not in sizes:
                                    errors.add("a view of a size b never had")
                except (ValueError, IndexError) as e:
                    errors.add("%r on a live heap Block" % e)
            barrier.wait()

    _run([threading.Thread(target=worker, args=(k,)) for k in range(threads)])
    errors.check("resize_races")
    assert b[:64] == b"\xab" * 64
    b.release()
    assert kpool._core.live_blocks() == live_before
    return counts


# ---- BufferPool.close() against acquire() and release() ---------------------------


def close_races(rounds=20, threads=8, wait=True, **_):
    """Each round a fresh pool (bounded or not) and `threads` threads that
    acquire, stamp, check and release buffers while one of them calls
    close() until it succeeds (BufferError while a buffer is in use) and
    others read stats(), trim() and repr(). Once closed, acquire() is
    ValueError (a waiter at capacity is woken with ValueError too: wait=True
    makes some acquires wait), release() of a Block already released is a
    no-op, and the counters add up."""
    live_before = kpool._core.live_blocks()
    errors = Errors()
    barrier = threading.Barrier(threads)
    box = [None]
    totals = {"closes_refused": 0, "acquired": 0, "closed_seen": 0}

    def worker(k):
        rng = random.Random(k)
        for r in range(rounds):
            if k == 0:
                box[0] = kpool.BufferPool(96, capacity=None if r % 2 else 3, zero=bool(r % 3 == 0))
            barrier.wait()
            pool = box[0]
            done = []
            if k == 1:               # the closer
                while True:
                    try:
                        pool.close()
                        break
                    except BufferError:
                        totals["closes_refused"] += 1
                        time.sleep(0)
                if not pool.closed:
                    errors.add("close() returned but the pool is not closed")
            else:
                for i in range(400):
                    op = rng.randrange(10)
                    try:
                        if op == 0:
                            st = pool.stats()
                            if st["in_use"] < 0 or (pool.capacity and st["in_use"] > pool.capacity):
                                errors.add("stats() in_use out of range: %r" % st["in_use"])
                        elif op == 1:
                            pool.trim()
                        elif op == 2:
                            repr(pool)
                            pool.in_use, pool.idle, pool.closed
                        else:
                            timeout = 0.02 if wait and op == 3 else 0.0
                            try:
                                b = pool.acquire(timeout=timeout)
                            except kpool.PoolExhausted:
                                continue
                            totals["acquired"] += 1
                            word = (k * 1000 + i) % 256
                            b[:] = bytes([word]) * 96
                            if op == 4:
                                with memoryview(b) as m:
                                    if m[95] != word:
                                        errors.add("a view read another holder's byte")
                            if b[:] != bytes([word]) * 96:
                                errors.add("a buffer changed while held")
                            if op == 5:
                                pool.release(b)
                                pool.release(b)      # again: a no-op
                            else:
                                b.release()
                            done.append(b)
                    except ValueError:           # closed
                        if not pool.closed:
                            errors.add("ValueError from an open pool")
                        totals["closed_seen"] += 1
                        break
            barrier.wait()
            for b in done:                   # after close: no-ops
                b.release()
                pool.release(b)
            if k == 0:
                st = pool.stats()
                if not st["closed"] or st["in_use"] != 0 or st["acquires"] != st["releases"]:
                    errors.add("counters after close: %r" % st)
                try:
                    pool.acquire()
                    errors.add("acquire() on a closed pool")
                except ValueError:
                    pass
                box[0] = None
            barrier.wait()

    _run([threading.Thread(target=worker, args=(k,)) for k in range(threads)])
    errors.check("close_races")
    assert kpool._core.live_blocks() == live_before
    return totals


# ---- Arena.reset() against the arena Blocks' uses ---------------------------------


def reset_races(rounds=30, threads=8, **_):
    """Threads allocate arena blocks, fill them (slice assignment) and read
    them back (b[i], slices, bytes(b), a memoryview) while one thread resets
    the arena whenever no view is alive. A read gets what its writer wrote
    or, once the block's generation is gone, ValueError (and then the block
    says it is released); a reset under a view is BufferError."""
    live_before = kpool._core.live_blocks()
    arena = kpool.Arena(chunk_size=16 << 10)
    errors = Errors()
    barrier = threading.Barrier(threads)
    counts = {"resets": 0, "refused": 0, "dead": 0}

    def worker(k):
        rng = random.Random(k)
        for r in range(rounds):
            barrier.wait()
            if k == 0:
                for _ in range(20):
                    try:
                        arena.reset()
                        counts["resets"] += 1
                    except BufferError:
                        counts["refused"] += 1
                    arena.generation, arena.used
                    time.sleep(0)
            else:
                mine = []
                for i in range(30):
                    size = rng.choice([1, 16, 100, 3000, 20000])
                    seed = k * 100 + i
                    b = b2 = None
                    try:
                        b = arena.alloc(size, rng.choice([1, 16, 64]))
                        _fill(b, seed)
                        mine.append((b, size, seed))
                        b2, n2, s2 = mine[rng.randrange(len(mine))]
                        want = _expected(n2, s2)
                        op = rng.randrange(4)
                        if op == 0:
                            ok = b2[n2 - 1] == want[-1]
                        elif op == 1:
                            ok = b2[: n2 // 2] == want[: n2 // 2]
                        elif op == 2:
                            ok = bytes(b2) == want
                        else:
                            with memoryview(b2) as m:
                                ok = m[0] == want[0] and not b2.released
                        if not ok:
                            errors.add("an arena block does not hold what its writer wrote")
                    except ValueError:
                        counts["dead"] += 1
                        if not (b is not None and b.released) and not (b2 is not None and b2.released):
                            errors.add("ValueError from a live arena block")
                        mine = [x for x in mine if not x[0].released]
            barrier.wait()

    _run([threading.Thread(target=worker, args=(k,)) for k in range(threads)])
    errors.check("reset_races")
    arena.reset()
    assert arena.used == 0
    assert kpool._core.live_blocks() == live_before
    return counts


# ---- Blocks handed between threads, released or collected -------------------------


def handoff_races(rounds=30, threads=8, **_):
    """Blocks of every kind made in one thread and released, dropped
    (collected) or reset in others, with the live counts exact at the end."""
    live_before = kpool._core.live_blocks()
    pool = kpool.BufferPool(64, capacity=threads * 40)
    arena = kpool.Arena()
    errors = Errors()
    shared = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def worker(k):
        rng = random.Random(k)
        for r in range(rounds):
            barrier.wait()
            for i in range(30):
                kind = rng.randrange(3)
                try:
                    b = kpool.malloc(rng.randrange(1, 3000)) if kind == 0 else pool.acquire() if kind == 1 \
                        else arena.alloc(rng.randrange(1, 300))
                    b[0] = 1
                except (ValueError, kpool.PoolExhausted) as e:
                    errors.add("%r" % e)
                    continue
                with lock:
                    shared.append(b)
                    other = shared.pop(rng.randrange(len(shared))) if len(shared) > 20 else None
                if other is not None:
                    if rng.random() < 0.5:
                        other.release()
                    del other
            barrier.wait()
            if k == 0 and r % 10 == 9:
                with lock:
                    shared[:] = [b for b in shared if b.kind != "arena"]
                arena.reset()
            barrier.wait()

    _run([threading.Thread(target=worker, args=(k,)) for k in range(threads)])
    errors.check("handoff_races")
    shared.clear()
    arena.reset()
    assert kpool._core.live_blocks() == live_before
    assert pool.in_use == 0
    pool.close()
    return {"rounds": rounds}


# ---- the same with tracemalloc tracing --------------------------------------------


def tracemalloc_races(rounds=10, threads=6, **_):
    """Heap Blocks resized, pool buffers acquired and released, arena blocks
    allocated and reset from many threads while tracemalloc traces: at the
    end kpool's domain holds no trace of memory that went back."""
    import tracemalloc

    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    try:
        pool = kpool.BufferPool(128)
        arena = kpool.Arena()
        barrier = threading.Barrier(threads)

        def worker(k):
            rng = random.Random(k)
            for r in range(rounds):
                barrier.wait()
                held = []
                for i in range(30):
                    op = rng.randrange(4)
                    if op == 0:
                        b = kpool.malloc(100)
                        b.resize(rng.choice([10, 1000, 70000]))
                        held.append(b)
                    elif op == 1:
                        held.append(pool.acquire())
                    elif op == 2:
                        held.append(arena.alloc(rng.randrange(1, 500)))
                    elif k == 0:
                        try:
                            arena.reset()
                        except BufferError:
                            pass
                for b in held:
                    b.release()
                barrier.wait()

        _run([threading.Thread(target=worker, args=(k,)) for k in range(threads)])
        arena.reset()
        snap = tracemalloc.take_snapshot()
        left = [t for t in snap.traces if t.domain == kpool.TRACEMALLOC_DOMAIN]
        assert not left, "%d kpool traces left" % len(left)
        pool.close()
    finally:
        if not was:
            tracemalloc.stop()
    return {"rounds": rounds}


SCENARIOS = {
    "release": release_races,
    "resize": resize_races,
    "close": close_races,
    "reset": reset_races,
    "handoff": handoff_races,
    "tracemalloc": tracemalloc_races,
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="rounds per scenario (default: each one's own)")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--only", default="", help="comma-separated scenario names (%s)" % ", ".join(SCENARIOS))
    ap.add_argument("--no-wait", action="store_true", help="no acquire waits at capacity in close")
    ap.add_argument("--expect-mode", default=None,
                    help="fail unless kpool._core._FT_MODE is this (gil, free-threaded, emulated, emulated-unlocked)")
    args = ap.parse_args(argv)
    mode = kpool._core._FT_MODE
    print("kpool from %s, kpool._core._FT_MODE %r" % (kpool.__file__, mode), flush=True)
    if args.expect_mode is not None and mode != args.expect_mode:
        print("expected a kpool._core built as %r" % args.expect_mode)
        return 2
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    sys.setswitchinterval(1e-5)
    for name in names:
        kw = {"threads": args.threads, "wait": not args.no_wait}
        if args.rounds is not None:
            kw["rounds"] = args.rounds
        t = time.perf_counter()
        res = SCENARIOS[name](**kw)
        print("%-12s ok %6.2f s  %s" % (name, time.perf_counter() - t, res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
