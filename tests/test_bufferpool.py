"""kpool.BufferPool: acquire/release, capacity and timeouts, waiting with
the GIL released, Ctrl-C during a wait, zero, align, prealloc, stats, trim,
close, buffer-protocol users, threads, bad input and leaks."""
import gc
import os
import socket
import threading
import time

import pytest

from conftest import bytes_in_use, kpool, run_python


def test_acquire_gives_a_block_of_buffer_size():
    pool = kpool.BufferPool(1000)
    b = pool.acquire()
    assert isinstance(b, kpool.Block)
    assert b.size == 1000 and len(memoryview(b)) == 1000
    assert b.usable_size >= 1000
    assert pool.in_use == 1
    b.release()
    assert pool.in_use == 0
    assert pool.idle >= 1


def test_buffers_are_reused():
    pool = kpool.BufferPool(4096)
    a = pool.acquire()
    addr = a.address
    a.release()
    b = pool.acquire()
    assert b.address == addr
    s = pool.stats()
    assert s["acquires"] == 2 and s["releases"] == 1
    assert s["hits"] == 1 and s["misses"] == 1


def test_attributes():
    pool = kpool.BufferPool(512, capacity=3, align=128, zero=True)
    assert pool.buffer_size == 512
    assert pool.capacity == 3
    assert pool.align == 128
    assert pool.zero is True
    assert kpool.BufferPool(8).capacity is None
    assert "BufferPool" in repr(pool)


@pytest.mark.parametrize("align", [16, 64, 256, 4096, 65536, 1 << 20])
def test_every_buffer_is_aligned(align):
    pool = kpool.BufferPool(100, align=align)
    bs = [pool.acquire() for _ in range(20)]
    for b in bs:
        assert b.address % align == 0
    addrs = {b.address for b in bs}
    assert len(addrs) == 20


def test_default_alignment_is_64():
    pool = kpool.BufferPool(10)
    for _ in range(10):
        assert pool.acquire().address % 64 == 0


def test_zero_zeroes_every_acquired_buffer():
    pool = kpool.BufferPool(4096, zero=True)
    for _ in range(5):
        bs = [pool.acquire() for _ in range(8)]
        for b in bs:
            assert bytes(b) == bytes(4096)
            memoryview(b)[:] = b"\xee" * 4096
        for b in bs:
            b.release()


def test_without_zero_contents_are_whatever_was_there():
    pool = kpool.BufferPool(64)
    b = pool.acquire()
    memoryview(b)[:] = b"q" * 64
    b.release()
    # reused as is: no promise, but it is a valid writable buffer
    c = pool.acquire()
    memoryview(c)[:] = b"r" * 64
    assert bytes(c) == b"r" * 64


def test_no_buffer_handed_out_twice():
    pool = kpool.BufferPool(256, capacity=100)
    live = [pool.acquire() for _ in range(100)]
    assert len({b.address for b in live}) == 100
    for b in live[::2]:
        b.release()
    again = [pool.acquire() for _ in range(50)]
    live = live[1::2] + again
    assert len({b.address for b in live}) == 100
    spans = sorted(b.address for b in live)
    assert all(b - a >= 256 for a, b in zip(spans, spans[1:]))


# ---- capacity and timeouts ---------------------------------------------------------

def test_timeout_zero_raises_at_capacity_at_once():
    pool = kpool.BufferPool(64, capacity=2)
    a, b = pool.acquire(), pool.acquire()
    with pytest.raises(kpool.PoolExhausted):
        pool.acquire()
    with pytest.raises(kpool.PoolExhausted):
        pool.acquire(0)
    with pytest.raises(kpool.Error):
        pool.acquire(timeout=0.0)
    a.release()
    c = pool.acquire()
    assert c.size == 64
    assert pool.in_use == 2
    assert pool.stats()["exhausted"] >= 3
    b.release()
    c.release()


def test_positive_timeout_waits_about_that_long():
    pool = kpool.BufferPool(64, capacity=1)
    held = pool.acquire()
    t0 = time.monotonic()
    with pytest.raises(kpool.PoolExhausted):
        pool.acquire(timeout=0.2)
    waited = time.monotonic() - t0
    assert waited >= 0.19
    s = pool.stats()
    assert s["waits"] == 1 and s["timeouts"] == 1
    held.release()


