"""BufferPool.acquire_async: waiting for a buffer without blocking asyncio.

BufferPool is a C type whose release() wakes only threads waiting in
acquire(), so coroutines wait through a helper thread: the first coroutine
that finds a pool at capacity starts one thread for that pool; it waits in
pool.acquire() (the GIL released, woken by every release) and hands each
Block it gets to the oldest coroutine still waiting, through that
coroutine's loop (call_soon_threadsafe). The thread ends as soon as no
coroutine waits on its pool: the last waiter to stop waiting (cancelled,
timed out) interrupts the thread's acquire (BufferPool._interrupt_waits),
so it takes no buffer that nobody awaits. A coroutine whose Block arrived
as it was cancelled releases it, so nothing leaks.

Invariants (under _lock): _helpers holds a helper exactly while its thread
runs; a helper's waiters are the coroutines registered on it, in order,
each with active False once it stopped waiting.
"""

import threading
import time
from collections import deque

from ._core import PoolExhausted
from ._objectpool import _timeout_arg

_lock = threading.Lock()
_helpers = {}            # id(pool) -> _Helper (the helper holds the pool, so the id stays unique)


class _Waiter:
    __slots__ = ("loop", "fut", "deadline", "active")

    def __init__(self, loop, fut, deadline):
        self.loop, self.fut, self.deadline, self.active = loop, fut, deadline, True

    # in the waiter's loop:
    def give(self, block):
        if self.fut.done():
            block.release()       # too late (cancelled, timed out): back to the pool, waking the next
        else:
            self.fut.set_result(block)

    def fail(self, exc):
        if not self.fut.done():
            self.fut.set_exception(exc)


class _Helper:
    def __init__(self, pool):
        self.pool = pool
        self.waiters = deque()
        self.thread = threading.Thread(target=self._run, name="kpool-acquire-async", daemon=True)

    def _run(self):
        pool = self.pool
        while True:
            with _lock:
                now = time.monotonic()
                live = [w for w in self.waiters if w.active and (w.deadline is None or w.deadline > now)]
                self.waiters = deque(live)
                if not live:
                    del _helpers[id(pool)]
                    return
                # wait as long as the most patient waiter (its own timer fails the others)
                timeout = None if any(w.deadline is None for w in live) else max(w.deadline for w in live) - now
                since = pool._interrupts      # a waiter that stops after this interrupts the acquire
            try:
                block = pool._acquire_interruptible(timeout, since)
            except PoolExhausted:
                continue
            except BaseException as e:     # closed pool (ValueError), MemoryError
                with _lock:
                    waiters, self.waiters = list(self.waiters), deque()
                for w in waiters:
                    self._call(w, w.fail, e)
                continue
            if block is not None:             # None: interrupted, look at the waiters again
                self._deliver(block)

    def _deliver(self, block):
        while True:
            with _lock:
                w = None
                while self.waiters:
                    w = self.waiters.popleft()
                    if w.active:
                        break
                    w = None
            if w is None:
                block.release()
                return
            if self._call(w, w.give, block):
                return

    @staticmethod
    def _call(w, fn, arg):
        try:
            w.loop.call_soon_threadsafe(fn, arg)
            return True
        except RuntimeError:               # the waiter's loop is closed
            return False


async def acquire_async(self, timeout=None):
    """Coroutine: acquire() that waits without blocking the event loop.

    ``block = await pool.acquire_async()`` returns a Block at once when one
    is free; at capacity it waits until one is released. The default
    timeout is None (wait as long as it takes, as asyncio.Queue.get does;
    this is what the async form is for); timeout=0 raises
    kpool.PoolExhausted at once like acquire(); a positive timeout raises
    PoolExhausted (a TimeoutError) after that many seconds. Cancelling the
    waiting task takes nothing from the pool. While coroutines wait, one
    helper thread per pool waits in acquire() for them.
    """
    import asyncio

    t = _timeout_arg(timeout)
    try:
        return self.acquire()
    except PoolExhausted:
        if t == 0:
            raise
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    w = _Waiter(loop, fut, None if t is None else time.monotonic() + t)
    with _lock:
        helper = _helpers.get(id(self))
        start = helper is None
        if start:
            helper = _helpers[id(self)] = _Helper(self)
        helper.waiters.append(w)
    if start:
        helper.thread.start()
    timer = None
    if t is not None:
        timer = loop.call_later(t, w.fail, PoolExhausted(
            "BufferPool exhausted: all %s buffers are in use (timed out waiting)" % (self.capacity,)))
    try:
        return await fut
    except BaseException:
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            fut.result().release()         # it arrived as we were cancelled
        raise
    finally:
        with _lock:
            w.active = False
            helper = _helpers.get(id(self))
            if helper is not None and not any(x.active for x in helper.waiters):
                self._interrupt_waits()       # nobody else waits: the helper's acquire ends now
        if timer is not None:
            timer.cancel()


acquire_async.__qualname__ = "BufferPool.acquire_async"
acquire_async.__module__ = "kpool"
