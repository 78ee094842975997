"""The weak-spots experiment as arms of the at-scale study (issue 29): the candidates right
after the base prefix ranked by a drafter's per-prompt tau on the static engine (real
decoding: a tiny random target and a drafter whose weights make it always draft the token
the target repeats after most prompts, so it fails on the others), the plan's weak and
random arms (base + the picked conversations), resume, the one line without a selection,
collect/restore of the selection, the committed study's finished runs kept, and the read
side's comparison from planted live counts."""

from __future__ import annotations

import importlib.util
import json
import shutil
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from eagle3lab.errors import UserError
from eagle3lab.fsutil import sha256_file
from eagle3lab.study.atscale import (WEAK_SELECTION, AtScaleConfig, collect, plan_arms,
                                     prepare_study, rank_weak, train_kwargs, write_prefix)
from eagle3lab.study.atscale_read import equal_compute_table, load_results, weak_vs_random

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "study_gpu.py"
TOPICS = ["rain", "chess", "bread", "rivers", "jazz", "comets", "tea", "bridges", "owls",
          "glass", "maps", "salt", "kites", "moss", "clocks", "wool", "ice", "ships"]
PROMPTS = ([f"Tell me about {t} and why it matters." for t in TOPICS]
           + [f"What is {i} plus {i * 3}?" for i in range(9)]
           + [f"Write one line about {t}." for t in TOPICS[:9]])
BASE = 150  # unique answer tokens of the base prefix
WEAK = {"base_tokens": BASE, "candidates": 12, "n": 4, "seeds": [0, 1], "setting": "2,1,3",
        "max_new_tokens": 8, "selection_seed": 0}


def _rec(pid, prompt, n):
    """A conversation record as regenerate writes it (its token ids are not read here)."""
    return {"id": pid, "category": None, "prompt": prompt, "response": "x" * n,
            "input_ids": [1, 2, 3] + list(range(10, 10 + n)), "loss_mask": [0] * 3 + [1] * n,
            "prompt_tokens": 3, "response_tokens": n, "finish_reason": "stop", "seed": None}


def _write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (path.parent / (path.name + ".meta.json")).write_text(json.dumps({"target": "tiny"}))
    return str(path)


@pytest.fixture(scope="module")
def ranker(tmp_path_factory, tiny_target_dir, tiny_target):
    """A drafter for the tiny target whose every draft is the token the target repeats
    after most prompts (lm_head zero: draft id 0 wins; the vocab map sends it there): it is
    accepted on those prompts and refused on the others."""
    from eagle3lab.data.prompts import chat_prompt_ids
    from eagle3lab.formats.demo import make_speculators_draft
    from eagle3lab.specdec.load import load_engine
    from testutil import edit_state

    eng = load_engine(target=tiny_target, engine="static", batch_size=8)
    out = eng.generate_many([chat_prompt_ids(tiny_target.tokenizer, p) for p in PROMPTS],
                            max_new_tokens=4)
    firsts = [r.output_ids[1] for r in out]
    fav = max(set(firsts), key=firsts.count)
    assert 0 < firsts.count(fav) < len(firsts), "the fixture needs prompts of both kinds"
    assert fav + 512 <= tiny_target.vocab_size

    def rig(state):
        state["lm_head.weight"].zero_()
        state["d2t"][:] = fav  # draft id i -> target id fav + i
        state["t2d"].zero_()
        state["t2d"][fav:fav + 512] = True

    draft = make_speculators_draft(tmp_path_factory.mktemp("ranker") / "d",
                                   target=tiny_target_dir, draft_vocab=512)
    return edit_state(draft, rig)


@pytest.fixture()
def files(tmp_path):
    recs = [_rec(f"self-{i:06d}", p, 10 + i) for i, p in enumerate(PROMPTS)]
    return {"greedy": [_write(tmp_path / "gen" / "g.jsonl", recs)],
            "eval": _write(tmp_path / "gen" / "eval.jsonl", [_rec("eval-1", "held out", 7)])}


def _cfg(out, files, target, ranker, **weak):
    return AtScaleConfig.from_dict(dict(
        out=str(out), target=str(target), greedy=files["greedy"],
        eval_conversations=files["eval"], data_tokens=[BASE, 0], regen_tokens=None,
        tokens_per_run=4096, live_dtype="float32", live_batch_size=8, seeds=[0, 1],
        train={"max_tokens_per_batch": 256}, weak={"ranker": str(ranker), **WEAK, **weak}))


