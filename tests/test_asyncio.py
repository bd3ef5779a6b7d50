"""asyncio: BufferPool.acquire_async and ObjectPool.get_async/borrow_async
wait for a free buffer or object without blocking the event loop; timeouts
raise PoolExhausted; cancelled waiters take nothing; threads and coroutines
share a pool."""
import asyncio
import threading
import time

import pytest

from conftest import kpool, run_in_threads


async def _ticker(counter):
    """Counts every 5 ms while the loop is free."""
    while True:
        counter[0] += 1
        await asyncio.sleep(0.005)


def _pools():
    """(make a pool of capacity 1, take one item, give it back)."""
    return [
        pytest.param(lambda: kpool.BufferPool(256, capacity=1),
                     lambda p, timeout=None: p.acquire_async(timeout=timeout),
                     lambda p, item: item.release(), id="BufferPool"),
        pytest.param(lambda: kpool.ObjectPool(bytearray, capacity=1),
                     lambda p, timeout=None: p.get_async(timeout=timeout),
                     lambda p, item: p.put(item), id="ObjectPool"),
    ]


def test_acquire_async_exists_on_instances():
    pool = kpool.BufferPool(64)
    assert asyncio.iscoroutinefunction(pool.acquire_async)
    assert asyncio.iscoroutinefunction(kpool.BufferPool.acquire_async)
    assert kpool.BufferPool.acquire_async.__doc__
    pool.close()


@pytest.mark.parametrize("make,take,give", _pools())
def test_waits_without_blocking_the_loop(make, take, give):
    async def main():
        pool = make()
        held = await take(pool)
        ticks = [0]
        ticker = asyncio.create_task(_ticker(ticks))
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, give, pool, held)          # released by the loop, 0.2 s later
        t0 = time.monotonic()
        got = await take(pool, timeout=10)
        waited = time.monotonic() - t0
        ticker.cancel()
        assert 0.15 <= waited < 5
        assert ticks[0] >= 10, ticks                     # the loop kept running while we waited
        give(pool, got)
        return got

    asyncio.run(main())


@pytest.mark.parametrize("make,take,give", _pools())
def test_released_by_another_thread(make, take, give):
    async def main():
        pool = make()
        held = await take(pool)
        threading.Timer(0.1, give, (pool, held)).start()
        got = await take(pool, timeout=10)
        give(pool, got)

    asyncio.run(main())


@pytest.mark.parametrize("make,take,give", _pools())
def test_timeout_raises_pool_exhausted(make, take, give):
    async def main():
        pool = make()
        held = await take(pool)
        ticks = [0]
        ticker = asyncio.create_task(_ticker(ticks))
        t0 = time.monotonic()
        with pytest.raises(kpool.PoolExhausted, match="timed out"):
            await take(pool, timeout=0.2)
        assert time.monotonic() - t0 >= 0.19
        assert ticks[0] >= 10, ticks
        with pytest.raises(TimeoutError):               # PoolExhausted is a TimeoutError
            await take(pool, timeout=0.05)
        t0 = time.monotonic()
        with pytest.raises(kpool.PoolExhausted):        # timeout 0: at once
            await take(pool, timeout=0)
        assert time.monotonic() - t0 < 0.1
        ticker.cancel()
        give(pool, held)
        got = await take(pool, timeout=0)               # free again: no wait
        give(pool, got)
        assert pool.in_use == 0

    asyncio.run(main())


@pytest.mark.parametrize("make,take,give", _pools())
def test_cancelled_waiter_takes_nothing(make, take, give):
    async def main():
        pool = make()
        held = await take(pool)
        first = asyncio.create_task(take(pool))
        second = asyncio.create_task(take(pool, timeout=10))
        await asyncio.sleep(0.05)
        first.cancel()                                   # cancelled while waiting
        with pytest.raises(asyncio.CancelledError):
            await first
        give(pool, held)
        got = await second                               # the next waiter gets it
        assert pool.in_use == 1
        give(pool, got)
        assert pool.in_use == 0

    asyncio.run(main())


def test_objectpool_wake_passed_on_when_the_woken_waiter_is_cancelled():
    """put() wakes the oldest waiting coroutine; if that one is cancelled
    before it runs, the wake goes to the next one (no lost wake-up)."""
    async def main():
        pool = kpool.ObjectPool(object, capacity=1)
        held = pool.get()
        first = asyncio.create_task(pool.get_async())
        second = asyncio.create_task(pool.get_async(timeout=10))
        await asyncio.sleep(0.02)
        pool.put(held)            # wakes `first` ...
        first.cancel()            # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await second is held

    asyncio.run(main())


def test_borrow_async():
    async def main():
        closed = []
        pool = kpool.ObjectPool(list, reset=list.clear, close=closed.append, capacity=1)
        async with pool.borrow_async() as obj:
            obj.append(1)
            assert pool.in_use == 1
            with pytest.raises(kpool.PoolExhausted):
                async with pool.borrow_async(timeout=0.05):
                    pass
        assert pool.in_use == 0 and pool.idle == 1
        with pytest.raises(RuntimeError):
            async with pool.borrow_async() as obj:
                raise RuntimeError
        assert pool.in_use == 0
        async with pool.borrow_async() as obj:
            assert obj == []
            pool.discard(obj)                            # broken: not put back
        assert closed == [obj] and pool.idle == 0
        async with pool.borrow_async() as obj:
            pool.put(obj)                                # put back inside, and got by another
            again = await pool.get_async()
        assert again is obj and pool.in_use == 1         # the exit left it with its new user
        pool.put(again)

    asyncio.run(main())


