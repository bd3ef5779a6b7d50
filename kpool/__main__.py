"""python -m kpool [bench ...]

    python -m kpool bench [--workloads ...] [--allocators ...] [--threads ...]
                          [--ops N] [--rounds N] [--quick] [--save PATH]
                          [--plot PATH] [--compare OLD.json] [--list]
        the comparison of kpool with glibc, jemalloc, tcmalloc and mimalloc
        (kpool.bench); `python -m kpool bench --help` lists every flag.
    python -m kpool run [--stats] [--] CMD [ARGS...]
        runs CMD with kpool as its malloc (LD_PRELOAD=kpool.get_preload());
        --stats prints kpool's statistics to stderr at exit.
    python -m kpool
        a short demonstration: a block, a pool, the statistics, a stress run.
"""

import sys


def _demo():
    import kpool
    print(f"kpool {kpool.__version__}: library {kpool.get_library()}")
    with kpool.malloc(100) as b:
        memoryview(b)[:5] = b"hello"     # a temporary view: gone before the block is released
        print(f"malloc(100): block at {b.address:#x}, usable {b.usable_size} B")
    pool = kpool.BufferPool(4096, capacity=8)
    blk = pool.acquire()
    pool.release(blk)
    print(f"BufferPool(4096): {pool.stats()}")
    pool.close()
    r = kpool.stress("mixed", threads=2, ops=200_000, verify=True)
    print(f"stress mixed, 2 threads, verify: {r['ops_per_sec'] / 1e6:.1f} Mops/s, corrupt {r['corrupt']}")
    s = kpool.stats()
    print(f"stats: bytes_mapped {s['bytes_mapped']}, allocs {s['allocs']}, frees {s['frees']}")
    print("next: python -m kpool bench   (the comparison table; --quick for a short one)")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        return _demo()
    if argv[0] == "bench":
        from . import bench
        return bench.main(argv[1:])
    if argv[0] == "run":
        from . import _preload
        return _preload.main(argv[1:])
    if argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    print(f"python -m kpool: unknown command {argv[0]!r} (try: bench, run)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