def _tau(row):
    return 1 + sum(k * c for k, c in enumerate(row["accept_histogram"])) / row["verify_ct"]


def test_ranking_picks_the_lowest_tau_candidates(tmp_path, files, ranker, tiny_target,
                                                 tiny_target_dir):
    from eagle3lab.specdec.accept import Arm, measure_acceptance

    cfg = _cfg(tmp_path / "st", files, tiny_target_dir, ranker)
    sel = json.loads(rank_weak(cfg, target=tiny_target, device="cpu").read_text())
    pool = [json.loads(x) for x in (tmp_path / "st/pool/greedy.jsonl").read_text().splitlines()]
    base = write_prefix(tmp_path / "st/pool/greedy.jsonl", tmp_path / "base.jsonl", BASE)
    # the candidates: the 12 pool records right after the base prefix
    cands = [r["id"] for r in pool[base["records"]:base["records"] + 12]]
    assert [c["id"] for c in sel["candidates"]] == cands
    assert sel["base"] == {"records": base["records"], "tokens": base["tokens"]}
    assert sel["ranker"]["weights"] == {"model.safetensors": sha256_file(ranker /
                                                                         "model.safetensors")}
    assert sel["setting"] == "2,1,3" and sel["weak"]["n"] == 4
    # the raw counts are the eager engine's on the same prompts (decoded independently)
    by_id = {r["id"]: r for r in pool}
    plist = tmp_path / "cands.jsonl"
    plist.write_text("".join(json.dumps({"id": i, "prompt": by_id[i]["prompt"]}) + "\n"
                             for i in cands))
    eager = measure_acceptance(target=tiny_target, arms=[Arm("r", str(ranker))],
                               prompts=str(plist), limit=None, max_new_tokens=8, steps=2,
                               topk=1, draft_tokens=3, progress=False)["arms"][0]["per_request"]
    for c, e in zip(sel["candidates"], eager):
        assert (c["verify_ct"], c["accept_histogram"]) == (e["verify_ct"], e["accept_histogram"])
        assert c["tau"] == pytest.approx(_tau(c))
    taus = {c["id"]: c["tau"] for c in sel["candidates"]}
    assert min(taus.values()) < max(taus.values())  # the ranker fails on some prompts
    weak = sel["weak_ids"]
    assert len(weak) == 4 == len(set(weak))
    assert max(taus[i] for i in weak) <= min(t for i, t in taus.items() if i not in weak)
    # random: 4 distinct candidates, disjoint from the base and the held-out prompts
    rnd = sel["random_ids"]
    assert len(set(rnd)) == 4 and set(rnd) <= set(cands)
    assert not set(rnd) & {r["id"] for r in pool[:base["records"]]} and "eval-1" not in rnd
    # seeded: the same seed picks the same on a fresh study, another seed another pick
    again = json.loads(rank_weak(_cfg(tmp_path / "st2", files, tiny_target_dir, ranker),
                                 target=tiny_target, device="cpu").read_text())
    assert again["random_ids"] == rnd and again["weak_ids"] == weak
    other = json.loads(rank_weak(_cfg(tmp_path / "st3", files, tiny_target_dir, ranker,
                                      selection_seed=1), target=tiny_target,
                                 device="cpu").read_text())
    assert set(other["random_ids"]) != set(rnd) and other["weak_ids"] == weak
    # the groups' tau: ratios of sums over the picks' raw counts
    pick = [c for c in sel["candidates"] if c["id"] in weak]
    assert sel["tau"]["weak"] == pytest.approx(
        1 + sum(k * n for c in pick for k, n in enumerate(c["accept_histogram"]))
        / sum(c["verify_ct"] for c in pick))
    assert sel["tau"]["weak"] <= sel["tau"]["random"]


def test_ranking_resumes_and_ranks_again_for_another_config(tmp_path, files, ranker,
                                                            tiny_target, tiny_target_dir):
    cfg = _cfg(tmp_path / "st", files, tiny_target_dir, ranker)
    path = rank_weak(cfg, target=tiny_target, device="cpu")
    before = path.read_bytes()
    # made for this config: returned without decoding (a target that cannot load is unused)
    assert rank_weak(cfg, target=str(tmp_path / "no-such-target"), device="cpu") == path
    assert path.read_bytes() == before
    # another n: ranked again
    rank_weak(_cfg(tmp_path / "st", files, tiny_target_dir, ranker, n=3), target=tiny_target,
              device="cpu")
    assert len(json.loads(path.read_text())["weak_ids"]) == 3


