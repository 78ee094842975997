"""bench/tokpack.py as the device and this machine run it: a regenerate output packed into
parts and unpacked from the folder they came back in, byte for byte with its meta; bad
input (a part missing) answered in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "tokpack.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})


@pytest.mark.slow
@pytest.mark.full
def test_pack_then_unpack_from_the_folder(tiny_target, tiny_target_dir, tmp_path):
    from eagle3lab.data.regenerate import meta_path, regenerate

    out = tmp_path / "greedy.jsonl"
    regenerate(target=tiny_target, prompts="eval", limit=12, out=out, max_new_tokens=24,
               batch_size=6, progress=False)
    r = _run("pack", str(out), str(tmp_path / "parts"), "--max-bytes", "2500",
             "--target", str(tiny_target_dir))
    assert r.returncode == 0, r.stderr[-2000:]
    packed = json.loads(r.stdout)
    assert packed["mode"] == "tokens" and len(packed["parts"]) >= 2
    back = tmp_path / "back" / "greedy.jsonl"
    r = _run("unpack", str(tmp_path / "parts"), "--out", str(back),
             "--target", str(tiny_target_dir))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["records"] == 12
    assert back.read_bytes() == out.read_bytes()
    assert meta_path(back).read_bytes() == meta_path(out).read_bytes()
    first = sorted((tmp_path / "parts").iterdir())[0]
    first.unlink()
    r = _run("unpack", str(tmp_path / "parts"), "--out", str(tmp_path / "x.jsonl"),
             "--target", str(tiny_target_dir))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("bench/tokpack.py: error: missing part(s) of greedy before "
                               "greedy.part02.npz")
