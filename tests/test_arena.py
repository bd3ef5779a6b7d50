"""kpool.Arena: bump allocation, alignment, reset rules (stale blocks are
dead, exports block reset), used/reserved, context manager, threads,
bad input, leaks."""
import gc
import threading

import pytest

from conftest import bytes_in_use, kpool, run_python


def test_alloc_gives_blocks_of_size():
    a = kpool.Arena()
    b = a.alloc(100)
    assert isinstance(b, kpool.Block)
    assert b.size == 100 and len(memoryview(b)) == 100
    memoryview(b)[:] = b"a" * 100
    assert bytes(b) == b"a" * 100
    assert a.used >= 100
    assert a.reserved >= a.used


def test_blocks_do_not_overlap_and_keep_contents():
    a = kpool.Arena(chunk_size=1 << 16)
    bs = []
    for i in range(1000):
        b = a.alloc(1 + i % 300)
        memoryview(b)[:] = bytes([i % 256]) * b.size
        bs.append(b)
    for i, b in enumerate(bs):
        assert bytes(b) == bytes([i % 256]) * b.size
    spans = sorted((b.address, b.size) for b in bs)
    for (x, n), (y, _) in zip(spans, spans[1:]):
        assert x + n <= y


@pytest.mark.parametrize("align", [1, 2, 8, 16, 64, 4096, 8192, 1 << 16, 1 << 20])
def test_alignment(align):
    a = kpool.Arena()
    for size in (1, 3, 17, 100):
        assert a.alloc(size, align).address % align == 0
        assert a.alloc(size, align=align).address % align == 0


def test_default_alignment_16():
    a = kpool.Arena()
    for size in (1, 3, 5, 33):
        assert a.alloc(size).address % 16 == 0


def test_zero_size_and_large_requests():
    a = kpool.Arena(chunk_size=1 << 16)
    z1, z2 = a.alloc(0), a.alloc(0)
    assert z1.size == 0 and bytes(z1) == b""
    assert z1.address != z2.address
    big = a.alloc(1 << 20)  # larger than a chunk: a chunk of its own
    memoryview(big)[-1] = 9
    assert a.reserved >= (1 << 20) + (1 << 16)


def test_reset_kills_old_blocks():
    a = kpool.Arena()
    b = a.alloc(64)
    a.reset()
    assert b.released
    with pytest.raises(ValueError):
        memoryview(b)
    with pytest.raises(ValueError):
        b.size
    with pytest.raises(ValueError):
        b.address
    with pytest.raises(ValueError):
        bytes(b)
    b.release()  # idempotent, harmless
    assert a.used == 0
    c = a.alloc(64)
    assert not c.released


def test_generation_counts_the_resets():
    """Arena.generation: how many times the arena was reset; a refused
    reset (a block exported) does not count."""
    a = kpool.Arena()
    assert a.generation == 0
    a.reset()
    a.reset()
    assert a.generation == 2
    b = a.alloc(16)
    m = memoryview(b)
    with pytest.raises(BufferError):
        a.reset()
    assert a.generation == 2
    m.release()
    with a:
        a.alloc(8)
    assert a.generation == 3               # the with block's reset
    with pytest.raises(AttributeError):
        a.generation = 0


def test_reset_refused_while_a_block_is_exported():
    a = kpool.Arena()
    b = a.alloc(64)
    m = memoryview(b)
    with pytest.raises(BufferError):
        a.reset()
    m[0] = 5
    assert not b.released
    m.release()
    a.reset()
    assert b.released


def test_reset_refused_with_numpy_view():
    np = pytest.importorskip("numpy")
    a = kpool.Arena()
    b = a.alloc(800)
    arr = np.frombuffer(b, dtype=np.float64)
    with pytest.raises(BufferError):
        a.reset()
    del arr
    gc.collect()
    a.reset()


def test_release_of_arena_block_frees_nothing_and_is_idempotent():
    a = kpool.Arena()
    b = a.alloc(100)
    used = a.used
    b.release()
    b.release()
    assert b.released
    assert a.used == used


def test_used_and_reserved_track_allocations():
    a = kpool.Arena(chunk_size=1 << 16)
    assert a.used == 0
    for _ in range(100):
        a.alloc(1000)
    assert a.used >= 100 * 1000
    assert a.reserved >= a.used
    a.reset()
    assert a.used == 0
    assert a.reserved <= 1 << 17  # the first chunk is kept


