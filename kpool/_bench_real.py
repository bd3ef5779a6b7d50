"""Real programs under each allocator: ``python -m kpool bench --real``.

The same binaries (this Python, sqlite3, gcc, git, redis-server) run with
only LD_PRELOAD differing: nothing (glibc's malloc), jemalloc, tcmalloc,
mimalloc, and kpool (libkpool-malloc.so). Each run's wall time and peak RSS
are measured (see PEAK RSS below), and its output is compared with glibc's: a run whose output differs is an
error, not a time.

Rounds are interleaved: every round runs every workload under every
allocator, in an order that rotates from round to round, so drift on the
machine spreads over all of them. The table gives the median and the range
over rounds, and kpool's ratio to the best peer (time and peak RSS).

PEAK RSS is ru_maxrss of the measured process: for a workload that is a
shell pipeline or spawns children (git gc), the largest single process. For
redis it is the server's VmHWM; redis-benchmark runs under glibc against it.
Debian's redis-server is linked with libjemalloc and calls plain malloc and
free, which LD_PRELOAD hands to the allocator measured; its "glibc" column is
therefore redis on jemalloc, as Debian ships it (no preload).
"""

import hashlib
import json
import os
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import bench as _bench

ALLOCATORS = ("glibc", "jemalloc", "tcmalloc", "mimalloc", "kpool")
PEERS = ("glibc", "jemalloc", "tcmalloc", "mimalloc")

# ---------------------------------------------------------------------------
# workloads: each has a size for the default run and one for --quick
# ---------------------------------------------------------------------------
_JSON_SCRIPT = r"""
import json, sys
n = int(sys.argv[1])
data = [{"id": i, "name": "user%d" % i, "score": i * 0.25, "tags": ["t%d" % (i % 13), "x" * (i % 40)],
         "nested": {"a": [i, i + 1, i + 2], "b": None, "c": i % 3 == 0}} for i in range(n)]
total = 0
for _ in range(3):
    text = json.dumps(data)
    back = json.loads(text)
    total += len(text) + len(back)
print(total)
"""

_AST_SCRIPT = r"""
import ast, os, sys, sysconfig
root = sysconfig.get_paths()["stdlib"]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) if "test" not in d and "site-packages" not in d
               for f in fs if f.endswith(".py"))[: int(sys.argv[1])]
nodes = 0
for path in files:
    try:
        src = open(path, encoding="utf-8").read()
        tree = ast.parse(src)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        continue
    nodes += sum(1 for _ in ast.walk(tree))
print(len(files), nodes)
"""


def _python(script, n):
    return {"args": [sys.executable, "-c", script, str(n)], "env": {"PYTHONMALLOC": "malloc"}}


def _sqlite(rows):
    sql = (f"create table t(id integer primary key, k text, v real, note text);"
           f"with recursive c(x) as (select 1 union all select x + 1 from c limit {rows})"
           f" insert into t(k, v, note) select printf('key%08d', (x * 7919) % {rows}), x * 0.5,"
           f" substr('abcdefghijklmnopqrstuvwxyz', 1 + x % 26) from c;"
           f"create index tk on t(k); create index tv on t(v, note);"
           f"select count(*), sum(v) from t where k between 'key00100000' and 'key00500000';"
           f"select note, count(*), avg(v) from t group by note order by 3 desc limit 3;"
           f"select count(*) from t a join t b on a.k = b.k where a.id % 100 = 0;"
           f"delete from t where id % 4 = 0; pragma integrity_check;")
    return {"args": ["sqlite3", ":memory:", sql], "env": {}}


def _gcc_source(work, functions):
    path = work / f"big{functions}.c"
    if not path.exists():
        parts = ["#include <string.h>\n"]
        for i in range(functions):
            parts.append(
                f"struct s{i} {{ int a[{i % 17 + 1}]; double d; char name[{i % 29 + 3}]; }};\n"
                f"int f{i}(struct s{i} *p, int n) {{ int acc = {i};\n"
                f"  for (int k = 0; k < n; k++) {{ acc += p->a[k % {i % 17 + 1}] * (k ^ {i});\n"
                f"    if (acc > {i * 7 + 1000}) acc -= (int)p->d; else acc ^= (int)strlen(p->name); }}\n"
                f"  switch (n & 7) {{ case 0: return acc; case 1: return acc + 1; case 2: return acc * 3;\n"
                f"  default: return acc - n; }} }}\n")
        parts.append("int main(void) { return 0; }\n")
        path.write_text("".join(parts))
    return path


