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
    # a target given as a directory gets no drafter by itself (the H200's study call
    # passed /root/e3l/target and got a bare "No drafter" line): the CLI's sentence, which
    # names the presets that have one and says to pass --draft
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--target", str(tokenizer_dir),
                        "--limit", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("bench/accept.py: error: No drafter given (--draft) and no "
                               f"default drafter for target '{tokenizer_dir}'")
    assert "smollm2-135m-instruct" in r.stderr and "Pass --draft CHECKPOINT" in r.stderr
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--json", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(
        f"error: --json {tmp_path}: a directory; give the file to write")
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


@pytest.mark.slow
def test_partial_results_survive_a_stop(tokenizer_dir, tmp_path, monkeypatch, capsys):
    """A run stopped part-way (here: an exception raised by the JSON writer once the first
    prompt's counts are saved; in life `timeout`) leaves a whole JSON file with
    `complete: false` and the counts measured so far (plain and speculative tokens and
    decode seconds, their ratio from those counts); a run that ends rewrites it with
    `complete: true`, the setting's row and its warm-up apart from the timed decode. The
    real path: the static engine (eager on the CPU), the tiny random target of `--shape`."""
    import importlib.util
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, tok)
    (tok / "config.json").write_text("{}")  # a directory the target resolver accepts
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repo first
    spec = importlib.util.spec_from_file_location("bench_accept", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "SAVE_EVERY_S", 0.0)  # every prompt's counts are saved

    class Stop(Exception):
        pass

    real_save, saved, stop = script.save_json, [], [True]

    def save_then_maybe_stop(path, obj):
        real_save(path, obj)
        saved.append(json.loads(Path(path).read_text()))
        if stop[0] and obj.get("in_progress", {}).get("prompts_done") == 1:
            raise Stop

    monkeypatch.setattr(script, "save_json", save_then_maybe_stop)
    out = tmp_path / "r.json"
    args = ["--target", str(tok), "--shape", "tiny", "--limit", "2", "--max-new-tokens", "4",
            "--settings", "2,1,3", "--engine", "static", "--json", str(out)]
    with pytest.raises(Stop):
        script.main(args)
    res = json.loads(out.read_text())
    assert res["complete"] is False and res["settings"] == [] and res["engine"] == "static"
    now = res["in_progress"]
    assert (now["setting"], now["prompts_done"], now["prompts"]) == ("2,1,3", 1, 2)
    plain, arm = now["plain"], now["arms"][0]
    assert plain["completion_tokens"] >= 1 and arm["completion_tokens"] >= 1
    assert plain["decode_s"] > 0 and arm["decode_s"] > 0
    assert arm["speedup_measured"] == pytest.approx(
        (arm["completion_tokens"] / arm["decode_s"])
        / (plain["completion_tokens"] / plain["decode_s"]))
    assert plain["capture_s"] == 0.0 and arm["captures"] == 0  # no graphs off a GPU
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, then renamed
    first = capsys.readouterr()
    assert "S,K,D" in first.out and "step costs" not in first.out  # header, no row yet
    assert "2,1,3 1/2 prompts: plain " in first.err

    stop[0], saved[:] = False, []
    assert script.main(args) == 0
    res = json.loads(out.read_text())
    assert res["complete"] is True and "in_progress" not in res
    assert [s["complete"] for s in saved] == [False] * (len(saved) - 1) + [True]
    row = res["settings"][0]
    warm, r = row["warmup"], row["batch1"]
    assert warm["plain_decode_s"] == r["plain"]["decode_s"] > 0
    assert warm["spec_decode_s"] == r["arms"][0]["stats"]["decode_s"] > 0
    assert warm["plain_capture_s"] == warm["spec_capture_s"] == 0.0 and warm["wall_s"] > 0
    last = [s["in_progress"] for s in saved if s.get("in_progress", {}).get("prompts_done")]
    assert last[-1]["prompts_done"] == 2
    assert last[-1]["plain"]["completion_tokens"] == r["plain"]["completion_tokens"]
    assert last[-1]["arms"][0]["decode_s"] == r["arms"][0]["stats"]["decode_s"]
    done = capsys.readouterr().out
    assert "step costs" in done and "warm-up (graph captures + compiles" in done