def test_plan_adds_the_weak_and_random_arms(tmp_path, files, ranker, tiny_target,
                                            tiny_target_dir):
    cfg = _cfg(tmp_path / "st", files, tiny_target_dir, ranker)
    with pytest.raises(UserError) as e:  # no selection yet: one line
        prepare_study(cfg)
    assert "\n" not in str(e.value) and "run `bench/study_gpu.py weak`" in str(e.value)
    sel_path = rank_weak(cfg, target=tiny_target, device="cpu")
    sel = json.loads(sel_path.read_text())
    study = prepare_study(cfg)
    names = [a["name"] for a in study["arms"]]
    weak_names = ["weak-0.15k+4-s0", "random-0.15k+4-s0", "weak-0.15k+4-s1",
                  "random-0.15k+4-s1"]
    # after the seed-0 core, before the other seeds
    assert names[:2] == ["data-0.15k-wd0.01-s0", "data-all-wd0.01-s0"]
    assert names[2:6] == weak_names and names[6] == "data-0.15k-wd0.01-s1"
    assert study["weak_selection"]["sha256"] == sha256_file(sel_path)
    arms = {a["name"]: a for a in study["arms"]}
    base_file = Path(arms["data-0.15k-wd0.01-s0"]["data"]["path"])
    base_lines = base_file.read_text().splitlines()
    for name in weak_names:
        a = arms[name]
        d = a["data"]
        recs = [json.loads(x) for x in Path(d["path"]).read_text().splitlines()]
        assert Path(d["path"]).read_text().splitlines()[:len(base_lines)] == base_lines
        added = [r["id"] for r in recs[len(base_lines):]]
        assert sorted(added) == sorted(sel[f"{a['selection']}_ids"])
        assert d["records"] == len(recs) == sel["base"]["records"] + 4
        assert d["tokens"] == sum(r["response_tokens"] for r in recs)
        assert d["added_tokens"] == sum(r["response_tokens"] for r in recs[len(base_lines):])
        assert d["selection_sha256"] == sha256_file(sel_path)
        assert d["sha256"] == sha256_file(d["path"])
        meta = json.loads(Path(d["path"] + ".meta.json").read_text())
        assert meta["target"] == "tiny" and "derived_from" in meta
        t = a["train"]  # equal compute, online, on its own data
        assert t["conversations"] == d["path"] and t["max_tokens"] == 4096 and t["online"]
        assert a["seed"] == int(name[-1]) and a["weight_decay"] == 0.01
    assert arms["weak-0.15k+4-s0"]["data"]["path"] == arms["weak-0.15k+4-s1"]["data"]["path"]
    assert arms["weak-0.15k+4-s0"]["data"]["path"] != arms["random-0.15k+4-s0"]["data"]["path"]
    # a selection made for another weak block is refused by the plan, in one line
    other = _cfg(tmp_path / "st", files, tiny_target_dir, ranker, n=3)
    with pytest.raises(UserError, match="made for another weak block") as e:
        prepare_study(other)
    assert "\n" not in str(e.value)


