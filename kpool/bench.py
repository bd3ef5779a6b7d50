"""kpool.bench: kpool against the allocators you would otherwise pick.

Every measurement runs in a fresh child process of the ``kpool-stress``
executable (shipped in the package folder; ``kpool-stress --help`` lists its
flags): kpool with ``--allocator kpool`` (direct
kp_* calls) or ``kpool-pool`` (fixed pools, the one-size workload ``pairs``),
glibc with ``--allocator system``, and the peers jemalloc, tcmalloc and
mimalloc with ``--allocator system`` under ``LD_PRELOAD`` of their Debian
library, so that each allocator owns its whole process. ``null`` returns a
fixed buffer and measures the driver's own cost per operation.

Allocators are interleaved round by round with a rotating order (A B C D,
then B C D A, ...); a result reports the median and range over rounds and
each allocator's ratio to ``system`` computed within the same round. A peer
whose library is missing, or whose preload did not take, is reported as
unavailable with the reason, never faked; nothing is cached or hard-coded.

    from kpool import bench
    res = bench.run(workloads=["pairs", "mixed"], threads=[1, 2], repeat=5)
    print(res.table()); res.save("run.json"); res.plot("run.png")
    arr = res.to_numpy()              # one row per workload x allocator x threads x round
    old = bench.load("run.json")

Importing this module needs only the standard library; numpy, pandas,
matplotlib and tqdm are imported by the functions that use them.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import operator
import os
import platform
import shlex
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

__all__ = [
    "WORKLOADS", "MAIN_WORKLOADS", "MEMORY_WORKLOADS", "ALLOCATORS", "DEFAULT_OPS",
    "Workload", "Allocator", "Result", "workloads", "allocators", "run", "load",
    "compare", "machine_info", "find_stress", "main", "PALETTE", "color_of", "saved_runs", "newest_run",
    "comparable_runs", "BenchInterrupted",
]

# ---------------------------------------------------------------------------
# What can be measured
# ---------------------------------------------------------------------------
_WORKLOAD_INFO = {
    "pairs": ("alloc/free pairs of one size (default 32 B)", False),
    "mixed": ("sizes 8/32/128/512/4096, live window of 512 blocks per thread, random frees", False),
    "random": ("sizes 8..256, live window of 1000 per thread, random replacement", False),
    "larson": ("server-like: blocks freed by another thread than the one that allocated them", False),
    "prodcons": ("producer threads allocate, consumer threads free (SPSC rings)", False),
    "burst": ("allocate a large total of 64..4096 B blocks, free it all: RSS after free, 1 s, trim", True),
    "frag": ("8..256 B blocks, free a random 90%, refill with 257..1024 B: RSS over live bytes", True),
}
WORKLOADS = tuple(_WORKLOAD_INFO)
MAIN_WORKLOADS = ("pairs", "mixed", "random", "larson", "prodcons")
MEMORY_WORKLOADS = ("burst", "frag")
ALLOCATORS = ("system", "jemalloc", "tcmalloc", "mimalloc", "kpool", "kpool-mesh", "kpool-preload", "kpool-pool",
              "null")
# kpool-mesh: kpool with meshing on (KPOOL_MESH=1); plain kpool runs with it off, as by default.
MESH_ALLOCATORS = ("kpool-mesh",)
PEERS = ("system", "jemalloc", "tcmalloc", "mimalloc")
ONE_SIZE_WORKLOADS = ("pairs",)          # the only ones kpool-pool can run

# Peers: Debian library file and the package that ships it.
_PEERS = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
    "mimalloc": ("libmimalloc.so.2", "libmimalloc2.0"),
}

# Operations per measurement (over all threads) for the default run: each
# measurement lasts about 0.1-0.5 s with glibc on a 2-core machine, so the
# whole default comparison (with burst and frag) fits in about two minutes.
# frag: blocks; burst: ignored (burst_bytes sets its size).
DEFAULT_OPS = {
    "pairs": 25_000_000,
    "mixed": 15_000_000,
    "random": 15_000_000,
    "larson": 10_000_000,
    "prodcons": 5_000_000,
    "burst": 1,
    "frag": 1_000_000,
}
DEFAULT_BURST_BYTES = 1 << 30
FORMAT_VERSION = 1   # of the JSON that Result.save writes
MAX_ROUNDS = 100000   # the plan is built up front: a bound keeps it in memory
STRESS_MAX_THREADS = 4096   # kpool-stress refuses more (csrc/stress/main.c)
DEFAULT_THREADS = (1, 2, 8)
DEFAULT_ROUNDS = 5
MEMORY_ROUNDS = 2               # burst sleeps 1 s per measurement


class _Record(str):
    """A name that is also a record: ``x == "kpool"``, ``x.name``, ``x["name"]``."""

    _fields: tuple = ("name",)

    def __new__(cls, name, **fields):
        self = super().__new__(cls, name)
        self.name = name
        for k, v in fields.items():
            setattr(self, k, v)
        return self

    def __getitem__(self, key):
        if isinstance(key, str):
            try:
                return getattr(self, key)
            except AttributeError:
                raise KeyError(key) from None
        return str.__getitem__(self, key)

    def get(self, key, default=None):
        return getattr(self, key, default)

    def asdict(self):
        return {f: getattr(self, f) for f in self._fields}

    def __repr__(self):
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"

    def __reduce__(self):
        d = self.asdict()
        name = d.pop("name")
        return (_rebuild, (type(self), name, d))


def _rebuild(cls, name, fields):
    return cls(name, **fields)


class Workload(_Record):
    """A workload name with ``description`` and ``memory`` (True for burst/frag)."""

    _fields = ("name", "description", "memory")


class Allocator(_Record):
    """An allocator name with ``available``, ``reason``, ``kind`` (baseline,
    peer, kpool), ``driver`` (the --allocator given to kpool-stress),
    ``library`` (the preloaded file for peers) and ``version``."""

    _fields = ("name", "available", "reason", "kind", "driver", "library", "version")


def workloads():
    """The workloads of the stress driver, as Workload names."""
    return [Workload(n, description=d, memory=m) for n, (d, m) in _WORKLOAD_INFO.items()]


# ---------------------------------------------------------------------------
# Finding the executable and the peer libraries
# ---------------------------------------------------------------------------
def find_stress():
    """Path of kpool-stress: $KPOOL_STRESS, else next to this file (the
    installed package), else csrc/build/kpool-stress of a source checkout.
    None when there is none."""
    env = os.environ.get("KPOOL_STRESS")
    if env:
        return Path(env) if Path(env).is_file() else None
    here = Path(__file__).resolve()
    for cand in (here.with_name("kpool-stress"), here.parent.parent / "csrc" / "build" / "kpool-stress"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def find_preload():
    """Path of libkpool-malloc.so (kpool as malloc, for LD_PRELOAD): next to
    this file (the installed package), else csrc/build/ of a source
    checkout. None when there is none."""
    here = Path(__file__).resolve()
    for cand in (here.with_name("libkpool-malloc.so"), here.parent.parent / "csrc" / "build" / "libkpool-malloc.so"):
        if cand.is_file():
            return cand
    return None


def _lib_dirs():
    dirs = []
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    arches = [multiarch] if multiarch else []
    arches += [f"{platform.machine()}-linux-gnu"]
    for a in arches:
        dirs += [f"/usr/lib/{a}", f"/lib/{a}"]
    dirs += ["/usr/lib64", "/usr/lib", "/lib64", "/lib", "/usr/local/lib"]
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _find_lib(fname):
    for d in _lib_dirs():
        p = Path(d) / fname
        if p.exists():
            return p
    return None


def _lib_version(path, package=None):
    """Version of a shared library: its Debian package's version where
    dpkg-query answers, else what the resolved file name tells."""
    real = os.path.realpath(path)
    for target in (str(path), real):
        try:
            out = subprocess.run(["dpkg-query", "-S", target], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            break
        if out.returncode == 0 and out.stdout:
            pkg = out.stdout.split(":")[0].strip()
            if "," in pkg:
                pkg = pkg.split(",")[0].strip()
            try:
                v = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True,
                                   timeout=10)
            except (OSError, subprocess.SubprocessError):
                break
            if v.returncode == 0 and v.stdout.strip():
                return f"{pkg} {v.stdout.strip()} ({os.path.basename(real)})"
    return os.path.basename(real)


def _glibc_version():
    lib, ver = platform.libc_ver()
    return f"{lib} {ver}".strip() if lib else "unknown"


def _probe_preload(exe, lib):
    """None if kpool-stress really calls lib's malloc under LD_PRELOAD, else why not."""
    try:
        out = subprocess.run([str(exe), "--allocator", "system", "--workload", "pairs", "--ops", "1"],
                             capture_output=True, text=True, timeout=30, env=_child_env(str(lib)))
    except (OSError, subprocess.SubprocessError) as e:
        return f"kpool-stress did not run under LD_PRELOAD={lib}: {e}"
    if out.returncode != 0:
        return f"kpool-stress failed under LD_PRELOAD={lib}: {out.stderr.strip()[:200]}"
    try:
        rec = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "kpool-stress printed no result"
    used = rec.get("malloc_library")
    if "malloc_library" not in rec:
        return f"{exe} does not report which malloc it calls (an old build: rebuild it)"
    if not used or os.path.realpath(used) != os.path.realpath(str(lib)):
        msg = out.stderr.strip().splitlines()
        return f"LD_PRELOAD of {lib} did not take (malloc from {used}){': ' + msg[0] if msg else ''}"
    return None


