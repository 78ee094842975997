"""bench/study_gpu.py on the CPU at tiny sizes: the data stage (self-prompt, split, greedy,
sampled and held-out answers, packs that unpack to the same bytes), then plan, train (runs
at once, online, live decoding of the checkpoints along the way) and collect."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from testutil import study_poll, tiny_study_answers

from eagle3lab.train.config import TrainConfig

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "study_gpu.py"
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def _run(*args, timeout=900):
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout, env=ENV)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout + r.stderr


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.full
def test_data_stage_packs_what_unpacks(tmp_path, default_target_dir):
    w = tmp_path / "w"
    out = _run("data", "--work", w, "--target", default_target_dir, "--device", "cpu",
               "--dtype", "float32", "--prompts", 4, "--self-prompt-batch", 8, "--procs", 2,
               "--batch-size", 2, "--max-new-tokens", 6, "--sampled", 2,
               "--sampled-batch-size", 2, "--eval-limit", 2)
    assert "data finished: {'greedy-0': True, 'greedy-1': True, 'sampled': True, 'eval': True}" \
        in out
    gen = w / "gen"
    parts = [gen / "prompts-0.jsonl", gen / "prompts-1.jsonl"]
    assert b"".join(p.read_bytes() for p in parts) == (gen / "prompts.jsonl").read_bytes()
    # a second call finds everything done and starts nothing
    again = _run("data", "--work", w, "--target", default_target_dir, "--device", "cpu",
                 "--dtype", "float32", "--prompts", 4, "--procs", 2, "--sampled", 2,
                 "--eval-limit", 2)
    assert "start " not in again
    # the packs (as they come back from the device: flat) rebuild the same files
    flat = tmp_path / "back"
    flat.mkdir()
    for f in (w / "pack").rglob("*.npz"):
        (flat / f.name).write_bytes(f.read_bytes())
    _run("unpack", "--work", tmp_path / "w2", "--packs", flat, "--target", default_target_dir)
    for name in ("greedy-0", "greedy-1", "sampled", "eval", "prompts"):
        assert (tmp_path / "w2/gen" / f"{name}.jsonl").read_bytes() == \
            (gen / f"{name}.jsonl").read_bytes()
    # the record committed beside the packs: every pack and rebuilt file by sha256
    from eagle3lab.fsutil import sha256_file

    _run("describe", "--work", tmp_path / "w2", "--packs", flat, "--dest",
         tmp_path / "data.json", "--made", "a test")
    rec = json.loads((tmp_path / "data.json").read_text())
    assert rec["made"] == "a test" and rec["target"]["num_layers"] == 30
    assert {n: v["sha256"] for n, v in rec["packs"].items()} == \
        {f.name: sha256_file(f) for f in flat.iterdir()}
    assert rec["files"]["greedy-0.jsonl"]["sha256"] == sha256_file(gen / "greedy-0.jsonl")
    assert rec["files"]["sampled.jsonl"]["params"]["temperature"] == 0.8
    assert rec["files"]["eval.jsonl"]["records"] == 2


def test_a_poll_ends_when_the_chain_has_exited(tmp_path):
    """A chain that stopped at start (session 14: the launch carried no packs) must not
    cost the poll's whole wait: with "chain exited" in its log, a 600 s poll returns at
    once (the subprocess limit is 120 s) and shows the log's end."""
    w = tmp_path / "w"
    w.mkdir()
    (w / "chain.log").write_text("bench/study_gpu.py: error: conversations file(s) "
                                 "gen/greedy-0.jsonl not found\nchain exited 1\n")
    r = study_poll(w, tmp_path / "out", seconds=600, timeout=120)
    assert "conversations file(s)" in r.stdout and "chain exited 1" in r.stdout
    assert list((tmp_path / "out").iterdir()) == []  # no plan yet, so nothing to collect
    for bad in ("abc", "1.5"):  # one line that names the argument, not bash's own error
        r = study_poll(w, tmp_path / f"out-{bad}", seconds=bad, timeout=120, rc=2)
        assert r.stderr == f"study_poll.sh: SECONDS must be a whole number, not '{bad}'\n"


def _untar(parts: list[Path], dest: Path) -> Path:
    """The parts joined in order, untarred into dest."""
    import io
    import tarfile

    data = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
        t.extractall(dest, filter="data")
    return dest