def test_context_manager_resets():
    with kpool.Arena() as a:
        b = a.alloc(10)
        memoryview(b)[0] = 1
    assert b.released
    assert a.used == 0
    # the arena is usable again after exit
    assert a.alloc(5).size == 5


def test_block_keeps_arena_alive():
    b = kpool.Arena().alloc(64)
    gc.collect()
    memoryview(b)[:] = b"z" * 64
    assert bytes(b) == b"z" * 64


def test_many_threads_share_an_arena():
    a = kpool.Arena(chunk_size=1 << 16)
    out = []
    lock = threading.Lock()

    def worker(k):
        mine = []
        for i in range(500):
            b = a.alloc(8 + (k + i) % 64, 8)
            memoryview(b)[:] = bytes([k]) * b.size
            mine.append(b)
        with lock:
            out.extend((k, b) for b in mine)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(out) == 4000
    for k, b in out:
        assert bytes(b) == bytes([k]) * b.size
    spans = sorted((b.address, b.size) for _, b in out)
    for (x, n), (y, _) in zip(spans, spans[1:]):
        assert x + n <= y


def test_no_leak(no_leak):
    before = bytes_in_use()
    for _ in range(20):
        with kpool.Arena(chunk_size=1 << 16) as a:
            for i in range(200):
                a.alloc(i)
            a.alloc(1 << 20)
    arenas = [kpool.Arena() for _ in range(10)]
    for x in arenas:
        x.alloc(100)
    del arenas
    gc.collect()
    assert bytes_in_use() == before
    assert kpool.stats()["bytes_arenas"] >= 0


# ---- bad input -------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["1", 1.0, None, []])
def test_alloc_wrong_type(bad):
    a = kpool.Arena()
    with pytest.raises(TypeError):
        a.alloc(bad)
    with pytest.raises(TypeError):
        a.alloc(8, align=bad) if bad is not None else a.alloc(8, "x")


def test_alloc_negative_and_huge():
    a = kpool.Arena()
    with pytest.raises(ValueError):
        a.alloc(-1)
    with pytest.raises(OverflowError):
        a.alloc(1 << 70)
    with pytest.raises(MemoryError):
        a.alloc(1 << 60)
    with pytest.raises(MemoryError):
        a.alloc(1 << 50)
    assert a.alloc(10).size == 10


@pytest.mark.parametrize("align", [0, 3, 12, 100, -16, 1 << 31, 1 << 70])
def test_alloc_bad_alignment(align):
    a = kpool.Arena()
    with pytest.raises((ValueError, OverflowError)):
        a.alloc(8, align)


def test_alloc_argument_errors():
    a = kpool.Arena()
    with pytest.raises(TypeError):
        a.alloc()
    with pytest.raises(TypeError):
        a.alloc(1, 16, 3)
    with pytest.raises(TypeError):
        a.alloc(1, bogus=3)
    assert a.alloc(size=3, align=32).address % 32 == 0


@pytest.mark.parametrize("chunk", [0, -1, -(1 << 70)])
def test_bad_chunk_size(chunk):
    with pytest.raises(ValueError):
        kpool.Arena(chunk)


def test_a_chunk_that_cannot_be_mapped_says_so():
    """MemoryError names the chunk when the chunk's mapping failed (it used
    to say only "cannot allocate 1 bytes"); the arena stays usable."""
    proc = run_python(
        """
        import resource, kpool
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        a = kpool.Arena(chunk_size=64 << 30)
        try:
            a.alloc(1)
        except MemoryError as e:
            print("error", e)
        b = kpool.Arena().alloc(100)
        print("other", b.size)
        """)
    assert "Arena.alloc: cannot allocate 1 bytes (a new chunk of 68719476736 bytes)" in proc.stdout
    assert "other 100" in proc.stdout


def test_chunk_size_wrong_type_and_huge():
    with pytest.raises(TypeError):
        kpool.Arena("1")
    with pytest.raises(TypeError):
        kpool.Arena(1024.0)
    with pytest.raises((ValueError, OverflowError, MemoryError)):
        kpool.Arena(1 << 62)
    with pytest.raises(OverflowError):
        kpool.Arena(1 << 80)
    assert kpool.Arena(chunk_size=5000).chunk_size == 5000
