"""bench/compile_cache.py: inductor's cache packed into parts the device returns and
unpacked on the next machine. The round trip keeps every file but lock files; a missing,
cut or foreign part is one line naming it; and a cache inductor wrote on this CPU, carried
to another folder, is a cache hit there (a compile in a fresh process, counted by
dynamo's counters)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3lab.errors import UserError

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "compile_cache.py"
_spec = importlib.util.spec_from_file_location("compile_cache", SCRIPT)
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)


def _cache(root: Path) -> dict[str, bytes]:
    files = {"fxgraph/5e/f5emy/pflm": os.urandom(40_000), "f7/cf7h.main.so": os.urandom(30_000),
             "triton/0/ABC/k.cubin": os.urandom(20_000), "aotautograd/x/entry": b"a" * 5000}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "locks").mkdir()
    (root / "locks" / "k.lock").write_text("")
    return files


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*") if p.is_file()}


def test_parts_round_trip(tmp_path):
    files = _cache(tmp_path / "a")
    out = cc.pack(cache=tmp_path / "a", dest=tmp_path / "out", part_bytes=30_000,
                  max_bytes=2**20, log=lambda *_: None)
    assert out["skipped"] is None and out["files"] == 4
    names = sorted(Path(p).name for p in out["parts"])
    assert len(names) >= 3 and names[0] == "inductor-cache.tar.gz.part00"
    assert all(Path(p).stat().st_size <= 30_000 for p in out["parts"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == names  # no temp left
    got = cc.unpack(parts=list(reversed(out["parts"])), cache=tmp_path / "b",
                    log=lambda *_: None)
    assert _tree(tmp_path / "b") == files  # lock files left out, manifest not unpacked
    assert got["files"] == 4 and got["matches"] is True
    assert got["made_by"]["torch"] == got["here"]["torch"]


def test_one_part_and_what_is_refused(tmp_path):
    _cache(tmp_path / "a")
    one = cc.pack(cache=tmp_path / "a", dest=tmp_path / "one", log=lambda *_: None)
    assert [Path(p).name for p in one["parts"]] == ["inductor-cache.tar.gz"]
    # over --max-mib: nothing written, and the reason says how large it was
    big = cc.pack(cache=tmp_path / "a", dest=tmp_path / "big", max_bytes=1000,
                  log=lambda *_: None)
    assert big["parts"] == [] and "over --max-mib" in big["skipped"]
    assert not (tmp_path / "big").exists()
    with pytest.raises(UserError, match="no such folder"):
        cc.pack(cache=tmp_path / "none", dest=tmp_path / "x", log=lambda *_: None)

    parts = cc.pack(cache=tmp_path / "a", dest=tmp_path / "p", part_bytes=30_000,
                    log=lambda *_: None)["parts"]
    with pytest.raises(UserError, match="part01 of the cache is missing"):
        cc.unpack(parts=[parts[0], parts[2]], cache=tmp_path / "b", log=lambda *_: None)
    cut = tmp_path / "cut" / "inductor-cache.tar.gz"
    cut.parent.mkdir()
    cut.write_bytes(Path(one["parts"][0]).read_bytes()[:20_000])
    with pytest.raises(UserError, match="not a whole tar.gz"):
        cc.unpack(parts=[cut], cache=tmp_path / "c", log=lambda *_: None)


def test_a_cache_made_elsewhere_says_it_will_miss(tmp_path, monkeypatch):
    _cache(tmp_path / "a")
    monkeypatch.setattr(cc, "environment", lambda: {"torch": "2.11.0+cu130", "cuda": "13.0",
                                                     "triton": "3.6.0", "gpu": "NVIDIA H200"})
    parts = cc.pack(cache=tmp_path / "a", dest=tmp_path / "p", log=lambda *_: None)["parts"]
    monkeypatch.undo()
    lines = []
    got = cc.unpack(parts=parts, cache=tmp_path / "b", log=lines.append)
    assert got["matches"] is False and got["made_by"]["gpu"] == "NVIDIA H200"
    assert "made by torch 2.11.0+cu130" in lines[0] and "inductor will compile again" in lines[0]


COMPILE = """
import json, torch
from torch._dynamo.utils import counters
f = torch.compile(lambda x: torch.nn.functional.gelu(x @ x.T).sum(-1), dynamic=False)
f(torch.randn(8, 8))
print(json.dumps(dict(counters["inductor"])))
"""


@pytest.mark.slow
@pytest.mark.full
def test_inductor_hits_a_carried_cache(tmp_path):
    """The real thing on this CPU: a compile fills cache A; `out` packs it, `in` unpacks it
    into B (another folder, as on the next machine); a fresh process compiling the same
    function with B finds its graph there."""
    def compile_with(cache: Path) -> dict:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
        r = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    assert compile_with(tmp_path / "A").get("fxgraph_cache_miss") == 1
    run = [sys.executable, "-P", str(SCRIPT)]
    r = subprocess.run(run + ["out", "--cache", str(tmp_path / "A"), "--dest",
                              str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0 and "packed in 1 part(s)" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(run + ["in", "--cache", str(tmp_path / "B"),
                              str(tmp_path / "out" / "inductor-cache.tar.gz")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "cached files into" in r.stdout, r.stdout + r.stderr
    assert "compile again" not in r.stdout
    counts = compile_with(tmp_path / "B")
    assert counts.get("fxgraph_cache_hit") == 1 and "fxgraph_cache_miss" not in counts
    # a missing part is one line, not a traceback
    r = subprocess.run(run + ["in", "--cache", str(tmp_path / "C"),
                              str(tmp_path / "out" / "inductor-cache.tar.gz.part01")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "part00 of the cache is missing" in r.stderr
    assert "Traceback" not in r.stderr
