"""A Hypothesis stateful test of the Python API (issue 17): heap Blocks
(kpool.malloc, indexing, slices, memoryview reads and writes, resize,
release, dropping), BufferPools (acquire with timeouts, release, stats,
trim, close), Arenas (alloc with alignments, reset) and ObjectPools (get,
put, borrow, discard, clear, close, capacity, reset and close callbacks),
driven in any order against a model, with memoryviews held across
releases, resizes and resets.

What the API promises, and this checks after every step:
  - the bytes the model wrote into a live Block read back intact (through
    bytes(), indexing, slices and the views);
  - a Block with a view alive refuses release() and resize(), an Arena with
    a view of one of its Blocks alive refuses reset(), and a BufferPool with
    buffers in use refuses close() (all BufferError), changing nothing; the
    view keeps the memory valid; a Block dropped while a view holds it is
    given back when the last view goes;
  - a released Block (or one of a reset Arena) raises ValueError on every
    use; release() again is a no-op;
  - capacities hold: acquire() and get() at capacity raise PoolExhausted
    (a TimeoutError) at once with timeout 0, after waiting with a positive
    timeout; objects alive never exceed an ObjectPool's capacity;
  - counters match the model exactly: BufferPool acquires, releases,
    in_use, idle, high_water, waits, timeouts, hits + misses == acquires
    (misses exact until a trim), kp_pool's live count; Arena used and
    generation; every ObjectPool.stats() field; kpool.stats() bytes_in_use
    moves by exactly the usable sizes of the live heap Blocks.

The machine is the same for the short run here (CI: max_examples 30, 30
steps each, a few seconds) and the long run in
tests/stress/test_stateful_long.py (marked slow).
"""
import gc
import time
import warnings
import weakref

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402

from conftest import kpool  # noqa: E402

PATTERN = bytes(range(251)) * 2  # 251: a prime, so rotations differ at every size


def pattern(seed, n):
    """n bytes of a rotation of 0..250, different for each seed."""
    out = bytearray()
    start = seed % 251
    while len(out) < n:
        take = min(n - len(out), 251)
        out += PATTERN[start:start + take]
    return bytes(out)


# sizes: empty, tiny, every small class range, the large-block boundary (256 KiB)
SIZES = st.one_of(st.integers(0, 64), st.integers(65, 4096), st.integers(4097, 70000),
                  st.sampled_from([256 << 10, (256 << 10) + 1, 300000]))
POOL_SIZES = st.one_of(st.integers(1, 256), st.sampled_from([1000, 4096, 65536, 100000]))
INDEX = st.integers(0, 1 << 30)          # picks an item of a list: i % len(list)
ALIGNS = st.sampled_from([1, 2, 8, 16, 64, 4096, 65536])
TIMEOUTS = st.sampled_from([0, 0.0, 0.001, None])


class Rec:
    """A Block the model knows: its kind, owner, expected bytes, the views."""

    def __init__(self, block, kind, owner, data):
        self.block = block            # None once dropped while a view holds it
        self.kind = kind
        self.owner = owner            # the PoolRec or ArenaRec, or None
        self.data = bytearray(data)
        self.views = []               # View objects
        self.gen = owner.gen if kind == "arena" else None
        self.weak = weakref.ref(block)


class View:
    """A memoryview of (part of) a Block: at offset off, n bytes."""

    def __init__(self, mv, off, n):
        self.mv, self.off, self.n, self.open = mv, off, n, True

    def release(self):
        self.mv.release()
        self.open = False


class PoolRec:
    def __init__(self, pool, size, capacity, prealloc, zero, align):
        self.pool, self.size, self.capacity, self.prealloc = pool, size, capacity, prealloc
        self.zero, self.align = zero, align
        self.acquires = self.releases = self.waits = self.timeouts = self.refused = 0
        self.in_use = self.high_water = 0
        self.idle = prealloc
        self.trimmed = self.closed = False
        self.block_size = None


