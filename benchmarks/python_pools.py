"""Python-level cost of kpool's pools against what Python code does instead.

Measures, in one process, interleaved round by round (the order rotates each
round), several rounds:
  - BufferPool.acquire() + release() and kpool.malloc(n) + release() against
    bytearray(n), numpy.empty(n, uint8) and, where pyarrow is installed,
    pyarrow.allocate_buffer(n), for n = 64, 4096, 65536, 1 MiB;
  - numpy.empty(n, uint8) and numpy.zeros(n, uint8) with numpy's own
    allocator and "on kpool", timed inside `with kpool.use_for_numpy():`
    (kpool's NEP 49 handler: kp_malloc/kp_calloc, kp_free_sized), same n;
  - ObjectPool.get() + put() against calling the factory;
  - the cost of calling a no-op C method from Python (list.clear on an empty
    list), the floor under any of these, and of the empty timing loop.
Each case is a statement timed by timeit (compiled into the timing loop, no
Python function call around it), so the figure is the operation's own cost
plus one loop step (the "empty loop" row).
Prints a markdown table: ns per operation (median and range over rounds)
and each one's ratio to bytearray(n) (or to the factory) in the same round.

    python benchmarks/python_pools.py [--rounds 7] [--seconds 0.2] [--json out.json] [--out table.txt]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import timeit

import kpool

try:
    import numpy
except ImportError:  # numpy is optional: its row is skipped
    numpy = None
try:
    import pyarrow
except ImportError:  # pyarrow is optional: its row is skipped
    pyarrow = None

SIZES = [64, 4096, 65536, 1 << 20]


def make_cases(n, pool):
    """name -> (statement, namespace) doing one operation of size n."""
    ns = {"n": n, "pool": pool, "malloc": kpool.malloc, "noop": [].clear}
    cases = {
        "bytearray(n)": "bytearray(n)",
        "BufferPool acquire+release": "b = pool.acquire(); b.release()",
        "kpool.malloc(n)+release": "malloc(n).release()",
    }
    if numpy is not None:
        ns.update(empty=numpy.empty, zeros=numpy.zeros, uint8=numpy.uint8)
        cases["numpy.empty(n, uint8)"] = "empty(n, uint8)"
        cases["numpy.zeros(n, uint8)"] = "zeros(n, uint8)"
        if numpy_on_kpool():
            # timed inside `with kpool.use_for_numpy():` (the third element)
            cases["numpy.empty(n, uint8) on kpool"] = ("empty(n, uint8)", kpool.use_for_numpy)
            cases["numpy.zeros(n, uint8) on kpool"] = ("zeros(n, uint8)", kpool.use_for_numpy)
    if pyarrow is not None:
        ns["allocate_buffer"] = pyarrow.allocate_buffer
        cases["pyarrow.allocate_buffer(n)"] = "allocate_buffer(n)"
    cases["no-op C method"] = "noop()"
    cases["empty loop"] = "pass"
    return {name: (stmt, ns) if isinstance(stmt, str) else (stmt[0], ns, stmt[1]) for name, stmt in cases.items()}


def numpy_on_kpool():
    """True if kpool's numpy handler can be used (numpy installed, kpool built with it)."""
    try:
        kpool.numpy_handler()
    except ImportError:
        return False
    return True


def time_case(case, seconds):
    """time_one for a case (statement, namespace[, context manager factory to time it in])."""
    if len(case) == 3:
        with case[2]():
            return time_one(case[0], case[1], seconds)
    return time_one(case[0], case[1], seconds)


def time_one(stmt, ns, seconds):
    """ns per execution of stmt, measured over about `seconds`."""
    timer = timeit.Timer(stmt, globals=ns)
    loops = 1
    while True:
        dt = timer.timeit(loops)
        if dt > seconds / 4:
            break
        loops *= 4
    return timer.timeit(loops) / loops * 1e9


def run_group(cases, baseline, rounds, seconds):
    names = list(cases)
    per = {name: [] for name in names}
    ratios = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {name: time_case(cases[name], seconds) for name in order}
        for name in names:
            per[name].append(got[name])
            ratios[name].append(got[baseline] / got[name])
    return per, ratios


def summarize(group, per, ratios, baseline):
    rows = []
    for name in per:
        ns = per[name]
        rows.append({
            "group": group, "case": name, "median_ns": statistics.median(ns),
            "min_ns": min(ns), "max_ns": max(ns),
            "speedup_vs_" + baseline: statistics.median(ratios[name]),
            "speedup_min": min(ratios[name]), "speedup_max": max(ratios[name]),
        })
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.2, help="time per case per round")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--out", help="also write the printed table to this file "
                                  "(e.g. benchmarks/runs/python_pools-DATE.txt)")
    args = ap.parse_args(argv)

    rows = []
    for n in SIZES:
        with kpool.BufferPool(n) as pool:
            cases = make_cases(n, pool)
            per, ratios = run_group(cases, "bytearray(n)", args.rounds, args.seconds)
            rows += summarize(f"n = {n}", per, ratios, "bytearray(n)")

    def factory():
        return {"buffer": bytearray(256), "state": 0}

    opool = kpool.ObjectPool(factory, reset=None)
    ns = {"factory": factory, "opool": opool, "noop": [].clear}
    cases = {"factory()": ("factory()", ns), "ObjectPool get+put": ("opool.put(opool.get())", ns),
             "no-op C method": ("noop()", ns)}
    per, ratios = run_group(cases, "factory()", args.rounds, args.seconds)
    rows += summarize("objects", per, ratios, "factory()")

    lines = [f"Python {platform.python_version()}, kpool {kpool.__version__}, numpy "
             f"{numpy.__version__ if numpy else '-'}, pyarrow {pyarrow.__version__ if pyarrow else '-'}; "
             f"{args.rounds} rounds of {args.seconds} s per case, interleaved; {os.cpu_count()} cpus; "
             f"{datetime.date.today().isoformat()}",
             "ns per operation (timeit statement, loop step included), median [min-max]; "
             "speedup = baseline time / this time, same round",
             "",
             "| group | case | ns/op | speedup vs baseline |",
             "|---|---|---|---|"]
    for row in rows:
        key = [k for k in row if k.startswith("speedup_vs_")][0]
        lines.append(f"| {row['group']} | {row['case']} | {row['median_ns']:.0f} [{row['min_ns']:.0f}-{row['max_ns']:.0f}] | "
                     f"{row[key]:.2f}x [{row['speedup_min']:.2f}-{row['speedup_max']:.2f}] vs {key[len('speedup_vs_'):]} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(" ".join(["python"] + sys.argv) + "\n\n" + text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": platform.python_version(), "kpool": kpool.__version__,
                       "argv": sys.argv, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
