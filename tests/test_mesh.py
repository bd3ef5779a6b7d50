"""Meshing from Python: KPOOL_MESH=1 turns it on for the process; kpool.trim()
meshes sparse spans, kpool.stats() reports bytes_meshed and meshes, and every
block keeps its bytes. Each case runs in a fresh interpreter, since the switch
is read once at start-up."""
import json
import os
import subprocess
import sys

import kpool

CHILD = r"""
import json, random, kpool
random.seed(7)
blocks = []
for i in range(40000):
    b = kpool.malloc(128)
    b[:8] = i.to_bytes(8, "little")
    b[8:16] = (i * 7919).to_bytes(8, "little")
    blocks.append((i, b))
kept = [(i, b) for i, b in blocks if random.random() < 0.1]
drop = set(id(b) for _, b in kept)
for i, b in blocks:
    if id(b) not in drop:
        b.release()
del blocks
before = kpool.stats()
kpool.trim()
after = kpool.stats()
ok = all(bytes(b[:8]) == i.to_bytes(8, "little") and bytes(b[8:16]) == (i * 7919).to_bytes(8, "little")
         for i, b in kept)
fresh = [kpool.malloc(128) for _ in range(20000)]
for j, b in enumerate(fresh):
    b[:8] = (10**9 + j).to_bytes(8, "little")
ok2 = all(bytes(b[:8]) == i.to_bytes(8, "little") for i, b in kept) and all(
    bytes(b[:8]) == (10**9 + j).to_bytes(8, "little") for j, b in enumerate(fresh))
for b in fresh:
    b.release()
for _, b in kept:
    b.release()
kpool.trim()
end = kpool.stats()
print(json.dumps({"meshes": after["meshes"] - before["meshes"], "bytes_meshed": after["bytes_meshed"],
                  "intact": ok, "fresh_intact": ok2, "end_meshed": end["bytes_meshed"],
                  "mapped_ok": after["bytes_mapped"] == after["bytes_small_spans"] + after["bytes_meshed"]
                  + after["bytes_large"] + after["bytes_pools"] + after["bytes_arenas"]
                  + after["bytes_free_pageheap"] + after["bytes_released"]}))
"""


def run_child(mesh):
    env = dict(os.environ)
    env.pop("KPOOL_MESH", None)
    if mesh is not None:
        env["KPOOL_MESH"] = mesh
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_stats_have_the_mesh_figures():
    s = kpool.stats()
    assert s["version"] >= 3
    assert isinstance(s["bytes_meshed"], int) and s["bytes_meshed"] >= 0
    assert isinstance(s["meshes"], int) and s["meshes"] >= 0


def test_kpool_mesh_1_meshes_on_trim_and_keeps_every_block():
    r = run_child("1")
    assert r["meshes"] > 0 and r["bytes_meshed"] > 0
    assert r["intact"] and r["fresh_intact"] and r["mapped_ok"]
    assert r["end_meshed"] == 0           # the groups dissolved with their last blocks


def test_meshing_is_off_by_default_and_with_kpool_mesh_0():
    for mesh in (None, "0"):
        r = run_child(mesh)
        assert r["meshes"] == 0 and r["bytes_meshed"] == 0
        assert r["intact"] and r["fresh_intact"] and r["mapped_ok"]