def _bench():
    spec = importlib.util.spec_from_file_location("study_gpu_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_stages_one_line_collect_and_restore(tmp_path, files, ranker, tiny_target_dir,
                                                   capsys):
    w = tmp_path / "w"
    _write(w / "gen" / "g.jsonl", [json.loads(x) for x in
                                   Path(files["greedy"][0]).read_text().splitlines()])
    _write(w / "gen" / "eval.jsonl", [_rec("eval-1", "held out", 7)])
    cfgp = tmp_path / "config.json"
    cfgp.write_text(json.dumps({
        "target": str(tiny_target_dir), "greedy": ["gen/g.jsonl"],
        "eval_conversations": "gen/eval.jsonl", "data_tokens": [BASE], "regen_tokens": None,
        "seeds": [0], "weight_decays": [0.01], "tokens_per_run": 4096,
        "live_dtype": "float32", "live_batch_size": 8,
        "weak": {"ranker": str(ranker), **WEAK, "seeds": [0]}}))
    # plan before weak: one line, exit 1 (the script's error contract)
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "plan", "--work", str(w),
                        "--config", str(cfgp)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert len(lines) == 1 and "run `bench/study_gpu.py weak`" in lines[0]
    bench = _bench()
    assert bench.main(["weak", "--work", str(w), "--device", "cpu", "--config", str(cfgp)]) == 0
    sel = w / "study" / WEAK_SELECTION
    made = sel.read_bytes()
    assert bench.main(["weak", "--work", str(w), "--device", "cpu", "--config",
                       str(cfgp)]) == 0
    assert "already made for this config; not ranked again" in capsys.readouterr().out
    # the ranker moved (same weights, another path): still not ranked again, and plan
    # takes the selection (it is known by its weights)
    moved = tmp_path / "moved-ranker"
    shutil.copytree(ranker, moved)
    cfg = json.loads(cfgp.read_text())
    cfg["weak"]["ranker"] = str(moved)
    cfgp.write_text(json.dumps(cfg))
    assert bench.main(["weak", "--work", str(w), "--device", "cpu", "--config",
                       str(cfgp)]) == 0
    assert "already made for this config; not ranked again" in capsys.readouterr().out
    assert sel.read_bytes() == made
    assert bench.main(["plan", "--work", str(w), "--config", str(cfgp)]) == 0
    assert "2 weak-spots runs among them: weak-0.15k+4-s0" in capsys.readouterr().out
    res = collect(w / "study", tmp_path / "res")
    assert (tmp_path / "res" / WEAK_SELECTION).read_bytes() == made and res["runs"] == []
    # a later session: restore puts the selection back before plan (so weak does not rank
    # again) and says the runs come after the plan
    w2 = tmp_path / "w2"
    assert bench.main(["restore", "--work", str(w2), "--results", str(tmp_path / "res")]) == 0
    out = capsys.readouterr().out
    assert "restored the weak-spots selection" in out and "no plan in" in out
    assert (w2 / "study" / WEAK_SELECTION).read_bytes() == made


def test_committed_config_keeps_the_finished_runs():
    """data/studies/h200-grok: the weak block adds arms and changes no other: the finished
    runs committed there keep their names (restore finds them) and their settings, and the
    other arms keep their order."""
    raw = json.loads((ROOT / "data/studies/h200-grok/config.json").read_text())
    # the drafter that ranked the weak arms: the shipped one then, the -sglang one now
    assert raw["weak"]["ranker"] == "data/drafters/smollm2-135m-instruct-sglang"
    assert (ROOT / raw["weak"]["ranker"] / "config.json").is_file()
    with_weak = AtScaleConfig.from_dict({**raw, "out": "o"})
    without = AtScaleConfig.from_dict({**{k: v for k, v in raw.items() if k != "weak"},
                                       "out": "o"})
    arms, plain = plan_arms(with_weak), plan_arms(without)
    names = [a["name"] for a in arms]
    assert [n for n in names if not n.startswith(("weak-", "random-"))] == [
        a["name"] for a in plain]
    done = [p.name for p in (ROOT / "data/studies/h200-grok/runs").iterdir() if p.is_dir()]
    assert set(done) <= set(names)
    by = {a["name"]: a for a in arms}
    for a in plain:
        if a["name"] in done:
            assert by[a["name"]] == a
            assert train_kwargs(with_weak, by[a["name"]] | {"data": {"tokens": 1}}, "f") == \
                train_kwargs(without, a | {"data": {"tokens": 1}}, "f")
    weak_at = [i for i, n in enumerate(names) if n.startswith(("weak-", "random-"))]
    assert len(weak_at) == 4 and weak_at == list(range(weak_at[0], weak_at[0] + 4))
    seed0 = [i for i, a in enumerate(arms) if a["seed"] == 0 and a["weight_decay"] == 0.01
             and a["kind"] != "weak"]
    assert max(seed0) < weak_at[0] and arms[weak_at[-1] + 1]["seed"] == 1
    assert "data-1.6M+1000" not in names and "weak-1.6M+1000-s1" in names