def test_timeout_succeeds_when_released_in_time():
    pool = kpool.BufferPool(64, capacity=1)
    held = pool.acquire()
    threading.Timer(0.1, held.release).start()
    b = pool.acquire(timeout=30)
    assert b.size == 64
    b.release()


def test_none_waits_until_another_thread_releases():
    pool = kpool.BufferPool(128, capacity=2)
    held = [pool.acquire(), pool.acquire()]
    got = []
    started = threading.Event()

    def waiter():
        started.set()
        got.append(pool.acquire(timeout=None))

    t = threading.Thread(target=waiter)
    t.start()
    started.wait()
    time.sleep(0.1)
    assert not got  # still waiting: the pool is at capacity
    held.pop().release()
    t.join(10)
    assert not t.is_alive()
    assert len(got) == 1 and got[0].size == 128
    assert pool.stats()["waits"] >= 1


def test_waiting_releases_the_gil():
    """While one thread waits for a buffer, other Python threads keep running."""
    pool = kpool.BufferPool(64, capacity=1)
    held = pool.acquire()
    progress = []
    stop = threading.Event()

    def spinner():
        while not stop.is_set():
            progress.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=spinner)
    t.start()
    with pytest.raises(kpool.PoolExhausted):
        pool.acquire(timeout=0.3)
    stop.set()
    t.join()
    assert len(progress) > 20
    held.release()


def test_many_waiters_each_get_one():
    pool = kpool.BufferPool(64, capacity=3)
    held = [pool.acquire() for _ in range(3)]
    got = []
    lock = threading.Lock()

    def waiter():
        b = pool.acquire(timeout=30)
        with lock:
            got.append(b)

    ts = [threading.Thread(target=waiter) for _ in range(3)]
    for t in ts:
        t.start()
    time.sleep(0.05)
    for b in held:
        b.release()
    for t in ts:
        t.join(30)
    assert len(got) == 3
    assert len({b.address for b in got}) == 3
    assert pool.in_use == 3


def test_capacity_is_never_exceeded_across_threads():
    pool = kpool.BufferPool(256, capacity=4)
    peak = [0]
    lock = threading.Lock()
    errors = []

    def worker():
        try:
            for _ in range(300):
                b = pool.acquire(timeout=None)
                with lock:
                    peak[0] = max(peak[0], pool.in_use)
                memoryview(b)[0] = 1
                b.release()
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert peak[0] <= 4
    assert pool.in_use == 0
    s = pool.stats()
    assert s["high_water"] <= 4
    assert s["acquires"] == s["releases"] == 8 * 300


def test_ctrl_c_interrupts_a_wait():
    proc = run_python(
        """
        import os, signal, threading, time, kpool
        pool = kpool.BufferPool(64, capacity=1)
        held = pool.acquire()
        for timeout in (None, 60.0):
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            t0 = time.monotonic()
            try:
                pool.acquire(timeout=timeout)
            except KeyboardInterrupt:
                print('interrupted', round(time.monotonic() - t0, 1) < 30)
            else:
                print('not interrupted')
        # the pool still works after the interrupted waits
        held.release()
        b = pool.acquire()
        assert pool.in_use == 1
        print('OK')
        """, timeout=60)
    assert proc.stdout.split("\n")[:2] == ["interrupted True", "interrupted True"]
    assert proc.stdout.strip().endswith("OK")


# ---- release ------------------------------------------------------------------

def test_release_via_pool_and_via_block():
    pool = kpool.BufferPool(64)
    a = pool.acquire()
    pool.release(a)
    assert a.released and pool.in_use == 0
    pool.release(a)  # idempotent, as block.release()
    b = pool.acquire()
    b.release()
    assert pool.stats()["releases"] == 2


def test_release_of_foreign_block_is_value_error():
    p1, p2 = kpool.BufferPool(64), kpool.BufferPool(64)
    a = p1.acquire()
    with pytest.raises(ValueError):
        p2.release(a)
    m = kpool.malloc(64)
    with pytest.raises(ValueError):
        p1.release(m)
    arena = kpool.Arena()
    with pytest.raises(ValueError):
        p1.release(arena.alloc(64))
    assert not a.released and not m.released
    with pytest.raises(TypeError):
        p1.release(bytearray(64))
    with pytest.raises(TypeError):
        p1.release(None)
    p1.release(a)