class ArenaRec:
    def __init__(self, arena, chunk):
        self.arena, self.chunk = arena, chunk
        self.gen = 0
        self.used = 0


class Res:
    """An ObjectPool's object: counts the callbacks it got."""
    made = 0

    def __init__(self):
        Res.made += 1
        self.n = Res.made
        self.resets = self.closes = 0
        self.bad_reset = self.bad_close = False


class ObjRec:
    def __init__(self, capacity, max_idle, with_reset, with_close):
        self.capacity, self.max_idle = capacity, max_idle
        self.with_reset, self.with_close = with_reset, with_close
        self.pool = kpool.ObjectPool(Res, capacity=capacity, max_idle=max_idle,
                                     reset=self._reset if with_reset else None,
                                     close=self._close if with_close else None)
        self.idle = []                # LIFO, as the pool keeps them
        self.out = []
        self.dropped = []             # objects the pool let go (closed, when it has close)
        self.c = dict(created=0, hits=0, misses=0, discarded=0, high_water=0, gets=0, puts=0, waits=0,
                      timeouts=0, reset_errors=0, close_errors=0)
        self.warned = set()
        self.closed = False

    @staticmethod
    def _reset(obj):
        obj.resets += 1
        if obj.bad_reset:
            raise RuntimeError("reset of object %d fails" % obj.n)

    @staticmethod
    def _close(obj):
        obj.closes += 1
        if obj.bad_close:
            raise OSError("close of object %d fails" % obj.n)


def pick(items, i):
    return items[i % len(items)]


