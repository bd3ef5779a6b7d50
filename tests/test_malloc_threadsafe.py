"""kpool from many Python threads: concurrent malloc/free, blocks freed by
another thread than the one that allocated them, threads created and
exited in numbers, and fork() while other threads allocate."""
import queue
import threading

from conftest import bytes_in_use, kpool, run_python

NTHREADS = 8


def _worker(barrier, seed, rounds, errors):
    import random

    rng = random.Random(seed)
    try:
        barrier.wait()
        live = []
        for i in range(rounds):
            size = rng.choice((8, 24, 64, 100, 512, 4096, 20000))
            b = kpool.malloc(size)
            tag = bytes([(seed + i) % 256]) * min(size, 16)
            memoryview(b)[: len(tag)] = tag
            live.append((b, tag))
            if len(live) > 50 or rng.random() < 0.3:
                blk, t = live.pop(rng.randrange(len(live)))
                assert bytes(memoryview(blk)[: len(t)]) == t
                blk.release()
        for blk, t in live:
            assert bytes(memoryview(blk)[: len(t)]) == t
            blk.release()
        kpool.thread_flush()
    except BaseException as e:  # pragma: no cover - reported below
        errors.append(e)


def test_many_threads_malloc_and_free(no_leak):
    barrier = threading.Barrier(NTHREADS)
    errors = []
    ts = [threading.Thread(target=_worker, args=(barrier, s, 3000, errors)) for s in range(NTHREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_blocks_freed_by_another_thread(no_leak):
    q = queue.Queue(maxsize=64)
    n = 5000

    def producer():
        for i in range(n):
            b = kpool.malloc(32 + i % 200)
            memoryview(b)[:4] = i.to_bytes(4, "little")
            q.put((i, b))
        q.put(None)

    bad = []

    def consumer():
        while True:
            item = q.get()
            if item is None:
                return
            i, b = item
            if bytes(memoryview(b)[:4]) != i.to_bytes(4, "little"):
                bad.append(i)
            b.release()

    tp, tc = threading.Thread(target=producer), threading.Thread(target=consumer)
    tp.start()
    tc.start()
    tp.join()
    tc.join()
    assert not bad


def test_many_threads_created_and_exited(no_leak):
    """Each thread's cache goes back when it exits, also without thread_flush:
    the number of thread caches and the free bytes they hold do not grow."""

    def short_life(k):
        keep = [kpool.malloc(64 + k % 7 * 16) for _ in range(40)]
        del keep  # freed into this thread's cache, which dies with the thread

    kpool.thread_flush()
    before = kpool.stats()
    for wave in range(20):
        ts = [threading.Thread(target=short_life, args=(wave * 10 + i,)) for i in range(10)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    kpool.thread_flush()
    s = kpool.stats()
    # 200 threads came and went; only the few alive now keep caches
    assert s["threads"] <= max(before["threads"], threading.active_count()) + 2, (before["threads"], s["threads"])
    assert s["bytes_free_tcaches"] <= before["bytes_free_tcaches"] + 64 * 1024


def test_shared_block_read_from_many_threads():
    b = kpool.malloc(1 << 16)
    memoryview(b)[:] = bytes(range(256)) * 256
    results = []

    def reader():
        results.append(bytes(b) == bytes(range(256)) * 256)

    ts = [threading.Thread(target=reader) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results == [True] * 8
    b.release()


def test_fork_while_threads_allocate():
    """A child forked while other threads allocate can allocate and free at once."""
    proc = run_python(
        """
        import os, threading, kpool, time
        stop = threading.Event()
        def churn(seed):
            live = []
            while not stop.is_set():
                for i in range(200):
                    live.append(kpool.malloc(16 + (seed * 31 + i) % 3000))
                del live[:]
        ts = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
        for t in ts:
            t.start()
        time.sleep(0.05)
        pids = []
        for k in range(10):
            pid = os.fork()
            if pid == 0:
                try:
                    blocks = [kpool.malloc(n) for n in range(1, 5000, 3)]
                    for b in blocks:
                        memoryview(b)[:1] = b'z' if b.size else b''
                    del blocks
                    p = kpool.BufferPool(4096, capacity=4)
                    with p.acquire() as x:
                        memoryview(x)[0] = 1
                    kpool.stats()
                    kpool.trim()
                    os._exit(0)
                except BaseException as e:
                    os.write(2, repr(e).encode())
                    os._exit(1)
            pids.append(pid)
            time.sleep(0.01)
        stop.set()
        for t in ts:
            t.join()
        codes = [os.waitpid(pid, 0)[1] for pid in pids]
        print(codes)
        assert all(c == 0 for c in codes), codes
        print('OK')
        """, timeout=120)
    assert proc.stdout.strip().endswith("OK")


def test_threads_dying_while_holding_blocks_owned_elsewhere(no_leak):
    """Blocks allocated by threads that exited stay valid and can be freed later."""
    out = []

    def make():
        for i in range(100):
            b = kpool.malloc(48 + i)
            memoryview(b)[:] = bytes([i]) * b.size
            out.append(b)

    ts = [threading.Thread(target=make) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for j, b in enumerate(out):
        i = j % 100
        assert bytes(b) == bytes([i]) * b.size
    out.clear()
    assert bytes_in_use() >= 0
