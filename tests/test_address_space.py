"""kpool reserves no large range of address space: a process that imports
it stays small in `ps -o vsz`, and one that lowers RLIMIT_AS afterwards (a
service calling resource.setrlimit, a sandbox, prlimit) keeps a working
heap."""

from conftest import run_python


def test_vsz_after_import_and_malloc_is_under_1_gib():
    proc = run_python("""
        import os, subprocess, kpool
        b = kpool.malloc(100)
        out = subprocess.run(["ps", "-o", "vsz=", "-p", str(os.getpid())], capture_output=True, text=True)
        print(out.stdout.strip())
    """)
    vsz_kib = int(proc.stdout.split()[-1])
    assert vsz_kib < 1 << 20, f"VmSize {vsz_kib} KiB"


def test_heap_works_after_rlimit_as_is_lowered():
    proc = run_python("""
        import resource, kpool
        kpool.malloc(100).release()
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        blocks = []
        try:
            while True:
                blocks.append(kpool.malloc(32 << 20))
        except MemoryError:
            pass
        n = len(blocks)
        small = [kpool.malloc(100) for _ in range(1000)]   # small blocks still come
        for b in blocks:
            b.release()
        again = [kpool.malloc(32 << 20) for _ in range(n)]  # freed memory serves again
        print(n, len(again), len(small))
    """)
    n, again, small = map(int, proc.stdout.split()[-3:])
    assert n >= 16 and again == n and small == 1000
