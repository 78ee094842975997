"""bench/accept.py on the CPU with a tiny random target of the `--shape` path: every GPU-run
section (HF static-cache baseline, static engine at batch 1 and batch 2, the eager engine's
acceptance-measurement rate) runs and writes its figures; the static and eager engines
agree on tau."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "accept.py"


@pytest.mark.slow
@pytest.mark.full
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


def test_bad_input_is_one_line_not_a_traceback(tokenizer_dir, tmp_path, monkeypatch, capsys):
    """A bench script answers bad input as the CLI does (`eagle3lab.cli.guarded`): a missing
    target is a UserError line, exit 1 (the script run as a process); a truncated
    config.json (transformers' own OSError) one `unexpected error` line naming the bench
    frame it passed through, exit 2 (the script's entry point, `bench_main`, in this
    process: a second interpreter would import torch again for the same path)."""
    import importlib.util
    import shutil

    from eagle3lab.cli import bench_main

    args = ["--shape", "tiny", "--limit", "1"]
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--target", str(tmp_path / "absent"),
                        *args], capture_output=True, text=True, timeout=600)
    code, err = r.returncode, r.stderr
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert code == 1 and err.startswith(f"bench/accept.py: error: Target '{tmp_path / 'absent'}'"
                                        " does not exist.")
    tok = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, tok)
    (tok / "config.json").write_text('{"model_type": "lla')  # truncated
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repo first
    monkeypatch.delenv("EAGLE3LAB_DEBUG", raising=False)
    spec = importlib.util.spec_from_file_location("bench_accept", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    capsys.readouterr()
    code = bench_main("accept.py", lambda: script.main(["--target", str(tok), *args]))
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert code == 2 and err.startswith("bench/accept.py: unexpected error: OSError: ")
    assert "config.json" in err and "[in bench/accept.py:" in err and "EAGLE3LAB_DEBUG=1" in err
