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


def test_bad_input_is_one_line_not_a_traceback(tokenizer_dir, tmp_path):
    """A bench script answers bad input as the CLI does (`eagle3lab.cli.guarded`): a missing
    target is a UserError line, exit 1; a truncated config.json (transformers' own OSError)
    one `unexpected error` line naming the bench frame it passed through, exit 2."""
    import shutil

    def bench(target):
        r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--target", str(target),
                            "--shape", "tiny", "--limit", "1"],
                           capture_output=True, text=True, timeout=600)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        return r.returncode, r.stderr

    code, err = bench(tmp_path / "absent")
    assert code == 1 and err.startswith(f"bench/accept.py: error: Target '{tmp_path / 'absent'}'"
                                        " does not exist.")
    tok = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, tok)
    (tok / "config.json").write_text('{"model_type": "lla')  # truncated
    code, err = bench(tok)
    assert code == 2 and err.startswith("bench/accept.py: unexpected error: OSError: ")
    assert "config.json" in err and "[in bench/accept.py:" in err and "EAGLE3LAB_DEBUG=1" in err