def allocators(*, probe=True):
    """Every allocator bench knows, with whether it can run here and why not.

    Peers are available when their Debian library exists in the usual
    multiarch directories and (probe=True, kpool-stress present) a preload of
    it really replaces malloc in kpool-stress.
    """
    exe = find_stress()
    no_exe = None if exe else ("kpool-stress not found (install the package, build csrc/, or set KPOOL_STRESS)")
    out = []
    for name in ALLOCATORS:
        if name in _PEERS:
            fname, pkg = _PEERS[name]
            lib = _find_lib(fname)
            if lib is None:
                out.append(Allocator(name, available=False, kind="peer", driver="system", library=None,
                                     version=None,
                                     reason=f"{fname} not found in {', '.join(_lib_dirs()[:2])} "
                                            f"(apt-get install {pkg})"))
                continue
            reason = no_exe or (_probe_preload(exe, lib) if probe else None)
            out.append(Allocator(name, available=reason is None, reason=reason, kind="peer", driver="system",
                                 library=str(lib), version=_lib_version(lib, pkg)))
        elif name == "kpool-preload":
            # the very binary the peers run, its malloc replaced by kpool's
            lib = find_preload()
            reason = no_exe or ("libkpool-malloc.so not found (install the package or build csrc/)" if lib is None
                                else _probe_preload(exe, lib) if probe else None)
            out.append(Allocator(name, available=reason is None, reason=reason, kind="peer", driver="system",
                                 library=str(lib) if lib else None, version=_kpool_version()))
        elif name == "system":
            out.append(Allocator(name, available=no_exe is None, reason=no_exe, kind="baseline", driver="system",
                                 library=None, version=_glibc_version()))
        else:
            out.append(Allocator(name, available=no_exe is None, reason=no_exe,
                                 kind="baseline" if name == "null" else "kpool",
                                 driver="kpool" if name in MESH_ALLOCATORS else name, library=None,
                                 version=_kpool_version()))
    return out


def _kpool_version():
    mod = sys.modules.get("kpool")
    v = getattr(mod, "__version__", None) if mod else None
    if v:
        return str(v)
    try:
        from importlib.metadata import version
        return version("kpool")
    except Exception:
        return None


def _child_env(preload=None, mesh=False):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("KPOOL_STATS", None)
    env.pop("KPOOL_MESH", None)
    if preload:
        env["LD_PRELOAD"] = preload
    if mesh:
        env["KPOOL_MESH"] = "1"
    return env


