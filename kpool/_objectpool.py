"""kpool.ObjectPool: reuse of expensive Python objects.

Pure Python over no C memory: a LIFO list of idle objects, the objects
handed out tracked by identity, one threading.Condition guarding both.
``factory``, ``reset`` and ``close`` are called without the lock held, so
they may take as long as they like (and may use the pool themselves).

Invariants (under the lock): in_use == objects handed out and not put back;
in_use + creating + resetting <= capacity when bounded (an object being
reset still holds its slot, so no waiter can create a replacement for it);
so the objects alive (handed out, being reset, idle) never exceed capacity;
len(idle) <= max_idle; closed implies idle == [].

Waiting: threads in get() wait on the Condition (notified one per freed
slot or idle object); coroutines in get_async() each register a future in
_async_waiters and are woken one per event through their loop's
call_soon_threadsafe. A woken coroutine that no longer wants the wake (it
was cancelled or timed out meanwhile) passes it on to the next one, so no
wake is lost.
"""

import math
import operator
import threading
import time
import warnings
from collections import deque
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Callable, Dict, Generic, Iterator, Optional, TypeVar

from ._core import PoolExhausted

__all__ = ["ObjectPool"]

T = TypeVar("T")

_TIMEOUT_MAX = 1e9  # seconds, as BufferPool.acquire
_MAY_CREATE = object()   # _take_locked: a creation slot is taken
_AT_CAPACITY = object()  # _take_locked: nothing idle, no room to create


def _count_arg(value, name, minimum, none_ok=True):
    """An int >= minimum (None, where none_ok, is the caller's business);
    TypeError/ValueError."""
    kinds = "an int or None" if none_ok else "an int"
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError("%s must be %s, not %s" % (name, kinds, type(value).__name__)) from None
    if n < minimum:
        raise ValueError("%s must be %s" % (name, "positive" if minimum == 1 else ">= %d" % minimum))
    return n


