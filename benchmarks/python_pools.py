"""Python-level cost of kpool's pools against what Python code does instead.

Measures, in one process, interleaved round by round (the order rotates each
round), several rounds:
  - BufferPool.acquire() + release() against bytearray(n), numpy.empty(n,
    uint8) and kpool.malloc(n) + release(), for n = 64, 4096, 65536, 1 MiB;
  - ObjectPool.get() + put() against calling the factory;
  - the cost of calling a no-op C method from Python (list.clear on an empty
    list), the floor under any of these.
Prints a markdown table: ns per operation (median and range over rounds)
and each one's ratio to bytearray(n) (or to the factory) in the same round.

    python benchmarks/python_pools.py [--rounds 7] [--seconds 0.2] [--json out.json]
"""
import argparse
import json
import platform
import statistics
import sys
import time

import kpool

try:
    import numpy
except ImportError:  # numpy is optional: its column is skipped
    numpy = None

SIZES = [64, 4096, 65536, 1 << 20]


def make_cases(n, pool):
    """name -> zero-argument callable doing one operation of size n."""
    def pool_cycle():
        b = pool.acquire()
        b.release()

    def kpool_malloc():
        kpool.malloc(n).release()

    cases = {
        "bytearray(n)": lambda: bytearray(n),
        "BufferPool acquire+release": pool_cycle,
        "kpool.malloc(n)+release": kpool_malloc,
    }
    if numpy is not None:
        cases["numpy.empty(n, uint8)"] = lambda: numpy.empty(n, numpy.uint8)
    return cases


def time_one(fn, seconds):
    """ns per call of fn, measured over about `seconds`."""
    loops = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        dt = time.perf_counter_ns() - t0
        if dt > seconds * 1e9 / 4:
            break
        loops *= 4
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        fn()
    return (time.perf_counter_ns() - t0) / loops


def run_group(cases, baseline, rounds, seconds):
    names = list(cases)
    per = {name: [] for name in names}
    ratios = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {name: time_one(cases[name], seconds) for name in order}
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
    args = ap.parse_args(argv)

    rows = []
    noop = [].clear
    for n in SIZES:
        with kpool.BufferPool(n) as pool:
            cases = make_cases(n, pool)
            cases["no-op C method"] = noop
            per, ratios = run_group(cases, "bytearray(n)", args.rounds, args.seconds)
            rows += summarize(f"n = {n}", per, ratios, "bytearray(n)")

    def factory():
        return {"buffer": bytearray(256), "state": 0}

    opool = kpool.ObjectPool(factory, reset=None)

    def get_put():
        opool.put(opool.get())

    cases = {"factory()": factory, "ObjectPool get+put": get_put, "no-op C method": noop}
    per, ratios = run_group(cases, "factory()", args.rounds, args.seconds)
    rows += summarize("objects", per, ratios, "factory()")

    print(f"Python {platform.python_version()}, kpool {kpool.__version__}, {args.rounds} rounds, "
          f"interleaved; ns per operation, median [min-max]; speedup = baseline time / this time, same round")
    print()
    print("| group | case | ns/op | speedup vs baseline |")
    print("|---|---|---|---|")
    for row in rows:
        key = [k for k in row if k.startswith("speedup_vs_")][0]
        print(f"| {row['group']} | {row['case']} | {row['median_ns']:.0f} [{row['min_ns']:.0f}-{row['max_ns']:.0f}] | "
              f"{row[key]:.2f}x [{row['speedup_min']:.2f}-{row['speedup_max']:.2f}] vs {key[len('speedup_vs_'):]} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": platform.python_version(), "kpool": kpool.__version__,
                       "argv": sys.argv, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
