"""bench/accept.py on the CPU with a tiny random target of the `--shape` path: every GPU-run
section (HF static-cache baseline, static engine at batch 1 and batch 2, the eager engine's
acceptance-measurement rate) runs and writes its figures; the static and eager engines
agree on tau."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "accept.py"


def test_shape_tiny_every_section(tokenizer_dir, tmp_path):
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, tok)
    (tok / "config.json").write_text("{}")  # a directory the target resolver accepts
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--target", str(tok), "--shape",
                        "tiny", "--limit", "3", "--max-new-tokens", "8", "--settings", "2,1,3",
                        "--engine", "static", "--batch-size", "2", "--compare-eager", "2",
                        "--hf-baseline", "--hf-prompts", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "HF generate, static cache: " in r.stdout
    assert "batch 2: tau" in r.stdout and "acceptance measurement: static batch 2" in r.stdout
    res = json.loads(out.read_text())
    assert res["engine"] == "static" and res["hf_static_generate"]["tokens_per_s"] > 0
    row = res["settings"][0]
    static_tau = row["batch1"]["arms"][0]["stats"]["tau"]
    assert row["batch"]["arms"][0]["stats"]["requests"] == 3
    assert row["batch"]["batch"]["size"] == 2
    # the eager engine on the first 2 prompts vs the static one on the same 2
    eager = row["eager"]["arms"][0]["per_request"]
    static = row["batch1"]["arms"][0]["per_request"][:2]
    assert [p["accept_histogram"] for p in eager] == [p["accept_histogram"] for p in static]
    assert static_tau >= 1.0