def _gcc(work, functions):
    src = _gcc_source(work, functions)
    return {"args": ["gcc", "-O2", "-c", str(src), "-o", "/dev/null"], "env": {}}


_REPACK = ["repack", "-a", "-d", "-f", "-q", "--window=50"]


def _git_repo(work, commits):
    repo = work / f"repo{commits}"
    if not (repo / ".git").exists():
        env = dict(os.environ, GIT_AUTHOR_NAME="k", GIT_AUTHOR_EMAIL="k@example.com", GIT_COMMITTER_NAME="k",
                   GIT_COMMITTER_EMAIL="k@example.com", GIT_AUTHOR_DATE="2026-01-01T00:00:00",
                   GIT_COMMITTER_DATE="2026-01-01T00:00:00")
        env.pop("LD_PRELOAD", None)
        repo.mkdir(parents=True)
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
        # one fast-import stream: many commits touching a handful of files each
        lines = []
        contents = {f"src/file{k}.c": [f"line {j} of file {k}\n" for j in range(200)] for k in range(60)}
        for c in range(commits):
            lines.append(f"commit refs/heads/main\nmark :{c + 1}\ncommitter k <k@example.com> {1767225600 + c} +0000\n")
            msg = f"change {c}\n"
            lines.append(f"data {len(msg)}\n{msg}")
            if c:
                lines.append(f"from :{c}\n")
            for k in range(3):
                name = f"src/file{(c * 7 + k * 13) % 60}.c"
                body = contents[name]
                body[(c * 31 + k) % len(body)] = f"edited in {c}: {'x' * (c % 50)}\n"
                if c % 5 == 0:
                    body.append(f"appended in {c}\n")
                data = "".join(body)
                lines.append(f"M 100644 inline {name}\ndata {len(data.encode())}\n{data}\n")
        stream = "".join(lines).encode()
        subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=stream, check=True, env=env)
        subprocess.run(["git", "checkout", "-q", "main"], cwd=repo, check=True, env=env)
        # Pack it once, untimed: `repack -a -d -f` rewrites the packs, so
        # without this the first allocator to run would log and repack a
        # different repository (fast-import's pack) from all the others.
        subprocess.run(["git", *_REPACK], cwd=repo, check=True, env=env)
    return repo


def _git_log(work, commits):
    repo = _git_repo(work, commits)
    return {"args": ["git", "-C", str(repo), "log", "--stat", "-M", "--format=%H %s"], "env": {}}


def _git_repack(work, commits):
    repo = _git_repo(work, commits)
    return {"args": ["git", "-C", str(repo), *_REPACK], "env": {},
            "output": "none"}


def _redis(work, requests):
    sock = str(work / "redis.sock")
    return {
        "kind": "server",
        "args": ["redis-server", "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
                 "--daemonize", "no", "--dir", str(work)],
        "socket": sock,
        "client": ["redis-benchmark", "-s", sock, "-n", str(requests), "-q", "-c", "8", "-d", "200",
                   "-r", "200000", "-t", "set,get,lpush,lpop,sadd,hset,lrange_100"],
        "env": {},
        "output": "none",
    }


# name: (description, needs, maker(work, size), default size, quick size)
WORKLOADS = {
    "json": ("Python: json.dumps + json.loads of a list of dicts, 3 times (PYTHONMALLOC=malloc)", None,
             lambda w, n: _python(_JSON_SCRIPT, n), 120_000, 20_000),
    "ast": ("Python: ast.parse + ast.walk of stdlib modules (PYTHONMALLOC=malloc)", None,
            lambda w, n: _python(_AST_SCRIPT, n), 400, 60),
    "sqlite": ("sqlite3 shell: rows into a table, two indexes, range, group-by, self-join, delete, "
               "integrity_check (in memory)", "sqlite3", lambda w, n: _sqlite(n), 400_000, 30_000),
    "gcc": ("gcc -O2 -c of a generated C file of N functions", "gcc", _gcc, 3000, 300),
    "git-log": ("git log --stat -M on a generated repository of N commits", "git", _git_log, 6000, 600),
    "git-repack": ("git repack -a -d -f on that repository", "git", _git_repack, 6000, 600),
    "redis": ("redis-server under the allocator, redis-benchmark (set, get, lpush, lpop, sadd, hset, lrange) "
              "against it over a unix socket: the time is the client's, the peak RSS the server's", "redis-server",
              _redis, 200_000, 20_000),
}