def test_release_while_view_alive_is_buffer_error_and_frees_nothing():
    pool = kpool.BufferPool(64, capacity=1)
    b = pool.acquire()
    m = memoryview(b)
    m[:2] = b"hi"
    with pytest.raises(BufferError):
        pool.release(b)
    with pytest.raises(BufferError):
        b.release()
    assert pool.in_use == 1
    with pytest.raises(kpool.PoolExhausted):
        pool.acquire()
    assert bytes(m[:2]) == b"hi"
    m.release()
    b.release()
    assert pool.in_use == 0


def test_block_context_manager_returns_to_pool():
    pool = kpool.BufferPool(64, capacity=1)
    for _ in range(10):
        with pool.acquire() as b:
            memoryview(b)[0] = 1
            assert pool.in_use == 1
        assert pool.in_use == 0


def test_gc_returns_buffers_to_the_pool():
    pool = kpool.BufferPool(64, capacity=2)
    for _ in range(20):
        pool.acquire()  # dropped at once: back to the pool
    assert pool.in_use == 0
    a = pool.acquire()
    b = pool.acquire()
    del a, b
    gc.collect()
    assert pool.in_use == 0
    pool.acquire().release()


def test_block_keeps_its_pool_alive():
    b = kpool.BufferPool(64).acquire()  # the pool object is only referenced by b
    memoryview(b)[:] = b"x" * 64
    gc.collect()
    assert bytes(b) == b"x" * 64
    b.release()


# ---- buffer protocol users ---------------------------------------------------------

def test_recv_into_pool_buffer():
    pool = kpool.BufferPool(8192, capacity=2)
    a, c = socket.socketpair()
    try:
        payload = os.urandom(8192)
        a.sendall(payload)
        with pool.acquire() as b:
            view = memoryview(b)
            got = 0
            while got < len(payload):
                got += c.recv_into(view[got:])
            with pytest.raises(BufferError):
                b.release()
            view.release()
            assert bytes(b) == payload
    finally:
        a.close()
        c.close()


def test_readinto_pool_buffer(tmp_path):
    data = os.urandom(65536)
    (tmp_path / "f").write_bytes(data)
    pool = kpool.BufferPool(65536)
    with open(tmp_path / "f", "rb") as f, pool.acquire() as b:
        assert f.readinto(b) == 65536
        assert bytes(b) == data


def test_numpy_on_pool_buffer():
    np = pytest.importorskip("numpy")
    pool = kpool.BufferPool(4096, capacity=1)
    b = pool.acquire()
    a = np.frombuffer(b, dtype=np.uint32)
    a[:] = 7
    with pytest.raises(BufferError):
        b.release()
    assert pool.in_use == 1
    del a
    b.release()
    assert pool.in_use == 0


# ---- prealloc, stats, trim, close -----------------------------------------------

def test_prealloc():
    pool = kpool.BufferPool(1024, capacity=8, prealloc=8)
    assert pool.idle == 8
    assert pool.in_use == 0
    bs = [pool.acquire() for _ in range(8)]
    s = pool.stats()
    assert s["misses"] == 0 and s["hits"] == 8
    assert pool.idle == 0
    with pytest.raises(ValueError):
        kpool.BufferPool(64, capacity=2, prealloc=3)
    with pytest.raises(ValueError):
        kpool.BufferPool(64, prealloc=-1)
    del bs


def test_prealloc_hands_out_the_carved_buffers_in_order():
    pool = kpool.BufferPool(256, prealloc=1000)
    assert pool.idle == 1000
    bs = [pool.acquire() for _ in range(1000)]
    s = pool.stats()
    assert s["misses"] == 0 and s["hits"] == 1000
    addrs = [b.address for b in bs]
    assert len(set(addrs)) == 1000
    assert sum(b > a for a, b in zip(addrs, addrs[1:])) > 900   # carve order, mostly ascending
    del bs


