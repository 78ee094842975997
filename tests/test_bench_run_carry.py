"""bench/run_carry.py on the CPU at tiny size: a study run stopped mid-way by SIGTERM (as
the deadline stops it: `eagle3lab train` checkpoints the step and exits 143), its newest
checkpoint packed and returned over several calls (as the device returns at most 64 MiB a
call), unpacked on a "fresh machine" (the same work path, planned again) and resumed there,
ends exactly where the same run resumed in place ends: the same weights, the same logged
metrics, though the frozen tensors (the target's embedding) travel only as their sha256 and
a drafter built with other ones is refused. A checkpoint from another plan, a missing part,
a checkpoint already there and a finished run are refused in one line each."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testutil import study_poll, tiny_study_answers

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
RUN = "data-all-wd0.01-s0"


def _bench(script: str, *args, ok: bool = True) -> str:
    r = subprocess.run([sys.executable, "-P", str(ROOT / "bench" / script), *map(str, args)],
                       capture_output=True, text=True, timeout=900, env=ENV)
    if ok:
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout + r.stderr


@functools.cache
def _run_carry():
    """bench/run_carry.py as a module (loaded once)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_carry", ROOT / "bench" / "run_carry.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _carry(*args, ok: bool = True) -> str:
    """bench/run_carry.py's main in this process (its CLI's subprocess start costs seconds a
    call); a UserError is its one line, as the CLI prints it."""
    import contextlib
    import io

    from eagle3lab.errors import UserError

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            code = _run_carry().main([str(a) for a in args])
    except UserError as e:
        code = 1
        buf.write(str(e))
    assert (code == 0) == ok, buf.getvalue()
    return buf.getvalue()