# --- the read side, from planted counts ------------------------------------------------------
def _plant(run_dir: Path, *, tau: float, loss: float, acc: float) -> None:
    """run.json, metrics.jsonl and live.json as `train` and `measure_live` write them: the
    final drafter's live counts give tau (completion tokens / verify steps) at each shape."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": k * 10, "epoch": 0, "tokens": k * 1000, "wall_s": float(k),
         "eval": {"loss": [loss + (5 - k) * 0.1], "full_acc": [acc - (5 - k) * 0.01],
                  "cond_acc": [0.5]}})
        + "\n" for k in range(6)))
    (run_dir / "run.json").write_text(json.dumps({
        "status": "done", "summary": {"steps": 50, "tokens": 5000, "wall_s": 5.0}}))
    rows = [{"fraction": 1.0, "step": 50, "tokens": 5000, "path": "x", "setting": s,
             "requests": 4, "completion_tokens": round(1000 * (tau + d)), "verify_ct": 1000,
             "accept_histogram": [1000]} for s, d in (("3,1,4", -0.2), ("5,1,6", 0.0))]
    (run_dir / "live.json").write_text(json.dumps({"run": run_dir.name, "rows": rows}))


def _planted_study(root: Path, values: dict, *, weak: bool = True, skip=()) -> Path:
    """A plan with data arms 1.6k and all plus the weak arms at base 1.6k (2 seeds), each
    run planted from `values[(kind, seed)]` = (tau at 5,1,6, eval loss, eval acc)."""
    cfg = AtScaleConfig.from_dict(dict(
        out=str(root), target="t", greedy=["g.jsonl"], eval_conversations="e.jsonl",
        data_tokens=[1600, 0], weight_decays=[0.01], regen_tokens=None,
        tokens_per_run=5000, live_settings=["3,1,4", "5,1,6"],
        weak={"ranker": "r", "base_tokens": 1600, "candidates": 30, "n": 10} if weak else None))
    arms = plan_arms(cfg)
    for a in arms:
        extra = 220 if a.get("selection") == "weak" else 200 if a.get("selection") else 0
        a["data"] = {"path": "d", "records": 1, "tokens": (a["unique_tokens"] or 9000) + extra,
                     "sha256": "0"}
        a["train"] = {}
    root.mkdir(parents=True)
    (root / "study.json").write_text(json.dumps({
        "format": "eagle3lab-study-atscale", "version": 1, "config": cfg.model_dump(),
        "pool": {}, "steps_per_run": 50, "arms": arms}))
    for a in arms:
        kind = a.get("selection") or ("base" if a["unique_tokens"] == 1600 else "all")
        if a["name"] in skip or (kind, a["seed"]) not in values:
            continue
        tau, loss, acc = values[(kind, a["seed"])]
        _plant(root / "runs" / a["name"], tau=tau, loss=loss, acc=acc)
    return root


def _values(weak, random, base, spread):
    """(tau, loss, acc) per (pick, seed): seed 0 low by spread/2, seed 1 high."""
    return {(k, s): (v + (spread / 2 if s else -spread / 2), 5.0 - v, 0.1 * v)
            for k, v in (("weak", weak), ("random", random), ("base", base), ("all", 2.0))
            for s in (0, 1)}


def test_weak_vs_random_from_planted_counts(tmp_path):
    res = load_results(_planted_study(tmp_path / "win", _values(2.4, 2.1, 2.0, 0.04)))
    v = weak_vs_random(res)
    t = v["table"].set_index("arm")
    # means and spreads of the planted counts (tau = completion tokens / verify steps)
    assert t.loc["weak", "tau@5,1,6"] == pytest.approx(2.4)
    assert t.loc["weak", "tau@5,1,6_max"] - t.loc["weak", "tau@5,1,6_min"] == \
        pytest.approx(0.04)
    assert t.loc["random", "tau@3,1,4"] == pytest.approx(1.9)
    assert t.loc["base alone (1.6k)", "tau@5,1,6"] == pytest.approx(2.0)
    assert t.loc["weak", "eval_loss_mean"] == pytest.approx(2.6)
    assert t.loc["weak", "eval_full_acc_0"] == pytest.approx(0.24)
    assert t.loc["weak", "seeds"] == [0, 1] and t.loc["weak", "unique_tokens"] == 1820
    assert v["decisive"] and v["weak_better"] and v["metric"] == "live tau at 5,1,6"
    assert v["gap"] == pytest.approx(0.3) and v["seed_spread"] == pytest.approx(0.04)
    assert v["text"].startswith("Weak spots vs random at equal compute (1.6k unique answer "
                                "tokens + 10 conversations each): the weak-spot prompts beat "
                                "random ones: live tau at 5,1,6 weak 2.40 vs random 2.10")
    assert "beyond the seed spread 0.04 over 2 seeds" in v["text"]
    assert "the base alone 2.00 over seed(s) 0, 1 (weak +0.4, random +0.1)" in v["text"]
    assert "eval loss 2.6 vs 2.9" in v["text"] and "1.82k vs 1.8k" in v["text"]
    # the weak arms are rows of the equal-compute table too, after the data arms
    assert sorted(equal_compute_table(res)["arm"])[-2:] == ["random-1.6k+10", "weak-1.6k+10"]
    # a gap inside the seed spread: a tie within seed noise
    tie = weak_vs_random(load_results(_planted_study(tmp_path / "tie",
                                                     _values(2.12, 2.1, 2.0, 0.2))))
    assert tie["decisive"] is False and "tie within seed noise" in tie["text"]
    assert "within the seed spread" in tie["text"]
    # one seed of each pick: the spread is unknown, and said so
    one = weak_vs_random(load_results(_planted_study(
        tmp_path / "one", _values(2.0, 2.3, 2.0, 0.0),
        skip=("weak-1.6k+10-s1", "random-1.6k+10-s1"))))
    assert one["decisive"] is None and "one seed: spread unknown" in one["text"]
    assert "random prompts came out ahead of the weak-spot ones" in one["text"]
    # nothing finished yet, and no weak arms at all: one line each
    none = weak_vs_random(load_results(_planted_study(
        tmp_path / "none", _values(2.0, 2.0, 2.0, 0.0),
        skip=[a["name"] for a in json.loads((tmp_path / "one/study.json").read_text())["arms"]
              if a["kind"] == "weak"])))
    assert none["text"].endswith("0 of 2 weak and 0 of 2 random runs finished; nothing to "
                                 "compare yet.")
    plain = weak_vs_random(load_results(_planted_study(tmp_path / "plain",
                                                       _values(2.0, 2.0, 2.0, 0.0),
                                                       weak=False)))
    assert plain["table"] is None and plain["text"].startswith("No weak-spots arms")
    assert not math.isnan(v["gap"]) and np.isfinite(v["weak"])


@pytest.mark.slow
def test_notebook_section_renders_the_comparison_or_one_line(tmp_path):
    from eagle3lab.report.kernel import execute_notebook

    nb = json.loads((ROOT / "notebooks/06_grokking_vs_data.ipynb").read_text())
    tags = [set(c.get("metadata", {}).get("tags", [])) for c in nb["cells"]]
    assert sum("weak" in t for t in tags) == 2, "06 has a weak-spots section (2 cells)"
    assert all("atscale" in t for t in tags if "weak" in t)  # part of the at-scale section
    # the parameters, the cell that reads the results (`atscale`), the weak-spots cells
    opens = next(i for i, c in enumerate(nb["cells"]) if "open_results(" in "".join(c["source"]))
    nb["cells"] = [c for i, (c, t) in enumerate(zip(nb["cells"], tags))
                   if t & {"parameters", "weak"} or i == opens]
    path = tmp_path / "06-weak.ipynb"
    path.write_text(json.dumps(nb))
    for name, weak in (("with", True), ("without", False)):
        study = _planted_study(tmp_path / name, _values(2.4, 2.1, 2.0, 0.04), weak=weak)
        out = tmp_path / f"{name}.ipynb"
        execute_notebook(str(path), str(out), kernel_name="python3", progress_bar=False,
                         parameters={"atscale_dir": str(study)}, cwd=str(tmp_path))
        cells = json.loads(out.read_text())["cells"]
        ours = [c for c in cells if "weak" in c.get("metadata", {}).get("tags", [])
                and c["cell_type"] == "code"]
        text = "".join("".join(o.get("text", "")) for o in ours[0].get("outputs", []))
        want = weak_vs_random(load_results(study))["text"]
        assert text.startswith(want + "\n")
        if not weak:  # one line, nothing else
            assert text.strip() == want and not any(
                "data" in o for o in ours[0]["outputs"])
