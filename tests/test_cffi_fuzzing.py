"""Hypothesis: random malloc/realloc/free/calloc/aligned_alloc sequences
through cffi, checking every live block's contents, ownership, alignment
and that live blocks never overlap; interleaved with kpool.malloc Blocks."""
import pytest

from conftest import kpool

cffi = pytest.importorskip("cffi")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_cffi import lib  # noqa: E402

sizes = st.one_of(st.integers(0, 64), st.integers(0, 4096), st.integers(0, 300_000),
                  st.sampled_from([8, 16, 32, 1024, 8192, 262144, 262145, 1 << 20]))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes),
        st.tuples(st.just("calloc"), sizes),
        st.tuples(st.just("aligned"), st.sampled_from([16, 64, 4096, 65536]), st.integers(1, 20000)),
        st.tuples(st.just("realloc"), st.integers(0, 1000), sizes),
        st.tuples(st.just("free"), st.integers(0, 1000)),
        st.tuples(st.just("block"), sizes),
        st.tuples(st.just("release"), st.integers(0, 1000)),
    ),
    max_size=60,
)


def pattern(seed, n):
    return bytes((seed * 131 + i * 7) & 0xFF for i in range(min(n, 64)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_heap_sequences(seq):
    ffi, L = lib()
    live = []     # [ptr, size, seed]
    blocks = []   # [Block, seed]
    before = kpool.stats()["bytes_in_use"]
    counter = [0]

    def stamp(p, size):
        counter[0] += 1
        s = counter[0]
        data = pattern(s, size)
        ffi.memmove(p, data, len(data))
        return s

    def check(p, size, s):
        data = pattern(s, size)
        assert ffi.buffer(p, len(data))[:] == data
        assert L.kp_owns(p) == 1
        if size:
            assert L.kp_owns(ffi.cast("char *", p) + (size - 1)) == 1
        assert L.kp_usable_size(p) >= size

    try:
        for op in seq:
            kind = op[0]
            if kind in ("malloc", "calloc"):
                size = op[1]
                p = L.kp_malloc(size) if kind == "malloc" else L.kp_calloc(1, size)
                assert p != ffi.NULL
                assert int(ffi.cast("uintptr_t", p)) % 16 == 0
                if kind == "calloc":
                    assert ffi.buffer(p, min(size, 4096))[:] == bytes(min(size, 4096))
                live.append([p, size, stamp(p, size)])
            elif kind == "aligned":
                align, size = op[1], op[2]
                p = L.kp_aligned_alloc(align, size)
                assert p != ffi.NULL
                assert int(ffi.cast("uintptr_t", p)) % align == 0
                live.append([p, size, stamp(p, size)])
            elif kind == "realloc" and live:
                entry = live[op[1] % len(live)]
                p, size, s = entry
                check(p, size, s)
                new = op[2]
                q = L.kp_realloc(p, new)
                assert q != ffi.NULL
                keep = min(size, new, 64)
                assert ffi.buffer(q, keep)[:] == pattern(s, size)[:keep]
                entry[0], entry[1] = q, new
                entry[2] = stamp(q, new)
            elif kind == "free" and live:
                p, size, s = live.pop(op[1] % len(live))
                check(p, size, s)
                L.kp_free(p)
            elif kind == "block":
                b = kpool.malloc(op[1])
                counter[0] += 1
                data = pattern(counter[0], op[1])
                memoryview(b)[: len(data)] = data
                assert L.kp_owns(ffi.cast("void *", b.address)) == 1
                blocks.append([b, counter[0]])
            elif kind == "release" and blocks:
                b, s = blocks.pop(op[1] % len(blocks))
                assert bytes(memoryview(b)[: min(b.size, 64)]) == pattern(s, b.size)
                b.release()
            # live blocks never overlap
            spans = sorted([(int(ffi.cast("uintptr_t", p)), max(size, 1)) for p, size, _ in live] +
                           [(b.address, max(b.size, 1)) for b, _ in blocks])
            for (a, n), (c, _) in zip(spans, spans[1:]):
                assert a + n <= c
        for p, size, s in live:
            check(p, size, s)
        for b, s in blocks:
            assert bytes(memoryview(b)[: min(b.size, 64)]) == pattern(s, b.size)
    finally:
        for p, _, _ in live:
            L.kp_free(p)
        for b, _ in blocks:
            b.release()
    assert kpool.stats()["bytes_in_use"] == before