def _timeout_arg(timeout):
    """None (wait forever) or seconds >= 0 as a float; as BufferPool.acquire:
    a float or an integer (numpy's too), not a bool."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not (isinstance(timeout, float) or hasattr(type(timeout), "__index__")):
        raise TypeError("timeout must be a number of seconds or None, not %s" % type(timeout).__name__)
    t = float(timeout) if isinstance(timeout, float) else float(operator.index(timeout))
    if math.isnan(t):
        raise ValueError("timeout must not be NaN")
    if t < 0:
        raise ValueError("timeout must not be negative (use None to wait forever)")
    if t > _TIMEOUT_MAX:
        raise OverflowError("timeout value is too large (use None to wait forever)")
    return t


def _callable_arg(value, name):
    if value is not None and not callable(value):
        raise TypeError("%s must be callable or None, not %s" % (name, type(value).__name__))
    return value


class ObjectPool(Generic[T]):
    """ObjectPool(factory, *, reset=None, close=None, capacity=None, max_idle=64)

    A pool of reusable Python objects (database connections, parsers,
    buffers, ...), generic in the object type: ``ObjectPool[Conn]``.

    get() returns an idle object (a hit) or a new one from ``factory()`` (a
    miss); put(obj) calls ``reset(obj)`` and keeps the object for reuse, up
    to ``max_idle`` idle objects. discard(obj) takes a broken object out of
    the pool instead. ``close(obj)`` is called for every object the pool
    drops: beyond max_idle, after a failed reset, by discard(), clear() and
    close().

    ``capacity`` bounds the objects in existence at once: handed out, being
    created, reset or closed (None: unbounded). At capacity get() raises
    kpool.PoolExhausted at once by default (timeout=0); ``get(timeout=None)``
    waits for an object, ``get(timeout=s)`` at most s seconds.
    kpool.PoolExhausted is a TimeoutError, so ``except TimeoutError`` works.
    get_async() and borrow_async() wait without blocking an asyncio event
    loop.

    A factory that raises propagates its exception and uses up no capacity.
    A reset that raises drops the object: put() returns normally, the error
    is counted in stats()['reset_errors'] and the first one of each pool is
    reported with warnings.warn (RuntimeWarning). A close callback that
    raises is counted in stats()['close_errors'] and warned about the same
    way.

    The pool is a context manager: ``with ObjectPool(...) as pool:`` closes
    it on exit. After close(), get() raises ValueError; objects still handed
    out are closed when they are put back. Safe to use from many threads and
    from several event loops.
    """

    def __init__(
        self,
        factory: Callable[[], T],
        *,
        reset: Optional[Callable[[T], object]] = None,
        close: Optional[Callable[[T], object]] = None,
        capacity: Optional[int] = None,
        max_idle: int = 64,
    ) -> None:
        if not callable(factory):
            raise TypeError("factory must be callable, not %s" % type(factory).__name__)
        self._factory = factory
        self._reset = _callable_arg(reset, "reset")
        self._close_obj = _callable_arg(close, "close")
        self._capacity = None if capacity is None else _count_arg(capacity, "capacity", 1)
        self._max_idle = _count_arg(max_idle, "max_idle", 0, none_ok=False)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0      # threads waiting in get()
        self._async_waiters = deque()   # (loop, future) of coroutines waiting in get_async()
        self._idle = []        # LIFO of idle objects
        self._out = {}         # id(obj) -> [obj, ticket of its hand-out, or a list of them when several]
        self._tickets = 0      # hand-outs so far: each one's ticket (borrow puts back only its own)
        self._in_use = 0
        self._creating = 0     # factory calls in progress (they hold capacity)
        self._resetting = 0    # reset calls in progress (they hold capacity too)
        self._closing = 0      # close(obj) calls in progress (so do they)
        self._closed = False
        self._created = self._hits = self._misses = self._discarded = 0
        self._high_water = self._gets = self._puts = self._waits = self._timeouts = 0
        self._reset_errors = self._close_errors = 0
        self._warned = set()   # 'reset', 'close': the warnings already given

    # -- properties --------------------------------------------------------
    @property
    def capacity(self) -> Optional[int]:
        """Most objects in existence at once, or None when unbounded."""
        return self._capacity

    @property
    def max_idle(self) -> int:
        """Most idle objects kept for reuse."""
        return self._max_idle

    @property
    def in_use(self) -> int:
        """Objects handed out by get() and not yet put back or discarded."""
        return self._in_use

    @property
    def idle(self) -> int:
        """Objects kept for reuse."""
        return len(self._idle)

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    # -- get ---------------------------------------------------------------
    # The common paths take the plain lock once (a C-level context manager);
    # the Condition on the same lock is used only when someone must wait,
    # and notified only when someone waits.

    def get(self, timeout: Optional[float] = 0.0) -> T:
        """Return an object from the pool (an idle one, else a new one).

        The timeout matters only at capacity. The default, 0, never waits:
        it raises kpool.PoolExhausted at once (unlike queue.Queue.get, which
        blocks by default: a pool that is full usually means a leak or an
        overload, and failing fast shows it). None waits until an object is
        put back or discarded; a positive number waits at most that many
        seconds, then raises PoolExhausted. PoolExhausted is a TimeoutError.
        ValueError once the pool is closed.
        """
        return self._get(timeout)[0]

    def _get(self, timeout):
        """get() and borrow(): the object and the ticket of its hand-out;
        timeout as get() takes it, checked here."""
        if timeout.__class__ is not float or timeout != 0.0:   # the default 0.0 needs no check
            timeout = _timeout_arg(timeout)
        with self._lock:
            obj = self._take_locked("get")
            if obj is _AT_CAPACITY:
                obj = self._wait_locked(timeout)
                if obj is not None:
                    return obj, self._tickets
            elif obj is not _MAY_CREATE:
                return obj, self._tickets
        return self._create()

    def _take_locked(self, call):
        """Under the lock: an idle object, handed out; else _MAY_CREATE with a
        creation slot taken; else _AT_CAPACITY. ValueError once closed."""
        if self._closed:
            raise ValueError(f"{call}() on a closed ObjectPool")
        if self._idle:
            obj = self._idle.pop()
            self._hits += 1
            self._hand_out_locked(obj)
            return obj
        if self._capacity is None or self._room_locked():
            self._creating += 1
            return _MAY_CREATE
        return _AT_CAPACITY

    def _room_locked(self):
        """True if one more object may exist: handed out, being created,
        reset or closed all hold a capacity slot. REQUIRES: the lock held."""
        return self._in_use + self._creating + self._resetting + self._closing < self._capacity

    def _create(self):
        """Call the factory for a creation slot already taken; hand the object
        out. Returns it and its ticket."""
        try:
            obj = self._factory()
        except BaseException:
            with self._lock:
                self._creating -= 1
                self._wake_locked()
            raise
        with self._lock:
            self._creating -= 1
            self._created += 1
            self._misses += 1
            self._hand_out_locked(obj)
            return obj, self._tickets

    def _hand_out_locked(self, obj):
        """Record obj as handed out; its ticket is self._tickets until the
        lock is released. REQUIRES: the lock held."""
        self._tickets += 1
        entry = self._out.get(id(obj))
        if entry is None:
            self._out[id(obj)] = [obj, self._tickets]
        elif entry[1].__class__ is int:
            entry[1] = [entry[1], self._tickets]
        else:
            entry[1].append(self._tickets)
        self._in_use += 1
        self._gets += 1
        if self._in_use > self._high_water:
            self._high_water = self._in_use

    def _exhausted(self, waited):
        return PoolExhausted("ObjectPool exhausted: all %d objects are in use%s"
                             % (self._capacity, " (timed out waiting)" if waited else ""))

    def _wait_locked(self, timeout):
        """At capacity: wait for an idle object (returned, handed out) or for
        room to create one (None returned, a creation slot taken); raise
        PoolExhausted when timeout says so. REQUIRES: the lock held."""
        if timeout == 0:
            raise self._exhausted(False)
        self._waits += 1
        deadline = None if timeout is None else time.monotonic() + timeout
        self._waiting += 1
        try:
            while True:
                if deadline is None:
                    self._cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._timeouts += 1
                        raise self._exhausted(True)
                    self._cond.wait(left)
                if self._closed:
                    raise ValueError("get() on a closed ObjectPool")
                if self._idle:
                    obj = self._idle.pop()
                    self._hits += 1
                    self._hand_out_locked(obj)
                    return obj
                if self._room_locked():
                    self._creating += 1
                    return None
        finally:
            self._waiting -= 1

    # -- waking waiters ----------------------------------------------------
    def _wake_locked(self):
        """A slot was freed or an object went idle: wake one waiting thread
        and one waiting coroutine. REQUIRES: the lock held."""
        if self._waiting:
            self._cond.notify()
        if self._async_waiters:
            self._wake_async_locked()

    def _wake_async_locked(self):
        """Wake the oldest coroutine in get_async(). REQUIRES: the lock held."""
        while self._async_waiters:
            loop, fut = self._async_waiters.popleft()
            try:
                loop.call_soon_threadsafe(self._woken, fut)
                return
            except RuntimeError:      # its loop is closed: nobody waits there
                continue

    def _woken(self, fut):
        """In the waiter's loop: deliver the wake, or pass it on if the waiter
        stopped waiting (cancelled, timed out) before it came."""
        if not fut.done():
            fut.set_result(None)
        else:
            with self._lock:
                self._wake_async_locked()

    def _abandon(self, loop, fut):
        """A coroutine stops waiting without taking anything (in its loop)."""
        if not fut.done():
            fut.cancel()
        with self._lock:
            try:
                self._async_waiters.remove((loop, fut))
                return                # never woken
            except ValueError:
                pass
            # popped by a waker: the wake is in flight (fut is cancelled, so
            # _woken passes it on) or it arrived (fut has a result): pass it on
            if not fut.cancelled():
                self._wake_async_locked()

    # -- put / discard -----------------------------------------------------
    def _take_back_locked(self, obj, missing_ok=False, ticket=None):
        """Remove obj from the handed-out objects: the hand-out of that ticket,
        else its latest. False (only with missing_ok) if it is not handed out
        (under that ticket). REQUIRES: the lock held."""
        entry = self._out.get(id(obj))
        held = entry is not None and entry[0] is obj
        if held and entry[1].__class__ is int:        # handed out once: the usual case
            held = ticket is None or ticket == entry[1]
            if held:
                del self._out[id(obj)]
        elif held:                                    # handed out several times at once
            tickets = entry[1]
            held = ticket is None or ticket in tickets
            if held:
                tickets.remove(tickets[-1] if ticket is None else ticket)
                if len(tickets) == 1:
                    entry[1] = tickets[0]
        if not held:
            if missing_ok:
                return False
            raise ValueError("object did not come from this ObjectPool (or was already put back or discarded)")
        self._in_use -= 1
        return True

    def put(self, obj: T) -> None:
        """Give obj back: reset(obj) is called and the object kept for reuse
        (or dropped, and passed to close, beyond max_idle or after close()).

        An object that was not handed out by this pool (or was put back or
        discarded already) raises ValueError. The object's capacity slot
        stays taken until reset returns.
        """
        self._put(obj, False)

    def _put(self, obj, missing_ok, ticket=None):
        reset = self._reset
        with self._lock:
            if not self._take_back_locked(obj, missing_ok, ticket):
                return
            self._puts += 1
            if reset is None or self._closed:
                keep = not self._closed and len(self._idle) < self._max_idle
                if keep:
                    self._idle.append(obj)
                else:
                    self._drop_locked(1)
                self._wake_locked()
            else:
                self._resetting += 1         # the slot stays taken until reset is done
                keep = None
        if keep is None:
            keep = self._reset_and_keep(obj, reset)
        if not keep:
            self._destroy(obj)

    def _reset_and_keep(self, obj, reset):
        """Reset obj (its slot counted in resetting) and keep it idle if it can
        be; True if kept. The lock is not held while reset runs."""
        try:
            reset(obj)
            error = None
        except Exception as e:
            error = e
        except BaseException:               # KeyboardInterrupt, SystemExit: drop it, then propagate
            with self._lock:
                self._resetting -= 1
                self._drop_locked(1)
                self._reset_errors += 1
                self._wake_locked()
            self._destroy(obj)
            raise
        with self._lock:
            self._resetting -= 1
            keep = error is None and not self._closed and len(self._idle) < self._max_idle
            if keep:
                self._idle.append(obj)
            else:
                self._drop_locked(1)
                if error is not None:
                    self._reset_errors += 1
            self._wake_locked()
        if error is not None:
            self._warn_once("reset", "ObjectPool: reset(%r) raised %r; the object was dropped (reset errors "
                            "are counted in stats()['reset_errors']; this pool warns only once)" % (obj, error), 5)
        return keep

    def discard(self, obj: T) -> None:
        """Take obj out of the pool for good (a broken connection, say): it
        is not reset or reused, ``close(obj)`` is called, it counts in
        stats()['discarded'] and its capacity slot is freed once close
        returns (at once without a close callback).

        ValueError for an object that is not handed out by this pool. Inside
        ``with pool.borrow() as obj:`` discarding obj is fine: borrow then
        does not put it back.
        """
        with self._lock:
            self._take_back_locked(obj)
            self._drop_locked(1)
            self._wake_locked()
        self._destroy(obj)

    def _drop_locked(self, n):
        """n objects leave the pool; with a close callback each keeps a
        capacity slot until its close(obj) returns (_destroy), so objects
        being closed count as existing. REQUIRES: the lock held."""
        self._discarded += n
        if self._close_obj is not None:
            self._closing += n

    def _destroy(self, obj):
        """Call close(obj) for an object dropped by _drop_locked (lock not
        held), then free its capacity slot."""
        close = self._close_obj
        if close is None:
            return
        error = None
        try:
            close(obj)
        except Exception as e:
            error = e
        finally:
            with self._lock:
                self._closing -= 1
                if error is not None:
                    self._close_errors += 1
                self._wake_locked()
        if error is not None:
            self._warn_once("close", "ObjectPool: close(%r) raised %r (close errors are counted in "
                            "stats()['close_errors']; this pool warns only once)" % (obj, error), 4)

    def _warn_once(self, kind, message, stacklevel):
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)

    # -- context managers --------------------------------------------------
    @contextmanager
    def borrow(self, timeout: Optional[float] = 0.0) -> Iterator[T]:
        """Context manager: get(timeout) an object and put() it back on exit
        (unless it was put back or discarded inside the block: then the exit
        leaves it alone, also when another user has got it since)."""
        obj, ticket = self._get(timeout)
        try:
            yield obj
        finally:
            self._put(obj, True, ticket)

    # -- asyncio -----------------------------------------------------------
    async def get_async(self, timeout: Optional[float] = None) -> T:
        """Coroutine: get() that waits without blocking the event loop.

        The default timeout is None: wait until an object is free, as
        asyncio.Queue.get does (this is what the async form is for; pass
        timeout=0 to fail at once). A positive timeout raises
        kpool.PoolExhausted (a TimeoutError) after that many seconds.
        Cancelling the waiting task takes nothing from the pool. The factory
        runs in the event loop's thread when a new object is needed.
        """
        return (await self._get_async(timeout))[0]

    async def _get_async(self, timeout):
        """get_async(): the object and the ticket of its hand-out."""
        import asyncio

        t = _timeout_arg(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if t is None else loop.time() + t
        waited = False
        while True:
            with self._lock:
                obj = self._take_locked("get_async")
                if obj is _MAY_CREATE:
                    fut = None
                elif obj is not _AT_CAPACITY:
                    return obj, self._tickets
                else:
                    if deadline is not None and loop.time() >= deadline:
                        if waited:
                            self._timeouts += 1
                        raise self._exhausted(waited)
                    if not waited:
                        self._waits += 1
                        waited = True
                    fut = loop.create_future()
                    self._async_waiters.append((loop, fut))
            if fut is None:
                return self._create()
            try:
                if deadline is None:
                    await fut
                else:
                    await asyncio.wait((fut,), timeout=max(0.0, deadline - loop.time()))
            except BaseException:
                self._abandon(loop, fut)
                raise
            if not fut.done():                 # timed out: one last try above
                self._abandon(loop, fut)

    @asynccontextmanager
    async def borrow_async(self, timeout: Optional[float] = None) -> AsyncIterator[T]:
        """Async context manager: ``async with pool.borrow_async() as obj:``
        awaits get_async(timeout) and puts the object back on exit (unless
        it was put back or discarded inside the block: then the exit leaves
        it alone, also when another user has got it since)."""
        obj, ticket = await self._get_async(timeout)
        try:
            yield obj
        finally:
            self._put(obj, True, ticket)

    # -- dropping ----------------------------------------------------------
    def clear(self) -> int:
        """Drop every idle object (each is passed to close and counts as
        discarded); returns how many."""
        with self._lock:
            objs, self._idle = self._idle, []
            self._drop_locked(len(objs))
        for obj in objs:
            self._destroy(obj)
        return len(objs)

    def close(self) -> None:
        """Close the pool: drop the idle objects (each passed to close), make
        get() raise ValueError from now on (waiting threads and coroutines
        too), and drop each object still handed out when it is put back.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            objs, self._idle = self._idle, []
            self._drop_locked(len(objs))
            self._cond.notify_all()
            for _ in range(len(self._async_waiters)):
                self._wake_async_locked()
        for obj in objs:
            self._destroy(obj)

    def __enter__(self) -> "ObjectPool[T]":
        """ValueError on a closed pool, as BufferPool's."""
        with self._lock:
            if self._closed:
                raise ValueError("with on a closed ObjectPool")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def stats(self) -> Dict[str, Any]:
        """A dict: created, hits, misses, discarded (objects dropped: beyond
        max_idle, failed reset, discard(), clear(), close()), high_water,
        in_use, idle, resetting, closing (close calls in progress), capacity,
        max_idle, gets, puts, waits, timeouts, reset_errors, close_errors,
        closed."""
        with self._lock:
            return {
                "created": self._created,
                "hits": self._hits,
                "misses": self._misses,
                "discarded": self._discarded,
                "high_water": self._high_water,
                "in_use": self._in_use,
                "idle": len(self._idle),
                "resetting": self._resetting,
                "closing": self._closing,
                "capacity": self._capacity,
                "max_idle": self._max_idle,
                "gets": self._gets,
                "puts": self._puts,
                "waits": self._waits,
                "timeouts": self._timeouts,
                "reset_errors": self._reset_errors,
                "close_errors": self._close_errors,
                "closed": self._closed,
            }

    def __repr__(self) -> str:
        return "<kpool.ObjectPool factory=%r, in_use=%d, idle=%d, capacity=%s%s>" % (
            self._factory, self._in_use, len(self._idle), self._capacity, ", closed" if self._closed else "")


ObjectPool.__module__ = "kpool"