def allocator_libraries():
    """{name: LD_PRELOAD value or None for glibc} for the allocators present,
    and {name: why not} for the others."""
    have, missing = {"glibc": None}, {}
    for al in _bench.allocators(probe=False):
        if al.name in ("jemalloc", "tcmalloc", "mimalloc"):
            if al.available:
                have[al.name] = al.library
            else:
                missing[al.name] = al.reason
    lib = _bench.find_preload()
    if lib:
        have["kpool"] = str(lib)
    else:
        missing["kpool"] = "libkpool-malloc.so not found (install the package or build csrc/)"
    return have, missing


_MEASURE = r"""
import json, os, subprocess, sys, time
spec = json.loads(sys.argv[1])
t0 = time.monotonic()
p = subprocess.Popen(spec["args"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=spec["env"], cwd=spec["cwd"])
out, err = p.communicate()
wall = time.monotonic() - t0
import resource
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
import hashlib
print(json.dumps({"seconds": wall, "returncode": p.returncode, "peak_rss": ru.ru_maxrss * 1024,
                  "minor_faults": ru.ru_minflt, "user": ru.ru_utime, "sys": ru.ru_stime,
                  "stdout_sha": hashlib.sha256(out).hexdigest(), "stdout_head": out[:200].decode(errors="replace"),
                  "stderr_tail": err[-500:].decode(errors="replace")}))
"""


def _program_env(cmd, preload):
    """The measured program's environment: this one without kpool's or a
    preload's settings, plus the workload's own, plus the allocator's preload."""
    env = _bench._child_env(preload)
    env.update(cmd.get("env") or {})
    return env


def _measure_server(cmd, preload, cwd, timeout):
    """A server under the allocator, a client (plain) against it: the client's
    wall time, the server's peak RSS (VmHWM) read before it is stopped."""
    env = _program_env(cmd, preload)
    sock = Path(cmd["socket"])
    if sock.exists():
        sock.unlink()
    server = subprocess.Popen(cmd["args"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                err = server.stderr.read().decode(errors="replace")[-300:] if server.stderr else ""
                return {"seconds": None, "peak_rss": None, "error": f"server did not start: {err}"}
            time.sleep(0.02)
        clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "KPOOL_STATS")}
        t0 = time.monotonic()
        client = subprocess.run(cmd["client"], capture_output=True, timeout=timeout, env=clean, cwd=cwd)
        wall = time.monotonic() - t0
        peak = None
        with open(f"/proc/{server.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
        alive = server.poll() is None
    except subprocess.TimeoutExpired:
        return {"seconds": None, "peak_rss": None, "error": f"timed out after {timeout} s"}
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    rec = {"seconds": wall, "returncode": client.returncode, "peak_rss": peak,
           "stdout_sha": hashlib.sha256(b"").hexdigest(), "stdout_head": client.stdout[:200].decode(errors="replace"),
           "stderr_tail": client.stderr[-500:].decode(errors="replace")}
    if client.returncode != 0:
        rec["error"] = f"client exit {client.returncode}: {rec['stderr_tail'][-200:]}"
    elif not alive:
        rec["error"] = "the server died during the run"
    return rec


def _measure(cmd, preload, cwd, timeout):
    """One run, in a fresh helper process whose only child is the program:
    its RUSAGE_CHILDREN is that program's (largest process's) peak RSS."""
    env = _program_env(cmd, preload)
    spec = json.dumps({"args": cmd["args"], "env": env, "cwd": str(cwd)})
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "KPOOL_STATS", "PYTHONMALLOC")}
    try:
        p = subprocess.run([sys.executable, "-c", _MEASURE, spec], capture_output=True, text=True, timeout=timeout,
                           env=clean)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "peak_rss": None, "error": f"timed out after {timeout} s"}
    try:
        rec = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"seconds": None, "peak_rss": None, "error": (p.stderr or "no result")[-300:]}
    if rec["returncode"] != 0:
        rec["error"] = f"exit {rec['returncode']}: {rec['stderr_tail'][-200:]}"
    return rec