def machine_info():
    """CPU model, cores, kernel, Python, glibc, kpool version, and the date."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "system": platform.system(),
        "python": platform.python_version(),
        "glibc": _glibc_version(),
        "kpool": _kpool_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


# ---------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------
_NUM_FIELDS = [
    ("ops", "i8"), ("seconds", "f8"), ("ops_per_sec", "f8"), ("ns_per_op", "f8"),
    ("p50_ns", "f8"), ("p99_ns", "f8"), ("p999_ns", "f8"), ("max_ns", "f8"),
    ("peak_rss", "f8"), ("final_rss", "f8"), ("corrupt", "i8"), ("ratio_to_system", "f8"),
    ("rss_full", "f8"), ("rss_after_free", "f8"), ("rss_after_1s", "f8"), ("rss_after_trim", "f8"),
    ("alloc_seconds", "f8"), ("free_seconds", "f8"),
    ("frag_ratio_alloc", "f8"), ("frag_ratio_free90", "f8"), ("frag_ratio_refill", "f8"),
    ("frag_live_refill", "f8"), ("frag_rss_refill", "f8"), ("frag_ratio_trim", "f8"), ("frag_trim_seconds", "f8"),
]


def _num(v):
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _median(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def _range(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return (min(xs), max(xs)) if xs else (math.nan, math.nan)


def _mb(b):
    return "-" if b is None or math.isnan(b) else f"{b / 1e6:.1f}"


def _fmt(x, nd=1):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


class Result:
    """The measurements of one bench run.

    records (also rows): one dict per measurement, the driver's JSON plus
    allocator (the bench name), driver_allocator, round, order, library,
    ratio_to_system. meta: machine, libraries, parameters, command line.
    """

    def __init__(self, records=None, meta=None):
        self.records = list(records or [])
        self.meta = dict(meta or {})
        self.path = None          # the file it was loaded from (load())
        self._ratios()

    @property
    def date(self):
        """When the run was made (ISO 8601, from its machine record), or ''."""
        return str((self.meta.get("machine") or {}).get("date") or "")

    def measured(self):
        """The workloads with at least one good measurement, as a frozenset."""
        return frozenset(r.get("workload") for r in self.records if _ok(r))

    def measured_threads(self):
        """{workload: frozenset of thread counts} over the good measurements."""
        out = {}
        for r in self.records:
            if _ok(r):
                out.setdefault(r.get("workload"), set()).add(r.get("threads"))
        return {w: frozenset(t) for w, t in out.items()}

    rows = property(lambda self: self.records)

    def __len__(self):
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __repr__(self):
        return f"<kpool.bench.Result: {len(self.records)} measurements>"

    def _ratios(self):
        base = {}
        for r in self.records:
            if r.get("allocator") == "system" and _ok(r):
                base[(r["workload"], r["threads"], r.get("round", 0))] = r.get("ops_per_sec")
        for r in self.records:
            b = base.get((r.get("workload"), r.get("threads"), r.get("round", 0)))
            v = r.get("ops_per_sec")
            if b and v and _ok(r) and r.get("workload") not in MEMORY_WORKLOADS:
                r["ratio_to_system"] = v / b
            else:
                r["ratio_to_system"] = None

    # -- summaries ----------------------------------------------------------
    def summary(self):
        """One dict per workload x threads x allocator: medians and ranges over rounds."""
        groups = {}
        for r in self.records:
            groups.setdefault((r.get("workload"), r.get("threads"), r.get("allocator")), []).append(r)
        out = []
        for (w, t, a), rs in groups.items():
            good = [r for r in rs if _ok(r)]
            ops = [_num(r.get("ops_per_sec")) for r in good]
            rat = [_num(r.get("ratio_to_system")) for r in good]
            s = {
                "workload": w, "threads": t, "allocator": a, "rounds": len(rs), "ok": len(good),
                "mops_median": _median(ops) / 1e6, "mops_min": _range(ops)[0] / 1e6,
                "mops_max": _range(ops)[1] / 1e6,
                "ns_per_op_median": _median([_num(r.get("ns_per_op")) for r in good]),
                "ratio_median": _median(rat), "ratio_min": _range(rat)[0], "ratio_max": _range(rat)[1],
                "p50_ns": _median([_num(r.get("p50_ns")) for r in good]),
                "p99_ns": _median([_num(r.get("p99_ns")) for r in good]),
                "p999_ns": _median([_num(r.get("p999_ns")) for r in good]),
                "max_ns": _median([_num(r.get("max_ns")) for r in good]),
                "peak_rss": _median([_num(r.get("peak_rss")) for r in good]),
                "errors": sorted({str(r.get("error")) for r in rs if not _ok(r)}),
            }
            for k in ("rss_base", "rss_full", "rss_after_free", "rss_after_1s", "rss_after_trim", "alloc_seconds",
                      "free_seconds", "frag_ratio_alloc", "frag_ratio_free90", "frag_ratio_refill",
                      "frag_live_refill", "frag_ratio_trim", "frag_trim_seconds"):
                s[k] = _median([_num(r.get(k)) for r in good])
            out.append(s)
        order = {w: i for i, w in enumerate(WORKLOADS)}
        aorder = {a: i for i, a in enumerate(ALLOCATORS)}
        out.sort(key=lambda s: (order.get(s["workload"], 99), s["threads"] or 0, aorder.get(s["allocator"], 99),
                                str(s["allocator"])))
        return out

    def _cores(self):
        return (self.meta.get("machine") or {}).get("cores") or os.cpu_count() or 1

    def _tlabel(self, t):
        return f"{t} (oversubscribed)" if t and t > self._cores() else str(t)

    def table(self):
        """Markdown: throughput (median Mops/s, range, ratio to system,
        latency, peak RSS), the driver's null cost, then burst and frag."""
        summ = self.summary()
        lines = []
        speed = [s for s in summ if s["workload"] not in MEMORY_WORKLOADS]
        if speed:
            rounds = max(s["rounds"] for s in speed)
            lines.append(f"Throughput: median over {rounds} rounds (range in brackets); "
                         f"x system = ratio to glibc within each round, median [range].")
            lines.append("")
            lines.append("| workload | threads | allocator | Mops/s | range | x system | ratio range | "
                         "p50 ns | p99 ns | p99.9 ns | max ns | peak RSS MB |")
            lines.append("|---|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|")
            for s in speed:
                if s["ok"] == 0:
                    lines.append(f"| {s['workload']} | {self._tlabel(s['threads'])} | {s['allocator']} | failed | "
                                 f"{'; '.join(s['errors'])[:80]} | | | | | | | |")
                    continue
                lines.append(
                    f"| {s['workload']} | {self._tlabel(s['threads'])} | {s['allocator']} | "
                    f"{_fmt(s['mops_median'])} | {_fmt(s['mops_min'])}-{_fmt(s['mops_max'])} | "
                    f"{_fmt(s['ratio_median'], 2)} | {_fmt(s['ratio_min'], 2)}-{_fmt(s['ratio_max'], 2)} | "
                    f"{_fmt(s['p50_ns'], 0)} | {_fmt(s['p99_ns'], 0)} | {_fmt(s['p999_ns'], 0)} | "
                    f"{_fmt(s['max_ns'], 0)} | {_mb(s['peak_rss'])} |")
            nulls = [s for s in speed if s["allocator"] == "null" and s["ok"]]
            if nulls:
                lines.append("")
                lines.append("Driver cost per op (null allocator, wall time per op over all threads): " + ", ".join(
                    f"{s['workload']} t={s['threads']} {_fmt(s['ns_per_op_median'], 2)} ns" for s in nulls) + ".")
        burst = [s for s in summ if s["workload"] == "burst"]
        if burst:
            lines.append("")
            lines.append("Burst: allocate then free all; RSS in MB; trim = kp_trim (kpool), malloc_trim (glibc), "
                         "'-' where the allocator has none.")
            lines.append("")
            lines.append("| allocator | threads | alloc s | free s | RSS full | after free | after 1 s | "
                         "after trim | after 1 s / full |")
            lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
            for s in burst:
                if s["ok"] == 0:
                    lines.append(f"| {s['allocator']} | {s['threads']} | failed: {'; '.join(s['errors'])[:80]} "
                                 f"| | | | | | |")
                    continue
                pct = (100 * s["rss_after_1s"] / s["rss_full"]) if s["rss_full"] else math.nan
                lines.append(f"| {s['allocator']} | {self._tlabel(s['threads'])} | {_fmt(s['alloc_seconds'], 3)} | "
                             f"{_fmt(s['free_seconds'], 3)} | {_mb(s['rss_full'])} | {_mb(s['rss_after_free'])} | "
                             f"{_mb(s['rss_after_1s'])} | {_mb(s['rss_after_trim'])} | {_fmt(pct, 1)}% |")
        frag = [s for s in summ if s["workload"] == "frag"]
        if frag:
            lines.append("")
            lines.append("Frag: RSS growth over live bytes after each phase (1.0 = no overhead; RSS is the "
                         "proportional figure, Pss). After trim: each allocator's own trim call (kp_trim, "
                         "which meshes for kpool-mesh; malloc_trim; jemalloc's arena purge; "
                         "tcmalloc's ReleaseFreeMemory; mi_collect), same live bytes as after refill.")
            lines.append("")
            lines.append("| allocator | threads | after alloc | after free 90% | after refill | after trim | trim s "
                         "| live MB | peak RSS MB |")
            lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
            for s in frag:
                if s["ok"] == 0:
                    lines.append(f"| {s['allocator']} | {s['threads']} | failed: {'; '.join(s['errors'])[:80]} "
                                 f"| | | | | | |")
                    continue
                lines.append(f"| {s['allocator']} | {self._tlabel(s['threads'])} | {_fmt(s['frag_ratio_alloc'], 2)} | "
                             f"{_fmt(s['frag_ratio_free90'], 2)} | {_fmt(s['frag_ratio_refill'], 2)} | "
                             f"{_fmt(s['frag_ratio_trim'], 2)} | {_fmt(s['frag_trim_seconds'], 3)} | "
                             f"{_mb(s['frag_live_refill'])} | {_mb(s['peak_rss'])} |")
        skipped = self.meta.get("unavailable") or {}
        if skipped:
            lines.append("")
            for a, why in skipped.items():
                lines.append(f"Not measured: {a}: {why}")
        return "\n".join(lines) + "\n"

    # -- targets (issue 7) ---------------------------------------------------
    def _rounds_of(self, w, t, a):
        return {r.get("round", 0): r for r in self.records
                if r.get("workload") == w and r.get("threads") == t and r.get("allocator") == a and _ok(r)}

    def _best_peer(self, w, t, key, pick):
        """The peer whose median of key is best (pick=max or min) at (w, t)."""
        meds = {}
        for peer in PEERS:
            v = _median([_num(r.get(key)) for r in self._rounds_of(w, t, peer).values()])
            if not math.isnan(v):
                meds[peer] = v
        return pick(meds, key=meds.get) if meds else None

    def _paired(self, w, t, a, b, f):
        """f(record of a, record of b) for every round both measured."""
        ra, rb = self._rounds_of(w, t, a), self._rounds_of(w, t, b)
        return [f(ra[k], rb[k]) for k in sorted(set(ra) & set(rb))]

    def targets(self):
        """The issue-7 targets, each with kpool's ratio to the best peer per
        round (median and range over rounds, peers measured in the same
        round) and whether the median meets it. Throughput rows also give
        net: the same ratio with the null driver's ns/op of that round
        subtracted from both, i.e. allocator time only."""
        out = []

        def add(target, measured, vals, need, higher=True, net=None):
            med, (lo, hi) = _median(vals), _range(vals)
            met = None if math.isnan(med) else (med >= need if higher else med <= need)
            out.append({"target": target, "measured": measured, "ratio_median": med, "ratio_min": lo,
                        "ratio_max": hi, "net_median": _median(net or []), "met": met})

        def speed(w, t, a, need, label):
            peer = self._best_peer(w, t, "ops_per_sec", max)
            if not peer or not self._rounds_of(w, t, a):
                return
            vals = self._paired(w, t, a, peer, lambda x, y: _num(x["ops_per_sec"]) / _num(y["ops_per_sec"]))
            nulls = self._rounds_of(w, t, "null")
            ra, rp = self._rounds_of(w, t, a), self._rounds_of(w, t, peer)
            net = []
            for k in sorted(set(ra) & set(rp) & set(nulls)):
                z = _num(nulls[k].get("ns_per_op"))
                mine, theirs = _num(ra[k].get("ns_per_op")) - z, _num(rp[k].get("ns_per_op")) - z
                if mine > 0 and theirs > 0:
                    net.append(theirs / mine)
            km = _median([_num(r["ops_per_sec"]) for r in ra.values()]) / 1e6
            pm = _median([_num(r["ops_per_sec"]) for r in rp.values()]) / 1e6
            add(label, f"{a} {km:.1f} vs {peer} {pm:.1f} Mops/s", vals, need, net=net)

        speed("pairs", 1, "kpool", 2.5, "pairs 32 B, 1 thread: kpool >= 2.5x best peer")
        speed("pairs", 1, "kpool-pool", 3.0, "pairs 32 B, 1 thread: kpool-pool >= 3x best peer")
        for w, ts in (("mixed", (1, 2)), ("random", (1, 2)), ("larson", (1, 2)), ("prodcons", (2,))):
            for t in ts:
                speed(w, t, "kpool", 1.25, f"{w}, {t} thread{'s' if t > 1 else ''}: >= 1.25x best peer")
        cores = self._cores()
        threads = sorted({r.get("threads") for r in self.records if r.get("threads")})
        for t in [t for t in threads if t > cores]:
            for w in MAIN_WORKLOADS:
                speed(w, t, "kpool", 1.0, f"{w}, {t} threads (oversubscribed): >= 1.0x best peer")
                two = _median([_num(r["ops_per_sec"]) for r in self._rounds_of(w, 2, "kpool").values()])
                many = self._rounds_of(w, t, "kpool")
                if many and not math.isnan(two):
                    vals = [_num(r["ops_per_sec"]) / two for r in many.values()]
                    add(f"{w}, {t} threads: no collapse (>= 0.8x kpool's own 2-thread median)",
                        f"{_median(vals) * two / 1e6:.1f} vs {two / 1e6:.1f} Mops/s", vals, 0.8)
        kb = self._rounds_of("burst", 1, "kpool")
        if kb:
            vals = [_num(r.get("rss_after_1s")) / _num(r.get("rss_full")) for r in kb.values()]
            add("burst 1 GiB: RSS 1 s after free-all <= 5% of peak (ratio: fraction of peak)",
                f"{_median([_num(r.get('rss_after_1s')) for r in kb.values()]) / 1e6:.1f} of "
                f"{_median([_num(r.get('rss_full')) for r in kb.values()]) / 1e6:.1f} MB", vals, 0.05, higher=False)
            vals = self._paired("burst", 1, "kpool", "system",
                                lambda x, y: _num(x.get("alloc_seconds")) / _num(y.get("alloc_seconds")))
            if vals:
                add("burst 1 GiB: alloc time <= glibc's (ratio: kpool / glibc time)",
                    f"{_median([_num(r.get('alloc_seconds')) for r in kb.values()]):.3f} s vs glibc "
                    f"{_median([_num(r.get('alloc_seconds')) for r in self._rounds_of('burst', 1, 'system').values()]):.3f} s",
                    vals, 1.0, higher=False)
        for w in ("mixed", "random"):
            for t in (1, 2):
                peer = self._best_peer(w, t, "peak_rss", min)
                if not peer or not self._rounds_of(w, t, "kpool"):
                    continue
                vals = self._paired(w, t, "kpool", peer, lambda x, y: _num(x["peak_rss"]) / _num(y["peak_rss"]))
                km = _median([_num(r["peak_rss"]) for r in self._rounds_of(w, t, "kpool").values()]) / 1e6
                pm = _median([_num(r["peak_rss"]) for r in self._rounds_of(w, t, peer).values()]) / 1e6
                add(f"peak RSS, {w} {t} thread{'s' if t > 1 else ''}: <= 1.1x lowest peer (ratio: kpool / peer)",
                    f"{km:.1f} vs {peer} {pm:.1f} MB", vals, 1.1, higher=False)
        for t in (1, 2):
            for key, name in (("p999_ns", "p99.9"), ("max_ns", "max")):
                peer = self._best_peer("mixed", t, key, min)
                if not peer or not self._rounds_of("mixed", t, "kpool"):
                    continue
                vals = self._paired("mixed", t, "kpool", peer, lambda x, y: _num(x[key]) / _num(y[key]))
                km = _median([_num(r[key]) for r in self._rounds_of("mixed", t, "kpool").values()])
                pm = _median([_num(r[key]) for r in self._rounds_of("mixed", t, peer).values()])
                add(f"latency, mixed {t} thread{'s' if t > 1 else ''}: {name} <= best peer's (ratio: kpool / peer)",
                    f"{km:.0f} vs {peer} {pm:.0f} ns", vals, 1.0, higher=False)
        return out

    def targets_table(self):
        """Markdown: every target with kpool's ratio to the best peer, its range
        over rounds and whether the median meets it."""
        rows = self.targets()
        if not rows:
            return ""
        lines = ["Targets (issue 7): ratio = kpool / best peer within each round, median [range over rounds]; "
                 "net = the throughput ratio with the null driver's ns/op subtracted from both (allocator time "
                 "only, median).", "",
                 "| target | measured (medians) | ratio | range | net | met |", "|---|---|---:|---|---:|---|"]
        for r in rows:
            met = "-" if r["met"] is None else ("yes" if r["met"] else "no")
            lines.append(f"| {r['target']} | {r['measured']} | {_fmt(r['ratio_median'], 2)} | "
                         f"{_fmt(r['ratio_min'], 2)}-{_fmt(r['ratio_max'], 2)} | {_fmt(r['net_median'], 2)} | {met} |")
        return "\n".join(lines) + "\n"

    # -- conversions --------------------------------------------------------
    def to_numpy(self):
        """A numpy structured array, one row per workload x allocator x threads x
        round; ok is False for a measurement that failed (an error, or corrupt
        blocks), which summary() leaves out too."""
        import numpy as np
        width = max([len(str(r.get("workload", ""))) for r in self.records] +
                    [len(str(r.get("allocator", ""))) for r in self.records] + [16])
        dtype = [("workload", f"U{width}"), ("allocator", f"U{width}"), ("threads", "i4"), ("round", "i4"),
                 ("ok", "?")]
        dtype += _NUM_FIELDS
        arr = np.zeros(len(self.records), dtype=dtype)
        for i, r in enumerate(self.records):
            arr[i]["workload"] = r.get("workload", "")
            arr[i]["allocator"] = r.get("allocator", "")
            arr[i]["threads"] = int(r.get("threads") or 0)
            arr[i]["round"] = int(r.get("round") or 0)
            arr[i]["ok"] = _ok(r)
            for f, kind in _NUM_FIELDS:
                v = r.get(f)
                if kind == "i8":
                    arr[i][f] = int(v) if isinstance(v, (int, float)) and not math.isnan(v) else 0
                else:
                    arr[i][f] = _num(v)
        return arr

    def to_pandas(self):
        """A pandas DataFrame of the same rows (requires pandas)."""
        import pandas as pd
        return pd.DataFrame(self.to_numpy())

    @property
    def partial(self):
        """True if the run was interrupted (Ctrl-C) before every measurement was made."""
        return bool(self.meta.get("partial"))

    # -- files --------------------------------------------------------------
    def to_dict(self):
        d = {"format": "kpool-bench", "version": FORMAT_VERSION}
        if self.partial:
            d["partial"] = True
        d.update(meta=self.meta, records=self.records)
        return d

    def save(self, path):
        """Write the run as JSON (machine, libraries, command line, every measurement)."""
        path = Path(path)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        d = self.to_dict()
        head = {k: v for k, v in d.items() if k != "records"}
        text = json.dumps(head, indent=1, default=str)[:-2]     # without the closing brace
        recs = ",\n".join(json.dumps(r, default=str) for r in d["records"])   # one record a line
        with open(path, "w") as f:
            f.write(text + ',\n "records": [\n' + recs + "\n ]\n}\n")
        return path

    def plot(self, path):
        """Save a PNG: thread scaling per workload, and ratio to system.
        Missing folders of path are created, as save() does."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        import matplotlib
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        summ = [s for s in self.summary() if s["workload"] not in MEMORY_WORKLOADS and s["ok"]]
        wls = [w for w in WORKLOADS if any(s["workload"] == w for s in summ)]
        allocs = [a for a in ALLOCATORS if any(s["allocator"] == a for s in summ)]
        allocs += sorted({s["allocator"] for s in summ} - set(allocs))
        if not wls:
            fig, ax = plt.subplots(figsize=(4, 2))
            ax.text(0.5, 0.5, "no throughput rows", ha="center")
            fig.savefig(path, dpi=100)
            plt.close(fig)
            return Path(path)
        fig, axes = plt.subplots(2, len(wls), figsize=(3.6 * len(wls), 6.4), squeeze=False)
        cores = self._cores()
        for j, w in enumerate(wls):
            ax, axr = axes[0][j], axes[1][j]
            threads = sorted({s["threads"] for s in summ if s["workload"] == w})
            for a in allocs:
                pts = [s for s in summ if s["workload"] == w and s["allocator"] == a]
                if not pts:
                    continue
                pts.sort(key=lambda s: s["threads"])
                xs = [s["threads"] for s in pts]
                ys = [s["mops_median"] for s in pts]
                lo = [s["mops_median"] - s["mops_min"] for s in pts]
                hi = [s["mops_max"] - s["mops_median"] for s in pts]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=2, label=a, color=color_of(a),
                            linestyle="--" if a == "null" else "-")
            ax.set_title(w)
            ax.set_xscale("log", base=2)
            ax.set_xticks(threads)
            ax.set_xticklabels([str(t) + ("*" if t > cores else "") for t in threads])
            ax.set_xlabel("threads (* oversubscribed)")
            if j == 0:
                ax.set_ylabel("Mops/s (median, range)")
            ax.grid(alpha=0.3)
            bars = [a for a in allocs if a not in ("system", "null")]
            width = 0.8 / max(1, len(bars))
            for k, a in enumerate(bars):
                pts = {s["threads"]: s for s in summ if s["workload"] == w and s["allocator"] == a}
                xs = [i + k * width for i, t in enumerate(threads) if t in pts]
                ys = [pts[t]["ratio_median"] for t in threads if t in pts]
                axr.bar(xs, ys, width=width, label=a, color=color_of(a))
            axr.axhline(1.0, color="k", linewidth=0.8)
            axr.set_xticks([i + 0.4 - width / 2 for i in range(len(threads))])
            axr.set_xticklabels([str(t) for t in threads])
            axr.set_xlabel("threads")
            if j == 0:
                axr.set_ylabel("ratio to system (glibc)")
            axr.grid(alpha=0.3, axis="y")
        axes[0][0].legend(fontsize=7)
        axes[1][0].legend(fontsize=7)
        m = self.meta.get("machine") or {}
        fig.suptitle(f"kpool bench: {m.get('cpu', '')}, {m.get('cores', '')} cores", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return Path(path)


# One colour per allocator in every chart: Result.plot() and every figure of
# benchmarks/analysis.ipynb take their colours from here, so an allocator
# looks the same wherever it is drawn (whatever else a figure shows, and in
# whatever order it draws the allocators). Matplotlib's tab10 colours.
PALETTE = {
    "system": "#1f77b4",
    "jemalloc": "#ff7f0e",
    "tcmalloc": "#2ca02c",
    "mimalloc": "#d62728",
    "kpool": "#9467bd",
    "kpool-mesh": "#17becf",
    "kpool-preload": "#e377c2",
    "kpool-pool": "#8c564b",
    "null": "#7f7f7f",
}
_SPARE_COLOURS = ("#bcbd22", "#aec7e8", "#98df8a")


def color_of(allocator):
    """The colour of an allocator in every chart (a matplotlib colour string):
    PALETTE's, or for a name bench does not know one of a few spare colours,
    chosen by the name (the same in every figure and every session)."""
    name = str(allocator)
    if name in PALETTE:
        return PALETTE[name]
    import zlib
    return _SPARE_COLOURS[zlib.crc32(name.encode()) % len(_SPARE_COLOURS)]


def _ok(r):
    return r.get("error") is None and not r.get("corrupt") and r.get("ops_per_sec") is not None


def _is_record(r):
    """True if r has the shape of a measurement: names as strings, counts
    as integers, figures as numbers (or missing, or None)."""
    if not isinstance(r, dict):
        return False
    names_ok = all(isinstance(r.get(k, ""), str) for k in ("workload", "allocator"))
    counts_ok = all(isinstance(r.get(k, 0), int) and not isinstance(r.get(k, 0), bool) for k in ("threads", "round"))
    figures_ok = all(r.get(f) is None or (isinstance(r[f], (int, float)) and not isinstance(r[f], bool))
                     for f, _ in _NUM_FIELDS)
    return names_ok and counts_ok and figures_ok


def load(path):
    """Read a run written by Result.save(). ValueError for a file that is
    not one: not JSON, records that are not measurements, a newer format
    version than this kpool reads."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):
        data = {"records": data}
    if not isinstance(data, dict) or data.get("format") not in (None, "kpool-bench") or "records" not in data:
        raise ValueError(f"{path}: not a kpool bench run")
    version = data.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise ValueError(f"{path}: format version {version!r}; this kpool reads versions 1..{FORMAT_VERSION}")
    records, meta = data["records"], data.get("meta", {})
    if not isinstance(records, list) or not all(_is_record(r) for r in records):
        raise ValueError(f"{path}: its records are not a list of measurements")
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k, {}), dict)
                                             for k in ("machine", "libraries", "params", "unavailable")):
        raise ValueError(f"{path}: its meta is not a kpool bench run's")
    if meta.get("kind") == "real":
        raise ValueError(f"{path}: a real-program run (python -m kpool bench --real), not a kpool-stress run")
    if data.get("partial"):
        meta = dict(meta, partial=True)
    res = Result(records, meta)
    res.path = Path(path)
    return res