def test_prealloc_beyond_physical_memory_fails_up_front():
    """Issue 15: BufferPool(64, prealloc=10**9) on a smaller machine must not
    map memory until it runs out: MemoryError at once, naming the size."""
    proc = run_python(
        """
        import os, resource, time, kpool
        backing = os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
        for line in open('/proc/meminfo'):
            if line.startswith('SwapTotal:'):
                backing += int(line.split()[1]) * 1024
        n = backing // 64 * 2
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        for size, count in ((64, n), (64, 10**9 if 10**9 * 64 > backing else n), (1 << 20, backing // (1 << 20) + 1)):
            try:
                kpool.BufferPool(size, prealloc=count)
            except MemoryError as e:
                assert str(count) in str(e) and 'bytes' in str(e), str(e)
            else:
                raise SystemExit('prealloc of %d x %d bytes did not fail' % (count, size))
        dt = time.monotonic() - t0
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
        print('fast', dt < 2.0, 'rss_kb', grown < 65536, dt, grown)
        assert kpool.BufferPool(64, prealloc=1000).idle == 1000
        """, timeout=120)
    assert proc.stdout.split()[:4] == ["fast", "True", "rss_kb", "True"], proc.stdout


def test_ctrl_c_interrupts_a_long_prealloc():
    """A prealloc that takes seconds stops at Ctrl-C: KeyboardInterrupt soon
    after the signal, and what was carved is given back."""
    proc = run_python(
        """
        import os, signal, threading, time, kpool
        backing = os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
        n = min(10**8, backing // 64 // 3)        # seconds of carving, within the machine
        before = kpool.stats()['bytes_pools']
        sent = []
        def interrupt():
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Timer(0.3, interrupt).start()
        try:
            kpool.BufferPool(64, prealloc=n)
        except KeyboardInterrupt:
            print('interrupted', time.monotonic() - sent[0] < 3.0)
        else:
            print('completed')
        print('given back', kpool.stats()['bytes_pools'] <= before)
        assert kpool.BufferPool(64, prealloc=1000).idle == 1000
        """, timeout=120)
    assert proc.stdout.split("\n")[:2] == ["interrupted True", "given back True"], proc.stdout


def test_stats_keys_and_consistency():
    pool = kpool.BufferPool(100, capacity=10)
    bs = [pool.acquire() for _ in range(6)]
    for b in bs[:4]:
        b.release()
    bs2 = [pool.acquire() for _ in range(3)]
    s = pool.stats()
    for key in ("acquires", "releases", "hits", "misses", "high_water", "waits"):
        assert isinstance(s[key], int), key
    assert s["acquires"] == 9 and s["releases"] == 4
    assert s["hits"] + s["misses"] == s["acquires"]
    assert s["hits"] == 3
    assert s["high_water"] == 6
    assert s["in_use"] == pool.in_use == 5
    assert s["capacity"] == 10
    assert s["waits"] == 0
    del bs, bs2


def test_trim_gives_memory_back():
    pool = kpool.BufferPool(64 << 10)
    bs = [pool.acquire() for _ in range(64)]
    mapped = pool.stats()["bytes_mapped"]
    assert mapped >= 64 * (64 << 10)
    for b in bs:
        b.release()
    released = pool.trim()
    assert isinstance(released, int)
    assert released > 0
    assert pool.stats()["bytes_mapped"] == mapped - released
    assert pool.idle == 0
    pool.acquire().release()  # still works


def test_idle_after_trim_counts_the_buffers_the_kept_chunks_hold():
    """idle after a trim that keeps a chunk (one buffer still in use) is what
    the pool can hand out again without new memory: acquiring that many is
    all hits, with bytes_mapped unchanged."""
    pool = kpool.BufferPool(256)
    bs = [pool.acquire() for _ in range(300)]
    for b in bs[1:]:
        b.release()
    before = pool.idle
    assert before == 299
    released = pool.trim()
    idle, s = pool.idle, pool.stats()
    assert released > 0 and 0 < idle <= before
    assert idle <= s["free_blocks"]
    again = [pool.acquire() for _ in range(idle)]
    after = pool.stats()
    assert after["misses"] == s["misses"] and after["bytes_mapped"] == s["bytes_mapped"]
    assert pool.idle == 0 and pool.in_use == idle + 1
    for b in again + bs[:1]:
        b.release()


def test_close_rules():
    pool = kpool.BufferPool(64)
    b = pool.acquire()
    with pytest.raises(BufferError):
        pool.close()
    b.release()
    pool.close()
    pool.close()  # idempotent
    assert pool.closed
    with pytest.raises(ValueError):
        pool.acquire()
    with pytest.raises(ValueError):
        pool.trim()
    pool.stats()  # still answers
    # a Block released before close: releasing it again is a no-op, both ways
    b.release()
    assert pool.release(b) is None
    assert b.released and pool.in_use == 0 and pool.stats()["releases"] == 1