def check_outputs(records, unchecked=()):
    """Mark each run whose output differs from glibc's in the same round as
    an error (workloads in unchecked print nothing to compare)."""
    for rec in records:
        if rec.get("error") or rec["workload"] in unchecked or rec["allocator"] == "glibc":
            continue
        ref = next((x for x in records if x["workload"] == rec["workload"] and x["allocator"] == "glibc"
                    and x["round"] == rec["round"] and not x.get("error")), None)
        if ref and ref["stdout_sha"] != rec["stdout_sha"]:
            rec["error"] = "output differs from glibc's"


def run(workloads=None, allocators=None, rounds=3, quick=False, timeout=600.0, progress=True, work=None):
    """Run the real-program benchmark; return a dict (meta, records) that
    save() writes and table() prints."""
    have, missing = allocator_libraries()
    names = [a for a in (allocators or ALLOCATORS)]
    unknown = [a for a in names if a not in ALLOCATORS]
    if unknown:
        raise ValueError(f"unknown allocator(s) {', '.join(unknown)} (one of {', '.join(ALLOCATORS)})")
    unavailable = {a: missing[a] for a in names if a not in have}
    names = [a for a in names if a in have]
    wl = list(workloads or WORKLOADS)
    bad = [w for w in wl if w not in WORKLOADS]
    if bad:
        raise ValueError(f"unknown workload(s) {', '.join(bad)} (one of {', '.join(WORKLOADS)})")
    skipped = {}
    for w in list(wl):
        need = WORKLOADS[w][1]
        if need and shutil.which(need) is None or (w == "redis" and shutil.which("redis-benchmark") is None):
            skipped[w] = f"{need} not installed"
            wl.remove(w)
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="kpool-real-")
        work = tmp.name
    work = Path(work)
    records = []
    t0 = time.monotonic()
    try:
        cmds = {}
        for w in wl:
            desc, _, maker, size, qsize = WORKLOADS[w]
            cmds[w] = maker(work, qsize if quick else size)
            cmds[w]["size"] = qsize if quick else size
        total = rounds * len(wl) * len(names)
        done = 0
        for r in range(rounds):
            for w in wl:
                order = names[r % len(names):] + names[:r % len(names)]
                for a in order:
                    measure = _measure_server if cmds[w].get("kind") == "server" else _measure
                    rec = measure(cmds[w], have[a], work, timeout)
                    rec.update(workload=w, allocator=a, round=r, size=cmds[w]["size"], library=have[a])
                    records.append(rec)
                    done += 1
                    if progress:
                        s = rec.get("seconds")
                        print(f"\r[{done}/{total}] {w:<10} {a:<9} " + (f"{s:6.2f} s" if s else "error"),
                              end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
    finally:
        if tmp is not None:
            tmp.cleanup()
    check_outputs(records, [w for w, c in cmds.items() if c.get("output") == "none"])
    meta = {
        "kind": "real",
        "machine": _bench.machine_info(),
        "rounds": rounds, "quick": quick,
        "allocators": names, "unavailable": unavailable, "skipped_workloads": skipped,
        "libraries": {a: have[a] for a in names},
        "commands": {w: shlex.join(c["args"]) for w, c in cmds.items()},
        "workloads": {w: WORKLOADS[w][0] for w in wl},
        "elapsed_seconds": round(time.monotonic() - t0, 1),
    }
    return {"meta": meta, "records": records}


def _median(xs):
    return _bench._median(xs)


def _summary(res, w, a, key):
    vals = [r[key] for r in res["records"] if r["workload"] == w and r["allocator"] == a
            and not r.get("error") and r.get(key) is not None]
    if not vals:
        return None
    return _median(vals), min(vals), max(vals)


def _table_rows(res, key, cell):
    """One row per workload: each allocator's cell(median, min, max) of key,
    then the best peer's median over kpool's."""
    names = res["meta"]["allocators"]
    peers = [a for a in names if a in PEERS]
    rows = []
    for w in res["meta"]["workloads"]:
        row = f"{w:<11}"
        for a in names:
            s = _summary(res, w, a, key)
            row += f"{'error':>19}" if s is None else cell(*s).rjust(19)
        if "kpool" in names and peers:
            k = _summary(res, w, "kpool", key)
            best = [b[0] for b in (_summary(res, w, p, key) for p in peers) if b]
            row += f"{min(best) / k[0]:>15.2f}x" if k and best else f"{'-':>16}"
        rows.append(row)
    return rows


def table(res):
    """The table: per workload, each allocator's median seconds [range] and
    peak RSS, and kpool's ratios to the best peer (above 1: kpool faster /
    smaller)."""
    meta = res["meta"]
    names = meta["allocators"]
    head = f"{'workload':<11}" + "".join(f"{a:>19}" for a in names)
    if "kpool" in names and any(a in PEERS for a in names):
        head += f"{'kpool vs best':>16}"
    lines = ["time, seconds: median [min-max] over %d rounds" % meta["rounds"], head]
    lines += _table_rows(res, "seconds", lambda m, lo, hi: f"{m:>7.2f} [{lo:.2f}-{hi:.2f}]")
    lines += ["", "peak RSS, MB: median [min-max]", head]
    lines += _table_rows(res, "peak_rss", lambda m, lo, hi: f"{m / 1e6:>7.1f} [{lo / 1e6:.0f}-{hi / 1e6:.0f}]")
    errors = [f"  {r['workload']} under {r['allocator']}, round {r['round']}: {r['error']}"
              for r in res["records"] if r.get("error")]
    lines.append("")
    lines.append("kpool vs best: the best peer's median over kpool's (time, or peak RSS); above 1.00x kpool is ahead")
    for a, why in meta.get("unavailable", {}).items():
        lines.append(f"unavailable: {a}: {why}")
    for w, why in meta.get("skipped_workloads", {}).items():
        lines.append(f"skipped: {w}: {why}")
    if errors:
        lines.append("errors:")
        lines += errors
    return "\n".join(lines)


def save(res, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m kpool bench --real",
                                description="Real programs under glibc, jemalloc, tcmalloc, mimalloc and kpool "
                                            "(LD_PRELOAD), same binaries, interleaved rounds.")
    p.add_argument("--workloads", type=_bench._csv, help=f"comma list (default {','.join(WORKLOADS)})")
    p.add_argument("--allocators", type=_bench._csv, help=f"comma list (default {','.join(ALLOCATORS)})")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 5; --quick 1)")
    p.add_argument("--quick", action="store_true", help="small inputs, one round (about a minute)")
    p.add_argument("--save", metavar="PATH", help="write the run as JSON")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.list:
        for w, (desc, need, _, size, qsize) in WORKLOADS.items():
            state = "" if not need or shutil.which(need) else f"  (unavailable: {need} not installed)"
            print(f"  {w:<11} {desc}; N = {size} (--quick {qsize}){state}")
        return 0
    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 5)
    if rounds < 1:
        print("kpool bench --real: --rounds must be at least 1", file=sys.stderr)
        return 2
    if a.save:   # a path that cannot be written fails now, not after the whole run
        existed = os.path.exists(a.save)
        try:
            with open(a.save, "a"):
                pass
            if not existed:
                os.remove(a.save)
        except OSError as e:
            print(f"kpool bench --real: cannot write {a.save}: {e.strerror or e}", file=sys.stderr)
            return 2
    try:
        res = run(a.workloads, a.allocators, rounds=rounds, quick=a.quick, progress=not a.no_progress)
    except ValueError as e:
        print(f"kpool bench --real: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kpool bench --real: interrupted; nothing saved", file=sys.stderr)
        return 130
    m = res["meta"]["machine"]
    print(f"kpool bench --real: {m.get('cpu')} ({m.get('cores')} cores), Linux {m.get('kernel')}, "
          f"{m.get('glibc')}, kpool {m.get('kpool')}")
    print("command: " + shlex.join(["python", "-m", "kpool", "bench", "--real"] + list(argv or [])))
    for w, c in res["meta"]["commands"].items():
        print(f"  {w}: {c[:150]}")
    print()
    print(table(res))
    failed = any(r.get("error") for r in res["records"])
    if a.save:
        try:
            save(res, a.save)
            print(f"saved: {a.save}")
        except OSError as e:
            print(f"kpool bench --real: cannot write {a.save}: {e.strerror or e}", file=sys.stderr)
            return 1
    return 1 if failed else 0