def saved_runs(folder):
    """Every run saved in folder (*.json), oldest first by the date recorded
    in the run itself (file times say nothing in a fresh clone), then by
    file name. Files that are not runs are skipped."""
    runs = []
    for p in sorted(Path(folder).glob("*.json")):
        try:
            runs.append(load(p))
        except (OSError, ValueError):
            continue
    runs.sort(key=lambda r: (r.date, r.path.name))
    return runs


def newest_run(runs, workloads=()):
    """The newest of runs (as saved_runs orders them) that measured every one
    of workloads; None if none did."""
    need = {str(w) for w in workloads}
    for r in reversed(list(runs)):
        if need <= r.measured():
            return r
    return None


def comparable_runs(runs):
    """(old, new) for compare(): two runs that measured the same workloads
    at the same thread counts, the newest such pair (new: the newest run
    that has such an older one; old: the newest of those); None when no two
    runs did. Runs ordered as saved_runs orders them."""
    runs = list(runs)
    for i in range(len(runs) - 1, 0, -1):
        new = runs[i]
        key = new.measured_threads()
        for old in reversed(runs[:i]):
            if old.measured_threads() == key:
                return old, new
    return None


def compare(old, new):
    """Markdown comparing two runs (Result or path): median Mops/s and ratio
    to system, old -> new, per workload x threads x allocator."""
    if not isinstance(old, Result):
        old = load(old)
    if not isinstance(new, Result):
        new = load(new)
    o = {(s["workload"], s["threads"], s["allocator"]): s for s in old.summary()}
    lines = ["| workload | threads | allocator | old Mops/s | new Mops/s | change | old x system | new x system |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for s in new.summary():
        if s["workload"] in MEMORY_WORKLOADS:
            continue
        p = o.get((s["workload"], s["threads"], s["allocator"]))
        if not p:
            continue
        ch = (s["mops_median"] / p["mops_median"] - 1) * 100 if p["mops_median"] else math.nan
        lines.append(f"| {s['workload']} | {new._tlabel(s['threads'])} | {s['allocator']} | "
                     f"{_fmt(p['mops_median'])} | {_fmt(s['mops_median'])} | {_fmt(ch, 1)}% | "
                     f"{_fmt(p['ratio_median'], 2)} | {_fmt(s['ratio_median'], 2)} |")
    od, nd = (old.meta.get("machine") or {}).get("date"), (new.meta.get("machine") or {}).get("date")
    if len(lines) == 2:
        return (f"Compared: old {od} -> new {nd}: the runs have no workload x threads x allocator in common "
                "(nothing to compare)\n")
    return f"Compared: old {od} -> new {nd}\n\n" + "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------
def _unique(items):
    """items without repeats, in their first order: a name given twice is
    measured once (twice would count as two rounds, and the baseline of a
    round would be whichever system record came last)."""
    return list(dict.fromkeys(items))


def _as_list(x, default):
    if x is None:
        return list(default)
    if isinstance(x, (str, int)):
        return [x]
    return list(x)


class _Progress:
    def __init__(self, total, enabled):
        self.total, self.n, self.enabled, self.bar = total, 0, enabled, None
        self.t0 = time.monotonic()
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, file=sys.stderr, unit="run", leave=False, dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def step(self, label):
        self.n += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description(label, refresh=False)
            self.bar.update(1)
        else:
            el = time.monotonic() - self.t0
            sys.stderr.write(f"\r[{self.n}/{self.total}] {el:5.0f}s {label:<40.40}")
            sys.stderr.flush()

    def close(self):
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _measure(exe, alloc, workload, threads, ops, seed, verify, size, burst_bytes, timeout):
    cmd = [str(exe), "--workload", workload, "--allocator", alloc.driver, "--threads", str(threads),
           "--ops", str(ops), "--seed", str(seed), "--verify" if verify else "--no-verify"]
    if workload == "pairs" and size:
        cmd += ["--size", str(size)]
    if workload == "burst" and burst_bytes:
        cmd += ["--burst-bytes", str(burst_bytes)]
    preload = alloc.library if alloc.kind == "peer" else None
    mesh = alloc.name in MESH_ALLOCATORS
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_child_env(preload, mesh))
        rc, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired:
        rc, stdout, stderr = None, "", f"timed out after {timeout} s"
    wall = time.monotonic() - t0
    rec = None
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            rec = json.loads(line)
            break
        except ValueError:
            continue
    if rec is None:
        rec = {"workload": workload, "threads": threads, "ops": 0, "seconds": None, "ops_per_sec": None,
               "corrupt": 0, "error": (stderr or "").strip()[:300] or f"kpool-stress exit {rc}"}
    rec["driver_allocator"] = rec.get("allocator", alloc.driver)
    rec["allocator"] = alloc.name
    rec["returncode"] = rc
    rec["wall_seconds"] = round(wall, 4)
    rec["command"] = ((f"LD_PRELOAD={preload} " if preload else "") + ("KPOOL_MESH=1 " if mesh else "")
                      + shlex.join(cmd))
    if preload:
        used = rec.get("malloc_library")
        if used and os.path.realpath(used) != os.path.realpath(preload) and rec.get("error") is None:
            rec["error"] = f"LD_PRELOAD of {preload} did not take (malloc from {used})"
    if rc == 3 and not rec.get("error"):
        rec["error"] = "corruption found"
    if rc not in (0, 3) and rec.get("error") is None:
        rec["error"] = (stderr or "").strip()[:300] or f"kpool-stress exit {rc}"
    return rec


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C during run(): .result holds the measurements made until then
    (a Result with partial=True; meta says how many of how many)."""

    def __init__(self, result):
        super().__init__("kpool bench interrupted: %d of %d measurements made" % (
            result.meta.get("measured", len(result)), result.meta.get("planned", len(result))))
        self.result = result


def _int_arg(name, value):
    """value as an int: an integer (anything with __index__), else TypeError;
    a float or a string is not silently truncated or parsed."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None