def _tiny_config(tmp_path, prompts, **over) -> Path:
    """A tiny study's config (tiny_study_answers' gen/ files, one weight decay and seed,
    CPU-sized live decodes), with `over`'s keys; written to tmp_path/config.json."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "target": "set by --target", "greedy": ["gen/greedy-0.jsonl"],
        "eval_conversations": "gen/eval.jsonl", "weight_decays": [0.01], "seeds": [0],
        "regen_tokens": None, "evals_per_run": 4, "live_settings": ["2,1,3"],
        "live_prompts": str(prompts), "live_limit": 2, "live_max_new_tokens": 6,
        "live_dtype": "float32", "live_batch_size": 2,
        "train": {"max_tokens_per_batch": 64, "ttt_steps": 2, "draft_vocab_size": 128,
                  "warmup_steps": 0}, **over}))
    return cfg


@pytest.mark.slow
@pytest.mark.full
def test_plan_train_collect(tmp_path, tiny_target_dir):
    w = tmp_path / "w"
    prompts = tiny_study_answers(w / "gen", tiny_target_dir, {
        "greedy-0": {}, "sampled": {"temperature": 0.8, "limit": 6}, "eval": {"limit": 3}})
    cfg = _tiny_config(tmp_path, prompts, sampled=["gen/sampled.jsonl"], data_tokens=[30, 0],
                       tokens_per_run=600)
    _run("plan", "--work", w, "--config", cfg, "--target", tiny_target_dir)
    study = json.loads((w / "study/study.json").read_text())
    assert [a["name"] for a in study["arms"]] == ["data-0.03k-wd0.01-s0",
                                                  "data-all-wd0.01-s0"]
    # a planned run's first steps profiled beside the study, never in it
    name = study["arms"][1]["name"]
    out = _run("profile", "--work", w, "--device", "cpu", "--only", name, "--steps", 4, 5,
               "--set", "prefetch=false")
    prof = w / "profile" / f"{name}+prefetch=false"
    summary = json.loads((prof / "profile/summary.json").read_text())
    assert summary["steps"] == [4, 5] and summary["tokens"] > 0 and summary["regions"]
    assert f'"tokens": {summary["tokens"]},' in out  # printed
    assert json.loads((prof / "run.json").read_text())["config"]["prefetch"] is False
    assert re.search(r"steps 3-3 unprofiled: [\d,]+ tokens/s", out), out
    assert not (w / "study/runs" / name).exists()
    # its train config for a bench script (bench/target_sdpa.py): the arm's, elsewhere
    out = _run("config", "--work", w, "--device", "cpu", "--only", name)
    cfgp = w / "configs" / f"bench-{name}.json"
    assert str(cfgp) in out
    bench = json.loads(cfgp.read_text())
    assert bench.pop("device") == "cpu" and bench.pop("out") == str(w / "bench" / name)
    assert bench.pop("resume") is False
    arm = {k: v for k, v in study["arms"][1]["train"].items()
           if k not in ("device", "out", "resume")}
    assert bench == arm
    TrainConfig.from_dict(json.loads(cfgp.read_text()), str(cfgp))  # a valid config
    bad = subprocess.run([sys.executable, "-P", str(SCRIPT), "config", "--work", str(w),
                          "--device", "cpu", "--only", "no-such-run"],
                         capture_output=True, text=True, timeout=120, env=ENV)
    assert bad.returncode != 0 and "no run named no-such-run" in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr
    out = _run("train", "--work", w, "--device", "cpu", "--jobs", 2, "--live-jobs", 2,
               "--warm-first", 600, "--live-early")
    assert "2/2 runs finished, 2 decoded live" in out and "failed" not in out
    # the first run trains alone until it has logged a step; then the other starts
    first, second = (f"train {a['name']}" for a in study["arms"])
    warm = f"warm: {study['arms'][0]['name']} logged a step after"
    assert out.index(first) < out.index(warm) < out.index(second), out
    for a in study["arms"]:
        run = w / "study/runs" / a["name"]
        info = json.loads((run / "run.json").read_text())
        assert info["status"] == "done" and info["summary"]["tokens"] >= 600
        live = json.loads((run / "live.json").read_text())
        fracs = [r["fraction"] for r in live["rows"]]
        assert fracs[-1] == 1.0 and len(fracs) >= 3  # checkpoints along the way + final
        for r in live["rows"]:  # tau from the raw counts
            assert r["tau"] == pytest.approx(r["completion_tokens"] / r["verify_ct"])
            assert sum(r["accept_histogram"]) == r["verify_ct"]
        assert not (run / "checkpoints").exists()  # deleted once decoded
        assert set(live["serving"]) >= {"vllm", "sglang"}  # the doctor's verdict per engine
        assert live["serving"]["vllm"]["serves"] is True
    # a drafter trained elsewhere, decoded as the runs are (here: one run's final drafter)
    out = _run("reference", "--work", w, "--device", "cpu", "--target", tiny_target_dir,
               "--drafter", w / "study/runs/data-all-wd0.01-s0/final", "--name", "other")
    ref = json.loads((w / "study/references/other/live.json").read_text())
    own = json.loads((w / "study/runs/data-all-wd0.01-s0/live.json").read_text())
    assert ref["complete"] is True and [r["setting"] for r in ref["rows"]] == ["2,1,3"]
    final = next(r for r in own["rows"] if r["fraction"] == 1.0)
    assert ref["rows"][0]["accept_histogram"] == final["accept_histogram"]  # same decode
    _run("collect", "--work", w, "--dest", tmp_path / "res")
    got = sorted(p.relative_to(tmp_path / "res").as_posix()
                 for p in (tmp_path / "res").rglob("*") if p.is_file())
    assert got == ["references/other/live.json",
                   "runs/data-0.03k-wd0.01-s0/live.json", "runs/data-0.03k-wd0.01-s0/metrics.jsonl",
                   "runs/data-0.03k-wd0.01-s0/run.json", "runs/data-all-wd0.01-s0/live.json",
                   "runs/data-all-wd0.01-s0/metrics.jsonl", "runs/data-all-wd0.01-s0/run.json",
                   "study.json"]

    # the winner's final drafter, packed; a poll names it before its run has finished
    out = _run("collect", "--work", w, "--dest", tmp_path / "res-w", "--winner",
               "data-all-wd0.01-s0")
    assert "winner data-all-wd0.01-s0: packed into" in out
    assert (tmp_path / "res-w/winner/config.json").is_file()
    assert any((tmp_path / "res-w/winner").glob("*.safetensors"))
    os.rename(w / "study/runs/data-all-wd0.01-s0/final", w / "final.away")
    out = _run("collect", "--work", w, "--dest", tmp_path / "res-n", "--winner",
               "data-all-wd0.01-s0")
    assert "winner data-all-wd0.01-s0: no final drafter yet (not packed)" in out
    assert not (tmp_path / "res-n/winner").exists()
    os.rename(w / "final.away", w / "study/runs/data-all-wd0.01-s0/final")
    # auto (the poll's default): the best final drafter decoded here, by its final live tau
    # at the study's shape (5,1,6 when measured; this config's only shape otherwise)
    from eagle3lab.fsutil import sha256_file
    from eagle3lab.study.atscale import best_final_here

    taus = {n: [r["tau"] for r in json.loads((w / "study/runs" / n / "live.json").read_text())[
        "rows"] if r["fraction"] == 1.0 and r["setting"] == "2,1,3"][0]
        for n in ("data-0.03k-wd0.01-s0", "data-all-wd0.01-s0")}
    best = max(taus, key=taus.get)
    assert best_final_here(w / "study") == (best, "2,1,3", taus[best])
    out = _run("collect", "--work", w, "--dest", tmp_path / "res-a", "--winner", "auto")
    assert f"winner auto: {best} (tau {taus[best]:.3f} at 2,1,3), packed into" in out
    assert (tmp_path / "res-a/winner/config.json").is_file()
    rec = json.loads((tmp_path / "res-a/winner/winner.json").read_text())
    assert (rec["format"], rec["run"], rec["picked"], rec["setting"]) == \
        ("eagle3lab-winner", best, "auto", "2,1,3") and rec["tau"] == taus[best]
    assert rec["model_sha256"] == sha256_file(tmp_path / "res-a/winner/model.safetensors")
    # a final drafter not decoded yet does not count
    other = next(n for n in taus if n != best)
    live = w / "study/runs" / best / "live.json"
    os.rename(live, w / "live.away")
    assert best_final_here(w / "study") == (other, "2,1,3", taus[other])
    os.rename(w / "live.away", live)
    # the device poll: one results.tar.gz, or parts of 15 MiB when the logs grow past it
    study_poll(w, tmp_path / "out1", STUDY_WINNER="data-all-wd0.01-s0")
    got = _untar(sorted((tmp_path / "out1").iterdir()), tmp_path / "u1")
    assert [p.name for p in sorted((tmp_path / "out1").iterdir())] == ["results.tar.gz"]
    assert (got / "collected/winner/config.json").is_file()
    assert (got / "collected/runs/data-all-wd0.01-s0/live.json").is_file()
    (w / "logs/big.bin").write_bytes(os.urandom(17 * 2**20))
    study_poll(w, tmp_path / "out2", STUDY_WINNER="none")
    parts = sorted((tmp_path / "out2").iterdir())
    assert [p.name for p in parts] == ["results.tar.gz.part00", "results.tar.gz.part01"]
    got = _untar(parts, tmp_path / "u2")
    assert (got / "logs/big.bin").read_bytes() == (w / "logs/big.bin").read_bytes()
    assert not (got / "collected/winner").exists()
    (w / "logs/big.bin").unlink()

    # a later session on a fresh machine: the same plan, the collected results restored,
    # nothing trained or decoded again
    w2 = tmp_path / "w2"
    (w2 / "gen").mkdir(parents=True)
    for f in (w / "gen").iterdir():
        (w2 / "gen" / f.name).write_bytes(f.read_bytes())
    _run("plan", "--work", w2, "--config", cfg, "--target", tiny_target_dir)
    assert "restored 2 finished runs from {} and the reference(s) other".format(
        tmp_path / "res") in _run("restore", "--work", w2, "--results", tmp_path / "res")
    assert (w2 / "study/references/other/live.json").read_text() == \
        (w / "study/references/other/live.json").read_text()
    assert "0 runs to train, 0 to decode live" in _run("train", "--work", w2, "--device",
                                                        "cpu", "--jobs", 2)
    # restored runs have their results here, not their drafters: auto packs none
    out = _run("collect", "--work", w2, "--dest", tmp_path / "res-w2", "--winner", "auto")
    assert "winner auto: no final drafter decoded on this machine yet (not packed)" in out
    assert not (tmp_path / "res-w2/winner").exists()

    # a run that finished training but whose live decode did not finish in its session:
    # its checkpoints did not travel, so the next session says so and does not fail on it
    (tmp_path / "res/runs/data-all-wd0.01-s0/live.json").unlink()
    w3 = tmp_path / "w3"
    (w3 / "gen").mkdir(parents=True)
    for f in (w / "gen").iterdir():
        (w3 / "gen" / f.name).write_bytes(f.read_bytes())
    _run("plan", "--work", w3, "--config", cfg, "--target", tiny_target_dir)
    _run("restore", "--work", w3, "--results", tmp_path / "res")
    out = _run("train", "--work", w3, "--device", "cpu", "--jobs", 2)
    assert ("finished without live tau and without checkpoints here (not decoded; delete "
            "the run directory or pass --retrain-undecoded to train again): "
            "data-all-wd0.01-s0") in out
    assert "0 runs to train, 0 to decode live" in out and "failed" not in out
    # --retrain-undecoded trains it again, and decodes it this time
    out = _run("train", "--work", w3, "--device", "cpu", "--jobs", 2, "--retrain-undecoded")
    assert "trained again for their live tau (--retrain-undecoded): data-all-wd0.01-s0" in out
    assert "1 runs to train, 0 to decode live" in out
    assert "2/2 runs finished, 2 decoded live" in out and "failed" not in out
    live = json.loads((w3 / "study/runs/data-all-wd0.01-s0/live.json").read_text())
    assert live["complete"] is True and live["rows"][-1]["fraction"] == 1.0


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.full
def test_live_early_decodes_a_running_runs_points(tmp_path, tiny_target_dir):
    """--live-early: the points a running run's checkpoints have settled are decoded while
    it trains; the decode after the run waits for that one and measures only the final
    drafter (the rows: every point once, in order)."""
    w = tmp_path / "w"
    prompts = tiny_study_answers(w / "gen", tiny_target_dir, {"greedy-0": {},
                                                              "eval": {"limit": 3}})
    cfg = _tiny_config(tmp_path, prompts, sampled=[], data_tokens=[0], tokens_per_run=30000)
    _run("plan", "--work", w, "--config", cfg, "--target", tiny_target_dir)
    out = _run("train", "--work", w, "--device", "cpu", "--jobs", 1, "--live-jobs", 2,
               "--live-early", "--live-early-every", 1)
    name = "data-all-wd0.01-s0"
    early = out.index(f"live {name} (early: ")
    assert early < out.index(f"train {name} exited 0"), out
    assert early < out.index(f"live {name} (early) exited 0") < \
        out.index(f"live {name}\n") < out.index(f"live {name} exited 0"), out
    assert "1/1 runs finished, 1 decoded live" in out and "failed" not in out
    live = json.loads((w / "study/runs" / name / "live.json").read_text())
    assert live["complete"] is True
    assert [r["fraction"] for r in live["rows"]] == [0.125, 0.25, 0.5, 1.0]


def _study_gpu():
    import importlib.util

    spec = importlib.util.spec_from_file_location("study_gpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_run_the_deadline_would_stop_is_not_started(tmp_path):
    """Session 5 on the H200, replayed from its committed metrics: at 06:26:39 (298 s after
    the five runs beside the first started, 496 s before the deadline) train started
    data-6M-wd0.01-s1 and data-all-wd0.01-s1, neither of which could finish; they slowed
    the candidate run, which the deadline then stopped too. The estimate from the runs'
    own metrics at that moment would not start them, and would start a cached 0.1M run."""
    sg = _study_gpu()
    src = Path(__file__).resolve().parents[1] / "data/studies/h200-grok/session-5/runs"
    study = json.loads((src.parent / "study.json").read_text())
    arms = {a["name"]: a for a in study["arms"]}

    def at(name: str, wall_s: float) -> dict:
        """The arm with its metrics as they stood `wall_s` seconds into its run."""
        out = tmp_path / name
        out.mkdir(exist_ok=True)
        rows = [ln for ln in (src / name / "metrics.jsonl").read_text().splitlines()
                if json.loads(ln)["wall_s"] <= wall_s]
        (out / "metrics.jsonl").write_text("\n".join(rows) + "\n")
        return {**arms[name], "train": {**arms[name]["train"], "out": str(out)}}

    running = [at("long-400k-48M-wd0.01-s0", 298), at("long-all-32M-wd0.01-s0", 298)]
    uncached = sg.finish_estimate({**arms["data-6M-wd0.01-s1"], "train": {
        **arms["data-6M-wd0.01-s1"]["train"], "out": str(tmp_path / "none")}}, running)
    rate_all = sg.observed_rate(Path(running[1]["train"]["out"]) / "metrics.jsonl")
    assert 20_000 < rate_all < 40_000  # the candidate, uncached, beside five runs
    assert uncached == pytest.approx(16_000_000 / rate_all + sg.FINISH_MARGIN_S)
    assert uncached > 496  # not started
    cached = sg.finish_estimate({**arms["data-100k-wd0.01-s1"], "train": {
        **arms["data-100k-wd0.01-s1"]["train"], "out": str(tmp_path / "none")}}, running)
    assert cached < 496  # the cached 0.4M run's rate: it fits
    # a resumed run counts only its tokens left; too early to tell: None (it starts)
    half = at("data-6M-wd0.01-s1", 200)
    assert sg.finish_estimate(half, running) < uncached
    assert sg.finish_estimate(half, [at("long-all-32M-wd0.01-s0", 25)]) is None


def test_only_names_runs_of_the_plan(tmp_path):
    """`train --only`: a name the plan lacks is one line naming it (it was dropped without a
    word, and the run it meant never trained); known names are queued."""
    study = tmp_path / "w" / "study"
    study.mkdir(parents=True)
    plan = json.loads((Path(__file__).resolve().parents[1]
                       / "data/studies/h200-grok/study.json").read_text())
    for a in plan["arms"]:  # nothing of the device's paths here: every run unfinished
        a["train"]["out"] = str(tmp_path / "runs" / a["name"])
    (study / "study.json").write_text(json.dumps(plan))
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "train", "--work", tmp_path / "w",
                        "--only", "long-all-32M-wd0.01-s0,long-all-23M", "--deadline-s", "1"],
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--only: no run named long-all-23M in" in r.stdout + r.stderr
    out = _run("train", "--work", tmp_path / "w", "--deadline-s", 1,
               "--only", "long-all-32M-wd0.01-s0,data-100k-wd0.01-s1")
    assert "2 runs to train, 0 to decode live" in out