def test_many_coroutines_and_threads_share_an_objectpool():
    cap = 2
    pool = kpool.ObjectPool(lambda: [0], reset=lambda o: time.sleep(0.0002), capacity=cap)
    errors = []

    def check():
        s = pool.stats()
        assert s["in_use"] + s["resetting"] <= cap and s["created"] <= cap, s

    def thread_worker():
        try:
            for _ in range(50):
                with pool.borrow(timeout=30) as o:
                    check()
                    o[0] += 1
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    async def coro_worker():
        for _ in range(50):
            async with pool.borrow_async(timeout=30) as o:
                check()
                o[0] += 1
                await asyncio.sleep(0)

    async def main():
        await asyncio.wait_for(asyncio.gather(*(coro_worker() for _ in range(8))), 60)

    ts = [threading.Thread(target=thread_worker) for _ in range(3)]
    for t in ts:
        t.start()
    asyncio.run(main())
    for t in ts:
        t.join()
    assert not errors, errors[0]
    s = pool.stats()
    assert s["gets"] == s["puts"] == 50 * 11 and s["in_use"] == 0 and s["created"] <= cap


def test_pools_shared_by_several_event_loops_in_threads():
    """The class docstrings: safe from many threads and several event
    loops. Four threads, each with its own asyncio.run, share one
    ObjectPool and one BufferPool of capacity 1: every waiter is woken in
    its own loop, nobody holds two at once, and nothing is lost."""
    objects = kpool.ObjectPool(lambda: [0], capacity=1)
    buffers = kpool.BufferPool(64, capacity=1)
    holders = [0, 0]
    lock = threading.Lock()

    async def worker(n):
        for _ in range(n):
            async with objects.borrow_async(timeout=30) as o:
                with lock:
                    holders[0] += 1
                    assert holders[0] == 1
                o[0] += 1
                await asyncio.sleep(0)
                with lock:
                    holders[0] -= 1
            b = await buffers.acquire_async(timeout=30)
            with lock:
                holders[1] += 1
                assert holders[1] == 1
            await asyncio.sleep(0)
            with lock:
                holders[1] -= 1
            b.release()

    async def loop_main():
        await asyncio.wait_for(asyncio.gather(*(worker(25) for _ in range(3))), 60)

    run_in_threads(lambda: asyncio.run(loop_main()), 4)
    s = objects.stats()
    assert s["gets"] == s["puts"] == 4 * 3 * 25 and s["created"] == 1 and s["in_use"] == 0
    assert objects.get() == [4 * 3 * 25]
    assert buffers.stats()["acquires"] == 4 * 3 * 25 and buffers.in_use == 0


def test_the_helper_ends_when_its_only_waiter_is_cancelled():
    """_aio: the helper thread ends as soon as no coroutine waits, without a
    release to wake it, and takes nothing from the pool: a buffer released
    afterwards is there for acquire(timeout=0) at once."""
    from kpool import _aio
    pool = kpool.BufferPool(64, capacity=1)

    async def main():
        held = pool.acquire()
        waiter = asyncio.create_task(pool.acquire_async())
        await asyncio.sleep(0.05)
        assert len(_aio._helpers) == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return held

    held = asyncio.run(main())
    for _ in range(200):                 # the thread notices within one wait slice
        if not _aio._helpers and not any(t.name == "kpool-acquire-async" for t in threading.enumerate()):
            break
        time.sleep(0.01)
    assert not _aio._helpers
    assert not any(t.name == "kpool-acquire-async" for t in threading.enumerate())
    held.release()
    again = pool.acquire(timeout=0)      # nobody took it in between
    assert pool.in_use == 1 and pool.stats()["waits"] == 1
    again.release()
    pool.close()


def test_many_coroutines_share_a_bufferpool():
    pool = kpool.BufferPool(128, capacity=2)

    async def worker(k):
        for i in range(30):
            b = await pool.acquire_async(timeout=30)
            assert pool.in_use <= 2
            memoryview(b)[0] = k
            await asyncio.sleep(0)
            assert memoryview(b)[0] == k
            b.release()

    async def main():
        await asyncio.wait_for(asyncio.gather(*(worker(k) for k in range(10))), 60)

    asyncio.run(main())
    assert pool.in_use == 0
    from kpool import _aio
    time.sleep(0.2)
    assert not _aio._helpers          # the helper thread is gone once nobody waits
    pool.close()


def test_close_fails_waiting_coroutines():
    async def main():
        objs = kpool.ObjectPool(object, capacity=1)
        held = objs.get()
        waiter = asyncio.create_task(objs.get_async())
        await asyncio.sleep(0.02)
        objs.close()
        with pytest.raises(ValueError, match="closed"):
            await waiter
        objs.put(held)

        pool = kpool.BufferPool(64, capacity=1)
        b = pool.acquire()
        waiter = asyncio.create_task(pool.acquire_async(timeout=10))
        await asyncio.sleep(0.05)
        b.release()
        pool_closed = False
        try:
            pool.close()          # succeeds only if the helper has not taken the buffer yet
            pool_closed = True
        except BufferError:
            pass
        if pool_closed:
            with pytest.raises(ValueError, match="closed"):
                await waiter
        else:
            (await waiter).release()
            pool.close()

    asyncio.run(main())


def test_get_async_runs_the_factory_in_the_loop_thread():
    """ObjectPool.get_async's docstring: the factory runs in the event
    loop's thread when a new object is needed."""
    threads = []
    pool = kpool.ObjectPool(lambda: threads.append(threading.get_ident()) or object())

    async def main():
        obj = await pool.get_async()
        pool.put(obj)
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert threads == [loop_thread]