def run(workloads=None, allocators=None, threads=None, ops=None, repeat=None, *, rounds=None, seed=1,
        verify=False, size=32, burst_bytes=None, memory_rounds=None, timeout=300.0, progress=False,
        stress=None, command=None):
    """Run the benchmark and return a Result.

    workloads   names (default MAIN_WORKLOADS + MEMORY_WORKLOADS)
    allocators  names (default every available one); unavailable ones are
                skipped and listed in result.meta["unavailable"]
    threads     thread counts (default 1, 2, 8); burst and frag run with 1
                unless given explicitly with memory workloads only
    ops         ops per measurement over all threads: an int for every
                workload, or a dict workload -> ops (default DEFAULT_OPS)
    repeat      rounds (alias rounds=; default 5); memory workloads run
                min(repeat, memory_rounds) rounds (default 2)
    burst_bytes total bytes for burst (default 1 GiB)
    progress    show progress on stderr (tqdm if installed)
    stress      path of kpool-stress (default find_stress())

    Ctrl-C raises BenchInterrupted (a KeyboardInterrupt) whose .result has
    the measurements already made, marked partial.
    """
    exe = Path(stress) if stress else find_stress()
    if exe is None or not Path(exe).is_file():
        raise FileNotFoundError("kpool-stress not found: install kpool, build csrc/ (make -C csrc), "
                                "or set KPOOL_STRESS")
    wls = _unique(str(w) for w in _as_list(workloads, MAIN_WORKLOADS + MEMORY_WORKLOADS))
    if not wls:
        raise ValueError("no workloads to run")
    for w in wls:
        if w not in WORKLOADS:
            raise ValueError(f"unknown workload {w!r}; one of {', '.join(WORKLOADS)}")
    known = {a.name: a for a in globals()["allocators"]()}
    names = _unique(str(a) for a in _as_list(allocators, [a for a in ALLOCATORS if known[a].available]))
    if not names:
        raise ValueError("no allocators to run")
    for a in names:
        if a not in known:
            raise ValueError(f"unknown allocator {a!r}; one of {', '.join(ALLOCATORS)}")
    unavailable = {a: known[a].reason for a in names if not known[a].available}
    if allocators is None:
        unavailable.update({a.name: a.reason for a in known.values() if not a.available})
    allocs = [known[a] for a in names if known[a].available]
    if rounds is not None:
        repeat = rounds
    repeat = DEFAULT_ROUNDS if repeat is None else _int_arg("repeat", repeat)
    if not 1 <= repeat <= MAX_ROUNDS:
        raise ValueError(f"repeat (rounds) must be in 1..{MAX_ROUNDS}")
    tlist = _unique(_int_arg("threads", t) for t in _as_list(threads, DEFAULT_THREADS))
    if not tlist or any(t < 1 or t > STRESS_MAX_THREADS for t in tlist):
        raise ValueError(f"thread counts must be 1..{STRESS_MAX_THREADS} (kpool-stress's limit)")
    if isinstance(ops, dict):
        opsmap = {**DEFAULT_OPS, **{str(k): _int_arg("ops", v) for k, v in ops.items()}}
    elif ops is None:
        opsmap = dict(DEFAULT_OPS)
    else:
        opsmap = {w: _int_arg("ops", ops) for w in WORKLOADS}
    if any(v < 1 or v >= 1 << 64 for v in opsmap.values()):
        raise ValueError("ops must be in 1..2**64-1")
    burst_bytes = DEFAULT_BURST_BYTES if burst_bytes is None else _int_arg("burst_bytes", burst_bytes)
    mem_rounds = min(repeat, MEMORY_ROUNDS if memory_rounds is None else _int_arg("memory_rounds", memory_rounds))
    seed = _int_arg("seed", seed)
    if seed < 0 or seed + repeat > 1 << 64:
        raise ValueError("seed must be in 0..2**64-repeat (round r runs with seed + r)")
    if size is not None:
        size = _int_arg("size", size)
        if size < 1:
            raise ValueError("size must be >= 1 (None: the driver's 32 bytes)")
    if burst_bytes < 1 or mem_rounds < 1:
        raise ValueError("burst_bytes and memory_rounds must be >= 1")
    only_memory = all(w in MEMORY_WORKLOADS for w in wls)
    mem_threads = tlist if (threads is not None and only_memory) else [1]

    # the plan: rounds outermost, allocators rotated within each round
    plan = []
    for rnd in range(repeat):
        for w in wls:
            mem = w in MEMORY_WORKLOADS
            if mem and rnd >= mem_rounds:
                continue
            cand = [a for a in allocs if (a.name != "kpool-pool" or w in ONE_SIZE_WORKLOADS)
                    and not (mem and a.name == "null")]
            if not cand:
                continue
            for t in (mem_threads if mem else tlist):
                k = rnd % len(cand)
                for pos, a in enumerate(cand[k:] + cand[:k]):
                    plan.append((rnd, pos, w, t, a))

    if not plan:
        raise ValueError("nothing to run: no allocator given applies to the workloads given "
                         "(kpool-pool runs pairs only; null runs no memory workload)")

    meta = {
        "machine": machine_info(),
        "command": command if command is not None else shlex.join([os.path.basename(sys.executable)] + sys.argv),
        "stress": str(exe),
        "params": {"workloads": wls, "allocators": [a.name for a in allocs], "threads": tlist,
                   "memory_threads": mem_threads, "ops": {w: opsmap[w] for w in wls}, "rounds": repeat,
                   "memory_rounds": mem_rounds, "seed": seed, "verify": bool(verify), "size": size,
                   "burst_bytes": burst_bytes},
        "libraries": {a.name: {"library": a.library, "version": a.version, "driver": a.driver} for a in allocs},
        "unavailable": unavailable,
    }
    records = []
    bar = _Progress(len(plan), bool(progress))
    t0 = time.monotonic()
    interrupted = False
    try:
        for rnd, pos, w, t, a in plan:
            bar.step(f"{w} t={t} {a.name} r{rnd + 1}")
            rec = _measure(exe, a, w, t, opsmap[w], seed + rnd, verify, size, burst_bytes, timeout)
            rec["round"] = rnd
            rec["order"] = pos
            rec["library"] = a.library
            records.append(rec)
    except KeyboardInterrupt:
        # Ctrl-C at a terminal reaches kpool-stress too: a measurement it cut
        # short ("stopped") is not a measurement
        interrupted = True
        records = [r for r in records if not r.get("stopped")]
    finally:
        bar.close()
    meta["elapsed_seconds"] = round(time.monotonic() - t0, 2)
    if not meta["machine"].get("kpool"):
        meta["machine"]["kpool"] = next((r["kpool_version"] for r in records if r.get("kpool_version")), None)
    if interrupted:
        meta.update(partial=True, measured=len(records), planned=len(plan),
                    rounds_completed=_rounds_completed(plan, records))
        raise BenchInterrupted(Result(records, meta))
    return Result(records, meta)