def _train(work: Path, *, term_at: int | None = None, **extra) -> str:
    """The run's own settings (study.json), as study_gpu.py train starts it; `term_at`:
    `eagle3lab train` sent SIGTERM as that step starts (the deadline's stop), its exit code
    saying so (143); without it, trained in this process."""
    arm = next(a for a in json.loads((work / "study/study.json").read_text())["arms"]
               if a["name"] == RUN)
    cfg = work / f"{RUN}.json"
    cfg.write_text(json.dumps({**arm["train"], "device": "cpu", "progress": False, **extra}))
    if term_at is None:  # in this process: the same loop, without a start of seconds
        from eagle3lab.train import TrainConfig, train_run

        return str(train_run(TrainConfig.from_dict(json.loads(cfg.read_text()), str(cfg))))
    env = {**ENV, "EAGLE3LAB_TEST_FAULT": f"term:0:{term_at}"}
    r = subprocess.run([sys.executable, "-m", "eagle3lab", "train", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert r.returncode == 143, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout


def _plan(work: Path, gen: Path, cfg: Path, target: Path) -> None:
    shutil.copytree(gen, work / "gen")
    _bench("study_gpu.py", "plan", "--work", work, "--config", cfg, "--target", target)


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("wall_s", None)
    return rows


@pytest.mark.full
@pytest.mark.slow
def test_a_run_carried_to_a_fresh_machine_resumes_exactly(tmp_path, tiny_target_dir):
    from safetensors.torch import load_file

    from eagle3lab.train.checkpoints import list_checkpoints

    gen = tmp_path / "gen"
    tiny_study_answers(gen, tiny_target_dir, {"greedy-0": {}, "eval": {"limit": 3}})
    cfg = tmp_path / "config.json"
    study = {"target": "set by --target", "greedy": ["gen/greedy-0.jsonl"],
             "eval_conversations": "gen/eval.jsonl", "data_tokens": [0],
             "weight_decays": [0.01], "seeds": [0], "tokens_per_run": 900,
             "regen_tokens": None, "evals_per_run": 4, "live_settings": ["2,1,3"],
             "train": {"max_tokens_per_batch": 64, "ttt_steps": 2, "draft_vocab_size": 128,
                       "warmup_steps": 0}}
    cfg.write_text(json.dumps(study))
    w = tmp_path / "w"
    _plan(w, gen, cfg, tiny_target_dir)
    run = w / "study/runs" / RUN
    said = _carry("out", "--work", w, "--dest", tmp_path / "none")
    assert "0 part(s)" in said and "every part returned" in said
    assert not list((tmp_path / "none").iterdir())  # nothing trained yet: nothing carried

    # the session's deadline stops the run (SIGTERM) a few steps in: it checkpoints the
    # step it reached, whatever its periodic checkpoints
    arm = next(a for a in json.loads((w / "study/study.json").read_text())["arms"]
               if a["name"] == RUN)
    step = 3
    said = _train(w, term_at=step)
    assert f"train: SIGTERM: stopped at step {step}" in said
    assert list_checkpoints(run)[-1].name == f"step-{step}"
    assert json.loads((run / "run.json").read_text())["status"] == "stopped"
    assert step < arm["train"]["max_tokens"] / 64  # well before the run's end

    # the points its checkpoints settled, decoded live while it trained (--live-early):
    # live.json travels with the checkpoint, so the next machine does not lose them
    from eagle3lab.study.atscale import measure_live

    measure_live(w / "study", RUN, target=tiny_target_dir, device="cpu", early=True)
    early = json.loads((run / "live.json").read_text())
    assert early["complete"] is False and early["rows"]

    # the poll that sees the chain exit carries the stopped run out in the same call
    # (STUDY_CARRY_OUT), after the small results; not while the chain still runs
    said = study_poll(w, tmp_path / "running", STUDY_WINNER="none",
                      STUDY_CARRY_OUT=RUN).stdout
    assert "carry out: not yet, the chain is still running" in said
    assert not list((tmp_path / "running").glob("resume-*"))
    (w / "chain.log").write_text("train ... stopped at the deadline\nchain exited 0\n")
    said = study_poll(w, tmp_path / "poll", STUDY_WINNER="none", STUDY_CARRY_OUT="all").stdout
    assert f"{RUN}: step-{step}" in said and "every part returned" in said
    got = sorted(p.name for p in (tmp_path / "poll").iterdir())
    assert "results.tar.gz" in got and any(n.startswith(f"resume-{RUN}") for n in got), got
    bad = study_poll(w, tmp_path / "bad", STUDY_CARRY_OUT=RUN, STUDY_CARRY_MIB="lots", rc=2)
    assert bad.stderr == ("study_poll.sh: STUDY_CARRY_MIB must be a whole number of MiB, "
                          "not 'lots'\n")
    shutil.rmtree(w / "run-carry")  # as if not carried: the calls below pack it afresh
    (w / "chain.log").unlink()

    # out: packed once; returned over calls of at most --max-mib, each naming what is left
    said = _carry("out", "--work", w, "--dest", tmp_path / "probe",
                  "--max-mib", 0)
    assert "0 part(s)" in said and "1 left for the next call" in said
    size = json.loads((w / "run-carry" / f"{RUN}.json").read_text())["bytes"]
    shutil.rmtree(w / "run-carry")
    part = size / 4.5 / 2**20  # five parts, two a call: three calls
    backs = [tmp_path / f"back{i}" for i in range(3)]
    said = _carry("out", "--work", w, "--dest", backs[0], "--part-mib", part,
                  "--max-mib", 2 * part)
    assert f"{RUN}: step-{step}" in said and "3 left for the next call" in said
    record = json.loads((w / "run-carry" / f"{RUN}.json").read_text())
    assert record["manifest"]["step"] == step and len(record["parts"]) == 5
    for back in backs[1:]:
        said = _carry("out", "--work", w, "--dest", back, "--part-mib", part,
                      "--max-mib", 2 * part)
        assert "already packed" in said  # the same checkpoint: not packed again
    assert "1 part(s)" in said and "every part returned" in said
    returned = sorted(p for b in backs for p in b.iterdir())
    assert [p.name for p in returned] == sorted(record["parts"])
    assert all(p.stat().st_size <= part * 2**20 for p in returned)

    # the reference: the same run resumed in place, to its end
    _train(w, resume=True)
    ref_weights = load_file(str(run / "final" / "model.safetensors"))
    ref_metrics = _metrics(run)

    # a fresh machine: the same work path, planned again, the parts unpacked, resumed
    shutil.move(str(w), str(tmp_path / "w-first"))
    _plan(w, gen, cfg, tiny_target_dir)
    said = _carry("in", "--work", w, *returned)
    assert f"{RUN}: step-{step}" in said and "`train` resumes it there" in said
    assert [c.name for c in list_checkpoints(run)] == [f"step-{step}"]
    assert json.loads((run / "live.json").read_text()) == early
    again = _carry("in", "--work", w, *returned, ok=False)
    assert f"step-{step} is here already (as new or newer)" in again
    # the frozen tensors (the target's embedding) travelled as a sha256, not as weights
    ckpt = list_checkpoints(run)[-1]
    frozen = json.loads((ckpt / "checkpoint.json").read_text())["frozen"]
    whole = load_file(str(tmp_path / "w-first/study/runs" / RUN / "checkpoints" / ckpt.name
                          / "model.safetensors"))
    assert record["manifest"]["left_out"] == sorted(set(frozen) & set(whole))
    assert "embed_tokens.weight" in record["manifest"]["left_out"]
    carried = load_file(str(ckpt / "model.safetensors"))
    assert set(carried) == set(whole) - set(frozen)
    # carried on again before a new checkpoint (a machine lost early): as it came
    assert _run_carry()._without_frozen(ckpt, frozen, tmp_path / "again") == (
        ckpt, record["manifest"]["left_out"])
    # ... and a drafter built here with other frozen weights is refused, one line
    from eagle3lab.errors import UserError

    left = json.loads((ckpt / "left-out.json").read_text())
    wrong = {**left, "sha256": {k: "0" * 64 for k in left["sha256"]}}
    (ckpt / "left-out.json").write_text(json.dumps(wrong))
    with pytest.raises(UserError, match="left out embed_tokens.weight .* not the one it "
                       "trained with"):
        _train(w, resume=True)
    (ckpt / "left-out.json").write_text(json.dumps(left))
    _train(w, resume=True)
    weights = load_file(str(run / "final" / "model.safetensors"))
    assert set(weights) == set(ref_weights)
    for k, v in ref_weights.items():
        assert weights[k].equal(v), k
    assert _metrics(run) == ref_metrics

    # a finished run has nothing to carry; a missing part is named
    said = _carry("out", "--work", w, "--dest", tmp_path / "done",
                  "--runs", RUN)
    assert f"{RUN}: finished: nothing to carry" in said
    bad = _bench("run_carry.py", "in", "--work", w, *returned[1:], ok=False)
    assert "part00 of run data-all-wd0.01-s0's carry is missing" in bad
    assert "Traceback" not in bad

    # another plan (other settings for the run): refused, one line, nothing written
    other = tmp_path / "w-other"
    cfg.write_text(json.dumps({**study, "tokens_per_run": 1200}))
    _plan(other, gen, cfg, tiny_target_dir)
    said = _carry("in", "--work", other, *returned, ok=False)
    assert (f"{RUN}: step {step} not unpacked: its train settings differ from this "
            "plan's") in said
    assert not (other / "study/runs" / RUN / "checkpoints").exists()