def test_stats_after_close_keep_the_counts():
    """Found by tests/test_stateful.py: once closed, stats() said every
    acquire had been a hit (misses 0) and nothing was ever refused, because
    the kp_pool's counters went with it; now they are kept from close()."""
    pool = kpool.BufferPool(64, capacity=2)
    a, b = pool.acquire(), pool.acquire()
    with pytest.raises(kpool.PoolExhausted):
        pool.acquire()
    a.release()
    b.release()
    c = pool.acquire()                      # a reused buffer: a hit
    c.release()
    before = pool.stats()
    assert (before["acquires"], before["hits"], before["misses"], before["exhausted"]) == (3, 1, 2, 1)
    pool.close()
    after = pool.stats()
    for key in ("acquires", "releases", "hits", "misses", "exhausted", "high_water", "pool_allocs", "pool_frees",
                "pool_hits", "pool_misses", "pool_high_water"):
        assert after[key] == before[key], key
    assert after["closed"] and after["bytes_mapped"] == 0 and after["chunks"] == 0 and after["in_use"] == 0
    assert before["free_blocks"] > 0 and after["free_blocks"] == 0 and after["idle"] == 0   # no memory left


def test_context_manager_closes():
    with kpool.BufferPool(64) as pool:
        with pool.acquire() as b:
            memoryview(b)[0] = 1
    assert pool.closed
    with pytest.raises(ValueError):
        pool.acquire()
    with pytest.raises(BufferError):
        with kpool.BufferPool(64) as p2:
            keep = p2.acquire()
    keep.release()
    p2.close()


def test_a_block_that_raises_keeps_its_exception():
    """A buffer left in use by a block that raised used to turn the block's
    exception into a BufferError; now the block's propagates and the pool
    stays open, usable and closable once the buffer is released."""
    with pytest.raises(KeyError, match="the real error") as info:
        with kpool.BufferPool(64) as pool:
            held = pool.acquire()
            raise KeyError("the real error")
    assert not isinstance(info.value, BufferError)
    assert not pool.closed and pool.in_use == 1
    held.release()
    pool.close()
    assert pool.closed
    with pytest.raises(ValueError):            # a block that raises with nothing in use: closed
        with kpool.BufferPool(64) as p3:
            raise ValueError("x")
    assert p3.closed


def test_close_wakes_waiters_with_value_error():
    pool = kpool.BufferPool(64, capacity=1)
    b = pool.acquire()
    result = []

    def waiter():
        try:
            result.append(pool.acquire(timeout=None))
        except ValueError as e:
            result.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    # the waiter gets the buffer released here, or sees the pool closed
    b.release()
    t.join(10)
    assert not t.is_alive()
    if isinstance(result[0], kpool.Block):
        result[0].release()
    pool.close()


def test_no_leak(no_leak):
    before = bytes_in_use()
    for size in (64, 4096, 100_000):
        with kpool.BufferPool(size, capacity=10, prealloc=5) as pool:
            for _ in range(50):
                with pool.acquire() as b:
                    memoryview(b)[0] = 1
    pools = [kpool.BufferPool(512) for _ in range(50)]
    for p in pools:
        p.acquire()
    del pools
    assert bytes_in_use() == before


# ---- bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("size", ["64", 64.0, None, b"x"])
def test_buffer_size_wrong_type(size):
    with pytest.raises(TypeError):
        kpool.BufferPool(size)


@pytest.mark.parametrize("size", [0, -1, -(1 << 80)])
def test_buffer_size_out_of_range(size):
    with pytest.raises(ValueError):
        kpool.BufferPool(size)


def test_buffer_size_huge():
    with pytest.raises((ValueError, OverflowError)):
        kpool.BufferPool(1 << 40)
    with pytest.raises(OverflowError):
        kpool.BufferPool(1 << 80)


@pytest.mark.parametrize("cap", [0, -1, -5])
def test_capacity_out_of_range(cap):
    with pytest.raises(ValueError):
        kpool.BufferPool(64, capacity=cap)


def test_capacity_wrong_type_and_huge():
    with pytest.raises(TypeError):
        kpool.BufferPool(64, capacity="3")
    with pytest.raises(TypeError):
        kpool.BufferPool(64, capacity=2.5)
    with pytest.raises((ValueError, OverflowError)):
        kpool.BufferPool(64, capacity=1 << 62)
    with pytest.raises(OverflowError):
        kpool.BufferPool(64, capacity=1 << 80)