def _rounds_completed(plan, records):
    """How many rounds of the plan have every one of their measurements in records."""
    done = {(r.get("round"), r.get("workload"), r.get("threads"), r.get("allocator")) for r in records}
    complete = 0
    for rnd in sorted({p[0] for p in plan}):
        if all((p[0], p[2], p[3], p[4].name) in done for p in plan if p[0] == rnd):
            complete += 1
        else:
            break
    return complete


# ---------------------------------------------------------------------------
# Command line: python -m kpool bench [...]
# ---------------------------------------------------------------------------
def _csv(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def _int_csv(s):
    """--threads: a comma list of integers (argparse reports a bad one)."""
    import argparse
    try:
        return [int(x) for x in _csv(s)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {s!r}") from None


def main(argv=None):
    """``python -m kpool bench``: run the comparison and print the table.
    Ctrl-C at any point exits 130 (after a measurement has begun: with what
    was measured shown and saved, marked partial)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("kpool bench: interrupted before any measurement", file=sys.stderr)
        return 130


def _main(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--real" in argv:
        from . import _bench_real as bench_real
        return bench_real.main([x for x in argv if x != "--real"])
    import argparse
    p = argparse.ArgumentParser(prog="python -m kpool bench",
                                description="Benchmark kpool against glibc, jemalloc, tcmalloc and mimalloc.")
    p.add_argument("--workloads", type=_csv, help=f"comma list (default {','.join(WORKLOADS)})")
    p.add_argument("--allocators", type=_csv, help="comma list (default: every available one)")
    p.add_argument("--threads", type=_int_csv, help="comma list of thread counts (default 1,2,8)")
    p.add_argument("--ops", type=int, help="ops per measurement for every workload (default per workload)")
    p.add_argument("--rounds", type=int, help=f"rounds (default {DEFAULT_ROUNDS}; --quick 3)")
    p.add_argument("--burst-bytes", type=int, help="bytes for burst (default 1 GiB; --quick 128 MiB)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--verify", action="store_true", help="stamp and check every block (slower)")
    p.add_argument("--quick", action="store_true", help="a short run (under 20 s)")
    p.add_argument("--save", metavar="PATH", help="write the run as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of thread scaling and ratios")
    p.add_argument("--compare", metavar="OLD.json", help="compare with a saved run")
    p.add_argument("--load", metavar="RUN.json", help="do not run: show a saved run")
    p.add_argument("--list", action="store_true", help="list workloads and allocators and exit")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--real", action="store_true",
                   help="real programs instead (python, sqlite3, gcc, git): python -m kpool bench --real --help")
    a = p.parse_args(argv)

    if a.list:
        print("workloads:")
        for w in workloads():
            print(f"  {w:<10} {w.description}")
        print("allocators:")
        for al in allocators():
            state = "available" if al.available else f"unavailable: {al.reason}"
            print(f"  {al:<10} {state}" + (f" ({al.version})" if al.available and al.version else ""))
        return 0

    if a.plot and not a.plot.lower().endswith(".png"):
        print(f"kpool bench: --plot writes a PNG: give a path ending in .png, not {a.plot!r}", file=sys.stderr)
        return 2
    old_run = None
    try:
        if a.compare:                 # read it before a long run, not after
            old_run = load(a.compare)
        if a.load:
            res = load(a.load)
    except (OSError, ValueError) as e:
        which = a.compare if old_run is None and a.compare else a.load
        print(f"kpool bench: cannot read {which}: {_why(e)}", file=sys.stderr)
        return 2
    if not a.load:
        threads = a.threads or None
        ops, rounds, burst = a.ops, a.rounds, a.burst_bytes
        if a.quick:   # what was given stays (0 included: run() refuses it)
            only_memory = a.workloads is not None and all(w in MEMORY_WORKLOADS for w in a.workloads)
            if threads is None and not only_memory:
                threads = [1, 2]
            rounds = 3 if rounds is None else rounds
            ops = {w: max(1, v // 10) for w, v in DEFAULT_OPS.items()} if ops is None else ops
            burst = (128 << 20) if burst is None else burst
        mem_rounds = 1 if a.quick else None
        try:
            res = run(workloads=a.workloads, allocators=a.allocators, threads=threads, ops=ops, repeat=rounds,
                      seed=a.seed, verify=a.verify, burst_bytes=burst, memory_rounds=mem_rounds,
                      progress=not a.no_progress,
                      command=shlex.join(["python", "-m", "kpool", "bench"] + list(argv if argv is not None
                                                                                    else sys.argv[1:])))
        except BenchInterrupted as e:
            # Ctrl-C: keep what was measured, show it, save it marked partial, exit 130
            res = e.result
            print(f"kpool bench: interrupted: {res.meta['measured']} of {res.meta['planned']} measurements made "
                  f"({res.meta['rounds_completed']} complete rounds); showing and saving those, marked partial",
                  file=sys.stderr)
        except (ValueError, FileNotFoundError) as e:
            print(f"kpool bench: {e}", file=sys.stderr)
            return 2
    m = res.meta.get("machine") or {}
    print(f"kpool bench: {m.get('cpu')} ({m.get('cores')} cores), Linux {m.get('kernel')}, "
          f"Python {m.get('python')}, {m.get('glibc')}, kpool {m.get('kpool')}")
    libs = res.meta.get("libraries") or {}
    peers = [f"{k} {v.get('version')}" for k, v in libs.items() if v.get("library")]
    if peers:
        print("peers: " + "; ".join(peers))
    if res.meta.get("command"):
        print(f"command: {res.meta['command']}")
    if res.partial:
        print(f"PARTIAL: interrupted after {res.meta.get('measured')} of {res.meta.get('planned')} measurements "
              f"({res.meta.get('rounds_completed')} complete rounds)")
    print()
    print(res.table())
    targets = res.targets_table()
    if targets:
        print(targets)
    status = 0
    if a.save:
        try:
            res.save(a.save)
            print(f"saved: {a.save}")
        except OSError as e:
            print(f"kpool bench: cannot write {a.save}: {_why(e)}", file=sys.stderr)
            status = 1
    if a.plot:
        try:
            res.plot(a.plot)
            print(f"plot: {a.plot}")
        except ImportError as e:
            print(f"kpool bench: --plot needs matplotlib ({e})", file=sys.stderr)
            status = 1
        except OSError as e:
            print(f"kpool bench: cannot write {a.plot}: {_why(e)}", file=sys.stderr)
            status = 1
    if old_run is not None:
        print()
        print(compare(old_run, res))
    bad = [r for r in res.records if r.get("corrupt")]
    if res.partial and not a.load:
        return 130   # as a shell reports a program ended by SIGINT
    return 3 if bad else status


def _why(e):
    """An exception as one line, without the file name an OSError repeats."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return " ".join(str(e).split()) or type(e).__name__