class KpoolMachine(RuleBasedStateMachine):
    """Model and rules; see the module docstring."""

    def __init__(self):
        super().__init__()
        self.recs = []                # live Blocks of every kind (and dropped ones a view holds)
        self.dead = []                # released Blocks: every use must raise ValueError
        self.pools = []
        self.arenas = []
        self.objpools = []
        self.seed = 0

    @initialize(size=SIZES, pool_size=POOL_SIZES, capacity=st.none() | st.integers(1, 4),
                chunk=st.sampled_from([1, 4096, 65536, 1 << 20]), obj_capacity=st.none() | st.integers(1, 3))
    def baseline(self, size, pool_size, capacity, chunk, obj_capacity):
        """One of each from the start, so that most rules can run at once."""
        gc.collect()                  # earlier tests' garbage goes now, not in the middle
        self.base_in_use = kpool.stats()["bytes_in_use"]
        self.malloc(size, False)
        self.new_pool(pool_size, capacity, 0, False, 64)
        self.new_arena(chunk)
        self.new_objpool(obj_capacity, 2, True, True)

    # ---- helpers ---------------------------------------------------------------------
    def next_seed(self):
        self.seed += 1
        return self.seed

    def live(self, kind=None):
        return [r for r in self.recs if r.block is not None and (kind is None or r.kind == kind)]

    def add_block(self, b, kind, owner, zeroed):
        """A new Block: check its shape, then fill it with a pattern."""
        size = len(b)
        assert b.kind == kind and not b.released and b.size == size
        if zeroed:
            assert bytes(b) == bytes(size)
        data = pattern(self.next_seed(), size)
        if size:
            memoryview(b)[:] = data
        self.recs.append(Rec(b, kind, owner, data))

    def views_of(self, rec):
        return [v for v in rec.views if v.open]

    def exported(self, rec):
        rec.views = self.views_of(rec)
        return bool(rec.views)

    def gone(self, rec):
        """rec's Block was released (by the program, or by the pool it came back to)."""
        self.recs.remove(rec)
        if rec.block is not None:
            self.dead.append(rec.block)
            del self.dead[:-12]           # the last dozen are enough
        rec.block = None

    def account_release(self, rec):
        if rec.kind == "pool":
            p = rec.owner
            p.releases += 1
            p.in_use -= 1
            p.idle += 1

    # ---- heap Blocks -------------------------------------------------------------------
    @precondition(lambda self: len(self.recs) < 40)
    @rule(size=SIZES, zero=st.booleans())
    def malloc(self, size, zero):
        b = kpool.malloc(size, zero=zero)
        assert b.usable_size >= size and b.address % 16 == 0
        self.add_block(b, "heap", None, zero)

    @precondition(lambda self: self.live("heap"))
    @rule(i=INDEX, size=SIZES)
    def resize(self, i, size):
        rec = pick(self.live("heap"), i)
        if self.exported(rec):
            with pytest.raises(BufferError):
                rec.block.resize(size)
            return
        rec.block.resize(size)
        keep = min(size, len(rec.data))
        assert len(rec.block) == size and rec.block.usable_size >= size
        assert bytes(rec.block[:keep]) == bytes(rec.data[:keep])      # the prefix survives
        tail = pattern(self.next_seed(), size - keep)
        if tail:
            memoryview(rec.block)[keep:] = tail
        rec.data = bytearray(rec.data[:keep] + tail)

    @precondition(lambda self: self.live("pool") + self.live("arena"))
    @rule(i=INDEX)
    def resize_fixed_size_block(self, i):
        rec = pick(self.live("pool") + self.live("arena"), i)
        with pytest.raises(TypeError):
            rec.block.resize(1)

    # ---- any live Block: reads and writes ------------------------------------------------
    @precondition(lambda self: [r for r in self.live() if r.data])
    @rule(i=INDEX, at=INDEX, value=st.integers(0, 255), negative=st.booleans())
    def write_item(self, i, at, value, negative):
        rec = pick([r for r in self.live() if r.data], i)
        k = at % len(rec.data)
        rec.block[k - len(rec.data) if negative else k] = value
        rec.data[k] = value
        assert rec.block[k] == value

    @precondition(lambda self: self.live())
    @rule(i=INDEX, start=st.integers(-70000, 70000), stop=st.integers(-70000, 70000) | st.none(),
          step=st.sampled_from([1, 1, 2, 3, -1, -2]), wrong_length=st.booleans())
    def write_slice(self, i, start, stop, step, wrong_length):
        rec = pick(self.live(), i)
        sl = slice(start, stop, step)
        n = len(range(*sl.indices(len(rec.data))))
        value = pattern(self.next_seed(), n + (1 if wrong_length else 0))
        if wrong_length:
            with pytest.raises(ValueError):
                rec.block[sl] = value
        else:
            rec.block[sl] = value
            rec.data[sl] = value
        assert rec.block[sl] == bytes(rec.data[sl])

    @precondition(lambda self: self.live())
    @rule(i=INDEX, start=st.integers(-1000, 1000), stop=st.integers(-1000, 1000) | st.none(),
          step=st.sampled_from([1, 2, -1, 7]))
    def read_slice(self, i, start, stop, step):
        rec = pick(self.live(), i)
        sl = slice(start, stop, step)
        assert rec.block[sl] == bytes(rec.data[sl])
        assert len(rec.block) == len(rec.data)

    # ---- views ---------------------------------------------------------------------------
    @precondition(lambda self: self.live())
    @rule(i=INDEX, start=st.integers(0, 1 << 20), length=st.integers(0, 1 << 20), of_view=st.booleans())
    def open_view(self, i, start, length, of_view):
        """A memoryview of a Block, or a slice of one of its views (which shares
        the export: the Block stays exported while any of them is alive)."""
        rec = pick(self.live(), i)
        views = self.views_of(rec)
        if of_view and views:
            parent = views[start % len(views)]
            base, off, n = parent.mv, parent.off, parent.n
        else:
            base, off, n = memoryview(rec.block), 0, len(rec.data)
        s = start % (n + 1)
        e = s + length % (n - s + 1)
        v = View(base[s:e], off + s, e - s)
        if not (of_view and views):
            base.release()              # only the slice stays (it keeps the export)
        rec.views.append(v)
        assert bytes(v.mv) == bytes(rec.data[v.off:v.off + v.n])

    @precondition(lambda self: any(self.views_of(r) for r in self.recs))
    @rule(i=INDEX, seed=st.integers(0, 250), at=INDEX)
    def write_through_view(self, i, seed, at):
        rec = pick([r for r in self.recs if self.views_of(r)], i)
        v = pick(self.views_of(rec), at)
        if v.n == 0:
            return
        k = at % v.n
        data = pattern(seed, v.n - k)
        v.mv[k:] = data
        rec.data[v.off + k:v.off + v.n] = data

    @precondition(lambda self: any(self.views_of(r) for r in self.recs))
    @rule(i=INDEX, at=INDEX)
    def close_view(self, i, at):
        rec = pick([r for r in self.recs if self.views_of(r)], i)
        v = pick(self.views_of(rec), at)
        assert bytes(v.mv) == bytes(rec.data[v.off:v.off + v.n])   # still valid while held
        v.release()
        if rec.block is None and not self.exported(rec):
            # dropped while the views held it: it goes with the last one
            assert rec.weak() is None, "a dropped Block outlived its last view"
            self.account_release(rec)
            self.recs.remove(rec)

    # ---- giving Blocks back ----------------------------------------------------------------
    @precondition(lambda self: self.live())
    @rule(i=INDEX, how=st.sampled_from(["release", "exit", "pool.release"]))
    def release(self, i, how):
        rec = pick(self.live(), i)
        b = rec.block
        if how == "pool.release" and rec.kind != "pool":
            with pytest.raises(ValueError):       # not a BufferPool's Block
                (self.pools[0].pool if self.pools else kpool.BufferPool(16)).release(b)
            how = "release"
        if self.exported(rec):
            with pytest.raises(BufferError):
                b.release() if how != "exit" else b.__exit__(None, None, None)
            assert not b.released
            return
        if how == "release":
            b.release()
        elif how == "exit":
            assert b.__exit__(None, None, None) is False
        else:
            rec.owner.pool.release(b)
        assert b.released
        b.release()                                # idempotent
        self.account_release(rec)
        self.gone(rec)

    @precondition(lambda self: len(self.pools) >= 2 and self.live("pool"))
    @rule(i=INDEX)
    def release_to_another_pool(self, i):
        rec = pick(self.live("pool"), i)
        other = next(p for p in self.pools if p is not rec.owner)
        with pytest.raises(ValueError):
            other.pool.release(rec.block)
        with pytest.raises(TypeError):
            other.pool.release(bytearray(4))

    @precondition(lambda self: self.live())
    @rule(i=INDEX)
    def drop(self, i):
        """Drop the only reference: a Block without views is released at once
        (refcounting); one with views lives on in them."""
        rec = pick(self.live(), i)
        if self.exported(rec):
            rec.block = None
            return
        rec.block = None
        assert rec.weak() is None
        self.account_release(rec)
        self.recs.remove(rec)

    @precondition(lambda self: self.dead)
    @rule(i=INDEX, op=st.sampled_from(["index", "slice", "setitem", "len", "bytes", "view", "size", "address",
                                       "resize", "enter", "iter"]))
    def use_released(self, i, op):
        b = pick(self.dead, i)
        assert b.released
        ops = {
            "index": lambda: b[0], "slice": lambda: b[0:1], "setitem": lambda: b.__setitem__(0, 1),
            "len": lambda: len(b), "bytes": lambda: bytes(b), "view": lambda: memoryview(b),
            "size": lambda: b.size, "address": lambda: b.address, "enter": lambda: b.__enter__(),
            "iter": lambda: list(b),
        }
        if op == "resize":
            with pytest.raises(ValueError):     # released first, whatever the kind
                b.resize(4)
        else:
            with pytest.raises(ValueError):
                ops[op]()
        b.release()

    # ---- BufferPool --------------------------------------------------------------------------
    @precondition(lambda self: len(self.pools) < 4)
    @rule(size=POOL_SIZES, capacity=st.none() | st.integers(1, 4), prealloc=st.integers(0, 4),
          zero=st.booleans(), align=st.sampled_from([16, 64, 4096]))
    def new_pool(self, size, capacity, prealloc, zero, align):
        if capacity is not None:
            prealloc = min(prealloc, capacity)
        pool = kpool.BufferPool(size, capacity=capacity, prealloc=prealloc, zero=zero, align=align)
        assert (pool.buffer_size, pool.capacity, pool.idle, pool.in_use, pool.zero, pool.align) == (
            size, capacity, prealloc, 0, zero, align)
        self.pools.append(PoolRec(pool, size, capacity, prealloc, zero, align))

    def open_pools(self):
        return [p for p in self.pools if not p.closed]

    @precondition(lambda self: any(not p.closed for p in self.pools) and len(self.recs) < 40)
    @rule(i=INDEX, timeout=TIMEOUTS)
    def acquire(self, i, timeout):
        p = pick(self.open_pools(), i)
        full = p.capacity is not None and p.in_use == p.capacity
        if full:
            if timeout is None:
                return                     # would wait for a release no one makes
            t0 = time.monotonic()
            with pytest.raises(kpool.PoolExhausted) as e:
                p.pool.acquire(timeout=timeout)
            assert isinstance(e.value, TimeoutError)
            p.refused += 1
            if timeout:
                assert time.monotonic() - t0 >= timeout * 0.9
                p.waits += 1
                p.timeouts += 1
            return
        b = p.pool.acquire() if timeout == 0 and i % 2 else p.pool.acquire(timeout=timeout)
        assert b.usable_size >= p.size and b.address % p.align == 0
        if p.block_size is None:
            p.block_size = b.usable_size
        assert b.usable_size == p.block_size
        p.acquires += 1
        p.in_use += 1
        p.idle = max(0, p.idle - 1)
        p.high_water = max(p.high_water, p.in_use)
        self.add_block(b, "pool", p, p.zero)

    @precondition(lambda self: any(not p.closed for p in self.pools))
    @rule(i=INDEX, seed=st.integers(0, 250))
    def acquire_with(self, i, seed):
        """`with pool.acquire() as b:` writes, reads back, releases on exit."""
        p = pick(self.open_pools(), i)
        if p.capacity is not None and p.in_use == p.capacity:
            return
        with p.pool.acquire() as b:
            data = pattern(seed, len(b))
            b[:] = data
            assert bytes(b) == data and p.pool.in_use == p.in_use + 1
        assert b.released
        p.acquires += 1
        p.releases += 1
        p.idle = max(0, p.idle - 1) + 1
        p.high_water = max(p.high_water, p.in_use + 1)
        self.dead.append(b)

    @precondition(lambda self: any(not p.closed for p in self.pools))
    @rule(i=INDEX)
    def trim_pool(self, i):
        p = pick(self.open_pools(), i)
        released = p.pool.trim()
        assert released >= 0 and released % 4096 == 0
        p.trimmed = True          # blocks never handed out may now come back as hits
        if released:     # which chunks went is the pool's business; idle is bounded by what stays
            p.idle = min(p.idle, p.pool.stats()["free_blocks"])

    @precondition(lambda self: any(not p.closed for p in self.pools))
    @rule(i=INDEX)
    def close_pool(self, i):
        p = pick(self.open_pools(), i)
        if p.in_use:
            with pytest.raises(BufferError):
                p.pool.close()
            assert not p.pool.closed
            return
        p.pool.close()
        p.pool.close()                                  # idempotent
        p.closed = True
        p.idle = 0
        with pytest.raises(ValueError):
            p.pool.acquire()
        with pytest.raises(ValueError):
            p.pool.trim()

    # ---- Arena -----------------------------------------------------------------------------------
    @precondition(lambda self: len(self.arenas) < 3)
    @rule(chunk=st.sampled_from([1, 4096, 65536, 1 << 20]))
    def new_arena(self, chunk):
        a = kpool.Arena(chunk)
        assert a.chunk_size == chunk and a.used == 0 and a.generation == 0
        self.arenas.append(ArenaRec(a, chunk))

    @precondition(lambda self: self.arenas and len(self.recs) < 40)
    @rule(i=INDEX, size=SIZES, align=ALIGNS)
    def arena_alloc(self, i, size, align):
        a = pick(self.arenas, i)
        b = a.arena.alloc(size, align) if align != 16 or i % 2 else a.arena.alloc(size)
        assert b.address % align == 0 and b.usable_size == size
        a.used += max(size, 1)
        self.add_block(b, "arena", a, False)

    @precondition(lambda self: self.arenas)
    @rule(i=INDEX, with_statement=st.booleans())
    def arena_reset(self, i, with_statement):
        a = pick(self.arenas, i)
        mine = [r for r in self.recs if r.kind == "arena" and r.owner is a]
        if any(self.exported(r) for r in mine):
            with pytest.raises(BufferError):
                a.arena.reset()
            assert a.arena.generation == a.gen and all(not r.block.released for r in mine if r.block is not None)
            return
        if with_statement:
            with a.arena as same:
                assert same is a.arena
        else:
            a.arena.reset()
        a.gen += 1
        a.used = 0
        for r in mine:
            if r.block is not None:
                assert r.block.released
            self.gone(r)

    # ---- ObjectPool ---------------------------------------------------------------------------------
    @precondition(lambda self: len(self.objpools) < 3)
    @rule(capacity=st.none() | st.integers(1, 3), max_idle=st.integers(0, 3), with_reset=st.booleans(),
          with_close=st.booleans())
    def new_objpool(self, capacity, max_idle, with_reset, with_close):
        o = ObjRec(capacity, max_idle, with_reset, with_close)
        assert (o.pool.capacity, o.pool.max_idle, o.pool.in_use, o.pool.idle) == (capacity, max_idle, 0, 0)
        self.objpools.append(o)

    def model_get(self, o, timeout):
        """What get(timeout) must do: ('hit', obj), ('create', None) or ('exhausted'|'closed', None)."""
        if o.closed:
            return "closed", None
        if o.idle:
            return "hit", o.idle[-1]
        if o.capacity is None or len(o.out) < o.capacity:
            return "create", None
        return "exhausted", None

    def check_got(self, o, kind, expect, obj):
        if kind == "hit":
            assert obj is expect
            o.idle.pop()
            o.c["hits"] += 1
        else:
            assert isinstance(obj, Res) and obj not in o.out and obj not in o.idle and obj.resets == 0
            o.c["created"] += 1
            o.c["misses"] += 1
        o.out.append(obj)
        o.c["gets"] += 1
        o.c["high_water"] = max(o.c["high_water"], len(o.out))

    def refused(self, o, kind, call, timeout):
        if kind == "closed":
            with pytest.raises(ValueError):
                call()
            return
        with pytest.raises(kpool.PoolExhausted):
            call()
        if timeout:
            o.c["waits"] += 1
            o.c["timeouts"] += 1

    @precondition(lambda self: self.objpools)
    @rule(i=INDEX, timeout=st.sampled_from([0, 0.001]))
    def get(self, i, timeout):
        o = pick(self.objpools, i)
        kind, expect = self.model_get(o, timeout)
        if kind in ("closed", "exhausted"):
            return self.refused(o, kind, lambda: o.pool.get(timeout), timeout)
        self.check_got(o, kind, expect, o.pool.get(timeout))

    def model_drop(self, o, obj, reset_error=False):
        """The pool lets obj go: counted, passed to close. The warnings due."""
        expect = []
        o.c["discarded"] += 1
        if reset_error:
            o.c["reset_errors"] += 1
            if "reset" not in o.warned:
                o.warned.add("reset")
                expect.append("reset")
        if o.with_close:
            o.dropped.append(obj)
            if obj.bad_close:
                o.c["close_errors"] += 1
                if "close" not in o.warned:
                    o.warned.add("close")
                    expect.append("close")
        return expect

    def model_put(self, o, obj):
        """put(obj) of an object handed out. The warnings due."""
        o.out.remove(obj)
        o.c["puts"] += 1
        if o.closed:
            return self.model_drop(o, obj)
        if o.with_reset and obj.bad_reset:
            return self.model_drop(o, obj, reset_error=True)
        if len(o.idle) < o.max_idle:
            o.idle.append(obj)
            return []
        return self.model_drop(o, obj)

    @staticmethod
    def expect_warnings(expect, call):
        """call(); exactly the RuntimeWarnings expect names ('reset', 'close')
        must be given (each pool warns once per kind)."""
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            result = call()
        kinds = sorted("reset" if "reset(" in str(w.message) else "close" for w in got
                       if issubclass(w.category, RuntimeWarning))
        assert kinds == sorted(expect), (kinds, expect)
        return result

    def put_checked(self, o, obj):
        resets = obj.resets
        self.expect_warnings(self.model_put(o, obj), lambda: o.pool.put(obj))
        assert obj.resets == resets + (1 if o.with_reset and not o.closed else 0)

    @precondition(lambda self: any(o.out for o in self.objpools))
    @rule(i=INDEX, j=INDEX, bad_reset=st.booleans(), bad_close=st.booleans())
    def put(self, i, j, bad_reset, bad_close):
        o = pick([o for o in self.objpools if o.out], i)
        obj = pick(o.out, j)
        obj.bad_reset, obj.bad_close = bad_reset, bad_close
        self.put_checked(o, obj)
        with pytest.raises(ValueError):                 # not handed out any more
            o.pool.put(obj)

    @precondition(lambda self: any(o.out for o in self.objpools))
    @rule(i=INDEX, j=INDEX, bad_close=st.booleans())
    def discard(self, i, j, bad_close):
        o = pick([o for o in self.objpools if o.out], i)
        obj = pick(o.out, j)
        obj.bad_close = bad_close
        o.out.remove(obj)
        self.expect_warnings(self.model_drop(o, obj), lambda: o.pool.discard(obj))
        assert obj.resets == 0 or o.with_reset
        with pytest.raises(ValueError):
            o.pool.discard(obj)

    @precondition(lambda self: self.objpools)
    @rule(i=INDEX, then=st.sampled_from(["put", "discard", "exit"]), bad_reset=st.booleans())
    def borrow(self, i, then, bad_reset):
        """with pool.borrow() as obj: put back at the exit, unless put back or
        discarded inside."""
        o = pick(self.objpools, i)
        kind, expect = self.model_get(o, 0)
        if kind in ("closed", "exhausted"):
            def enter():
                with o.pool.borrow():
                    raise AssertionError("borrow() went in at capacity (or closed)")
            return self.refused(o, kind, enter, 0)
        due = []

        def body():
            with o.pool.borrow() as obj:
                self.check_got(o, kind, expect, obj)
                obj.bad_reset = bad_reset
                if then == "put":
                    self.put_checked(o, obj)
                elif then == "discard":
                    o.out.remove(obj)
                    self.expect_warnings(self.model_drop(o, obj), lambda: o.pool.discard(obj))
                else:
                    due.extend(self.model_put(o, obj))   # what the exit will do
        self.expect_warnings(due if then == "exit" else [], body)

    @precondition(lambda self: self.objpools)
    @rule(i=INDEX)
    def clear(self, i):
        o = pick(self.objpools, i)
        idle, o.idle = o.idle, []
        due = [w for obj in idle for w in self.model_drop(o, obj)]
        assert self.expect_warnings(due, o.pool.clear) == len(idle)

    @precondition(lambda self: any(not o.closed for o in self.objpools))
    @rule(i=INDEX)
    def close_objpool(self, i):
        o = pick([o for o in self.objpools if not o.closed], i)
        idle, o.idle = o.idle, []
        due = [w for obj in idle for w in self.model_drop(o, obj)]
        o.closed = True
        self.expect_warnings(due, o.pool.close)
        o.pool.close()
        assert o.pool.closed

    # ---- invariants ------------------------------------------------------------------------------------
    @invariant()
    def blocks_hold_what_was_written(self):
        for rec in self.recs:
            b = rec.block
            if b is None:                 # held by views only: read through them
                for v in self.views_of(rec):
                    assert bytes(v.mv) == bytes(rec.data[v.off:v.off + v.n])
                continue
            assert not b.released
            assert len(b) == len(rec.data)
            assert bytes(b) == bytes(rec.data)
            for v in self.views_of(rec):
                assert bytes(v.mv) == bytes(rec.data[v.off:v.off + v.n])
        for b in self.dead:
            assert b.released

    @invariant()
    def heap_bytes_in_use_match(self):
        if not hasattr(self, "base_in_use"):
            return
        expect = 0
        for rec in self.recs:
            if rec.kind != "heap":
                continue
            b = rec.block if rec.block is not None else rec.weak()
            expect += b.usable_size
        assert kpool.stats()["bytes_in_use"] - self.base_in_use == expect

    @invariant()
    def buffer_pools_match(self):
        for p in self.pools:
            s = p.pool.stats()
            assert (p.pool.in_use, p.pool.idle, p.pool.closed) == (p.in_use, p.idle, p.closed)
            assert (s["acquires"], s["releases"], s["in_use"], s["high_water"]) == (
                p.acquires, p.releases, p.in_use, p.high_water)
            assert (s["waits"], s["timeouts"]) == (p.waits, p.timeouts)
            assert s["hits"] + s["misses"] == s["acquires"]
            assert s["exhausted"] >= p.refused
            if not p.trimmed:
                assert s["misses"] == max(0, p.high_water - p.prealloc), s
            if not p.closed:
                assert s["pool_allocs"] - s["pool_frees"] == p.in_use
            if p.capacity is not None:
                assert p.in_use <= p.capacity

    @invariant()
    def arenas_match(self):
        for a in self.arenas:
            assert (a.arena.used, a.arena.generation) == (a.used, a.gen)
            assert a.arena.reserved >= a.used

    @invariant()
    def object_pools_match(self):
        for o in self.objpools:
            s = o.pool.stats()
            for k, v in o.c.items():
                assert s[k] == v, (k, s[k], v)
            assert (s["in_use"], s["idle"], s["closed"], s["resetting"]) == (len(o.out), len(o.idle), o.closed, 0)
            if o.capacity is not None:
                assert len(o.out) + len(o.idle) <= o.capacity
            for obj in o.dropped:
                assert obj.closes == 1
            for obj in o.idle + o.out:
                assert obj.closes == 0

    # ---- teardown: everything back; kpool's heap where it was ---------------------------------------------
    def teardown(self):
        for v in [v for rec in self.recs for v in rec.views]:
            v.release()
        self.recs = []                # the Blocks go with their last reference
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # close errors of idle objects: counted above
            for o in self.objpools:
                o.pool.close()
        for p in self.pools:
            p.pool.close()
            assert p.pool.in_use == 0 and p.pool.closed
        for a in self.arenas:
            a.arena.reset()
        self.dead = []
        if hasattr(self, "base_in_use"):
            assert kpool.stats()["bytes_in_use"] == self.base_in_use


def machine_settings(max_examples, steps):
    return settings(max_examples=max_examples, stateful_step_count=steps, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


TestKpoolStateful = KpoolMachine.TestCase
TestKpoolStateful.settings = machine_settings(30, 30)