@pytest.mark.parametrize("align", [0, 3, 24, 100, -64, (1 << 20) * 2, 1 << 70])
def test_bad_alignment_is_value_error(align):
    with pytest.raises((ValueError, OverflowError)):
        kpool.BufferPool(64, align=align)


def test_alignment_wrong_type():
    with pytest.raises(TypeError):
        kpool.BufferPool(64, align=64.0)


def test_positional_only_buffer_size():
    with pytest.raises(TypeError):
        kpool.BufferPool(64, 4)  # capacity is keyword-only
    with pytest.raises(TypeError):
        kpool.BufferPool()
    with pytest.raises(TypeError):
        kpool.BufferPool(64, bogus=1)


def test_huge_prealloc_is_memory_error():
    with pytest.raises(MemoryError, match="1099511627776 buffers"):
        kpool.BufferPool(1 << 20, prealloc=1 << 40)


@pytest.mark.parametrize("timeout", [-1, -0.001, float("-inf"), float("nan")])
def test_bad_timeout_is_value_error(timeout):
    pool = kpool.BufferPool(64, capacity=1)
    with pytest.raises(ValueError):
        pool.acquire(timeout)
    with pytest.raises(ValueError):
        pool.acquire(timeout=timeout)
    assert pool.in_use == 0


def test_timeout_wrong_type_and_huge():
    pool = kpool.BufferPool(64, capacity=1)
    with pytest.raises(TypeError):
        pool.acquire("1")
    with pytest.raises(TypeError):
        pool.acquire(timeout=[])
    with pytest.raises(OverflowError):
        pool.acquire(timeout=1e300)
    with pytest.raises(OverflowError):
        pool.acquire(timeout=float("inf"))
    with pytest.raises(TypeError):
        pool.acquire(1, 2)
    with pytest.raises(TypeError):
        pool.acquire(bogus=1)
    assert pool.in_use == 0


def test_timeout_is_seconds_not_a_bool():
    """acquire(True) would read as threading's blocking=True and wait 1 s:
    a bool is a TypeError. Integers of numpy (anything with __index__) are
    seconds like int."""
    np = pytest.importorskip("numpy")
    pool = kpool.BufferPool(64, capacity=1)
    held = pool.acquire()
    for bad in (True, False):
        with pytest.raises(TypeError, match="timeout"):
            pool.acquire(bad)
        with pytest.raises(TypeError, match="timeout"):
            pool.acquire(timeout=bad)
    for zero in (np.int64(0), np.float64(0.0), np.uint8(0)):
        with pytest.raises(kpool.PoolExhausted):
            pool.acquire(zero)
    with pytest.raises(ValueError):
        pool.acquire(np.int64(-1))
    held.release()
    with pool.acquire(np.int32(5)) as b:
        assert b.size == 64
    assert pool.in_use == 0
    # a huge timeout is fine when a buffer is free
    pool.acquire(timeout=1e6).release()


def test_unbounded_pool_from_many_threads_and_cross_thread_release(no_leak):
    import queue

    pool = kpool.BufferPool(512)
    q = queue.Queue()
    errors = []
    live = set()
    lock = threading.Lock()

    def producer(k):
        try:
            for i in range(2000):
                b = pool.acquire()
                with lock:
                    if b.address in live:
                        errors.append(("handed out twice", hex(b.address)))
                    live.add(b.address)
                memoryview(b)[:2] = bytes([k, i % 256])
                q.put((k, i, b))
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    def consumer():
        while True:
            item = q.get()
            if item is None:
                return
            k, i, b = item
            if bytes(memoryview(b)[:2]) != bytes([k, i % 256]):
                errors.append(("damaged", k, i))
            with lock:
                live.discard(b.address)
            b.release()

    cs = [threading.Thread(target=consumer) for _ in range(2)]
    ps = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    for t in cs + ps:
        t.start()
    for t in ps:
        t.join()
    for _ in cs:
        q.put(None)
    for t in cs:
        t.join()
    assert not errors
    assert pool.in_use == 0
    s = pool.stats()
    assert s["acquires"] == s["releases"] == 8000
    pool.close()
