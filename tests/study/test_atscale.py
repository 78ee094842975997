"""The at-scale study's plan: one shuffled pool, arms as its prefixes by unique answer
tokens, the pairing of greedy and sampled answers, equal compute, the run order."""

from __future__ import annotations

import json

import pytest

from eagle3lab.errors import UserError
from eagle3lab.study.atscale import (AtScaleConfig, build_pool, live_points, parse_setting,
                                     plan_arms, prepare_study, run_live_points, train_kwargs,
                                     write_prefix)


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _rec(pid, prompt, n, seed=None):
    """A conversation record as regenerate writes it (conversation_record's fields)."""
    return {"id": pid, "category": None, "prompt": prompt, "response": "x" * n,
            "input_ids": [1, 2, 3] + list(range(10, 10 + n)), "loss_mask": [0] * 3 + [1] * n,
            "prompt_tokens": 3, "response_tokens": n, "finish_reason": "stop", "seed": seed}


@pytest.fixture()
def files(tmp_path):
    g0 = _write(tmp_path / "g0.jsonl", [_rec(f"self-{i:06d}", f"prompt {i}", 10 + i)
                                        for i in range(0, 20)])
    # a second greedy part; its first prompt repeats a text of the first part
    g1 = _write(tmp_path / "g1.jsonl", [_rec("self-000020", "prompt 3", 99)]
                + [_rec(f"self-{i:06d}", f"prompt {i}", 10 + i) for i in range(21, 40)])
    s = _write(tmp_path / "s.jsonl", [_rec(f"self-{i:06d}", f"prompt {i}", 5, seed=1234 + i)
                                      for i in range(0, 10)])
    ev = _write(tmp_path / "eval.jsonl", [_rec("eval-1", "held out", 7)])
    return {"greedy": [g0, g1], "sampled": [s], "eval": ev}


def test_pool_dedupes_shuffles_and_pairs(files, tmp_path):
    pool = build_pool(greedy=files["greedy"], sampled=files["sampled"], out=tmp_path / "st",
                      shuffle_seed=3)
    assert pool["greedy"]["records"] == 39 and pool["greedy"]["duplicates_dropped"] == 1
    assert pool["greedy"]["tokens"] == sum(10 + i for i in range(40) if i != 20)
    g = [json.loads(x) for x in (tmp_path / "st/pool/greedy.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in g) == sorted(f"self-{i:06d}" for i in range(40) if i != 20)
    assert [r["id"] for r in g] != sorted(r["id"] for r in g)  # shuffled
    # the sampled answers follow the greedy order
    s = [json.loads(x)["id"] for x in (tmp_path / "st/pool/sampled.jsonl").read_text()
         .splitlines()]
    order = [r["id"] for r in g]
    assert s == sorted(s, key=order.index) and len(s) == 10
    # same inputs: reused; another seed: another order
    assert build_pool(greedy=files["greedy"], sampled=files["sampled"], out=tmp_path / "st",
                      shuffle_seed=3) == pool
    other = build_pool(greedy=files["greedy"], out=tmp_path / "st2", shuffle_seed=4)
    assert other["greedy"]["sha256"] != pool["greedy"]["sha256"]


def test_prefixes_are_nested_and_counted(files, tmp_path):
    build_pool(greedy=files["greedy"], sampled=files["sampled"], out=tmp_path, shuffle_seed=0)
    src = tmp_path / "pool/greedy.jsonl"
    small = write_prefix(src, tmp_path / "a.jsonl", 60)
    big = write_prefix(src, tmp_path / "b.jsonl", 300)
    assert 60 <= small["tokens"] < 60 + 50 and 300 <= big["tokens"]
    a = (tmp_path / "a.jsonl").read_text()
    assert (tmp_path / "b.jsonl").read_text().startswith(a)  # a subset of the larger arm
    sampled = tmp_path / "pool/sampled.jsonl"
    both = write_prefix(src, tmp_path / "both.jsonl", 100, pair="both", sampled=sampled)
    recs = [json.loads(x) for x in (tmp_path / "both.jsonl").read_text().splitlines()]
    ids = [r["id"] for r in recs]
    assert len(ids) == 2 * len(set(ids))  # each prompt answered twice: sampled, then greedy
    assert [r["seed"] is not None for r in recs] == [True, False] * (len(recs) // 2)
    assert both["tokens"] == sum(r["response_tokens"] for r in recs) >= 100
    # the greedy side of the sampled arm: greedy answers to the sampled prompts, in order
    same = write_prefix(src, tmp_path / "same.jsonl", 60, pair="same-prompts", sampled=sampled)
    greedy_ids = [json.loads(x)["id"] for x in (tmp_path / "same.jsonl").read_text()
                  .splitlines()]
    sampled_ids = [json.loads(x)["id"] for x in sampled.read_text().splitlines()]
    assert greedy_ids == sampled_ids[:len(greedy_ids)] and same["tokens"] >= 60
    with pytest.raises(UserError, match="holds only"):
        write_prefix(src, tmp_path / "c.jsonl", 10**9)


def test_plan_order_and_equal_compute(files, tmp_path):
    cfg = AtScaleConfig.from_dict(dict(
        out=str(tmp_path / "st"), target="t", greedy=files["greedy"], sampled=files["sampled"],
        eval_conversations=files["eval"], data_tokens=[60, 0], regen_tokens=40,
        tokens_per_run=4096, recipes={"other": {"ttt_steps": 3}}, recipe_tokens=[60],
        train={"max_tokens_per_batch": 256}))
    names = [a["name"] for a in plan_arms(cfg)]
    # the core comparison (first weight decay, first seed) first, then seed 1, then wd 0.1
    assert names[:6] == ["data-0.06k-wd0.01-s0", "data-all-wd0.01-s0",
                         "regen-greedy-0.04k-s0", "regen-sampled-0.04k-s0",
                         "regen-both-0.04k-s0", "recipe-other-0.06k-s0"]
    assert names[6].endswith("-s1") and names[-1] == "data-all-wd0.1-s1"
    study = prepare_study(cfg)
    assert json.loads((tmp_path / "st/study.json").read_text()) == study
    runs = {a["name"]: a for a in study["arms"]}
    for a in study["arms"]:  # equal compute, online, evaluated on the same conversations
        t = a["train"]
        assert t["max_tokens"] == 4096 and t["online"] and t["eval_conversations"] == files["eval"]
    assert runs["data-all-wd0.01-s0"]["data"]["tokens"] == study["pool"]["greedy"]["tokens"]
    assert runs["recipe-other-0.06k-s0"]["train"]["ttt_steps"] == 3
    assert runs["data-0.06k-wd0.01-s0"]["train"]["ttt_steps"] == 5  # our recipe
    assert runs["regen-sampled-0.04k-s0"]["data"]["path"].endswith("sampled-0.04k.jsonl")
    # one recipe's own data sizes (recipe_tokens_by) in place of recipe_tokens; others keep it
    by = AtScaleConfig.from_dict(dict(
        out="o", target="t", greedy=["g"], eval_conversations="e", data_tokens=[60],
        regen_tokens=None, seeds=[0], weight_decays=[0.01], recipe_tokens=[60],
        recipes={"other": {"ttt_steps": 3}, "third": {}}, recipe_tokens_by={"other": [60, 0]}))
    assert [a["name"] for a in plan_arms(by) if a["kind"] == "recipe"] == [
        "recipe-other-0.06k-s0", "recipe-other-all-s0", "recipe-third-0.06k-s0"]
    with pytest.raises(UserError, match=r"recipe_tokens_by: 'nope' is not a recipe .*other"):
        AtScaleConfig.from_dict(dict(out="o", target="t", greedy=["g"], eval_conversations="e",
                                     recipes={"other": {}}, recipe_tokens_by={"nope": [60]}))
    # a key the study sets itself is refused in its overrides
    with pytest.raises(UserError, match="set by the study"):
        AtScaleConfig.from_dict(dict(out="o", target="t", greedy=["g"], eval_conversations="e",
                                     train={"max_tokens": 5}))
    # the runs train online: online-only overrides are valid, settings online refuses not
    ok = AtScaleConfig.from_dict(dict(out="o", target="t", greedy=["g"], eval_conversations="e",
                                      train={"aux_ids": "1,3,5", "forward_tokens": 1}))
    assert ok.train["aux_ids"] == "1,3,5"
    with pytest.raises(UserError, match="online training has no data workers"):
        AtScaleConfig.from_dict(dict(out="o", target="t", greedy=["g"], eval_conversations="e",
                                     train={"data_workers": 2}))


def test_setting_and_live_points(tmp_path):
    assert parse_setting("5,1,6") == (5, 1, 6)
    with pytest.raises(UserError, match="S,K,D"):
        parse_setting("5,1")
    run = tmp_path / "run"
    for step, tokens in ((10, 1000), (20, 2000), (40, 4000)):
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "checkpoint.json").write_text(json.dumps({"step": step, "tokens": tokens}))
    (run / "final").mkdir()
    (run / "final/config.json").write_text("{}")
    (run / "run.json").write_text(json.dumps({"summary": {"steps": 80, "tokens": 8000}}))
    pts = live_points(run, fractions=[0.125, 0.25, 0.5, 1.0], tokens_per_run=8000)
    assert [(p["step"], p["tokens"]) for p in pts] == [(10, 1000), (20, 2000), (40, 4000),
                                                      (80, 8000)]
    # a run still training (--live-early): only the points a checkpoint at or past them
    # has settled (a later one is farther), never the final drafter
    early = live_points(run, fractions=[0.125, 0.25, 0.5, 1.0], tokens_per_run=8000,
                        reached_only=True)
    assert [(p["fraction"], p["step"]) for p in early] == [(0.125, 10), (0.25, 20), (0.5, 40)]
    early = live_points(run, fractions=[0.125, 0.25, 0.5, 1.0], tokens_per_run=12000,
                        reached_only=True)  # 0.5 x 12000 = 6000: not reached yet
    assert [(p["fraction"], p["step"]) for p in early] == [(0.125, 10), (0.25, 20)]
    assert live_points(tmp_path / "none", fractions=[0.5, 1.0], tokens_per_run=8000,
                       reached_only=True) == []


def test_live_points_measured_on_another_machine_stay(tmp_path):
    """A run carried to a fresh machine (bench/run_carry.py: its newest checkpoint and
    live.json) keeps the points decoded before the carry, whose checkpoints stayed behind;
    the points not measured yet come from the checkpoints here."""
    study_dir = tmp_path / "study"
    run = study_dir / "runs" / "r"
    for step, tokens in ((30, 3000), (35, 3500)):  # the carried one, then one trained here
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "checkpoint.json").write_text(json.dumps({"step": step, "tokens": tokens}))
    study = {"config": {"live_points": [0.125, 0.25, 0.5, 1.0], "tokens_per_run": 8000},
             "arms": [{"name": "r"}]}
    here = [(p["fraction"], p["step"]) for p in run_live_points(study_dir, study, "r")]
    assert here == [(0.125, 30), (0.5, 35)]  # nearest here (0.25's is 0.125's: once)
    old = run / "checkpoints" / "step-10"  # decoded on the first machine, not carried
    (run / "live.json").write_text(json.dumps({"complete": False, "rows": [
        {"fraction": 0.125, "step": 10, "tokens": 1000, "path": str(old), "tau": 1.5},
        {"fraction": 0.25, "step": 30, "tokens": 3000, "tau": 1.6,
         "path": str(run / "checkpoints" / "step-30")}]}))
    pts = run_live_points(study_dir, study, "r")
    assert [(p["fraction"], p["step"], p["tokens"]) for p in pts] == [
        (0.125, 10, 1000), (0.25, 30, 3000), (0.5, 35, 3500)]
    assert pts[0]["path"] == str(old)
    # reached_only (the run still trains): the same measured point, and only settled ones
    early = run_live_points(study_dir, study, "r", reached_only=True)
    assert [(p["fraction"], p["step"]) for p in early] == [(0.125, 10), (0.25, 30)]


def test_committed_config_plans_and_its_recipe_is_speculators():
    """data/studies/h200-grok/config.json is a valid study config, and its "speculators"
    recipe is SPECULATORS_EAGLE3_DEFAULTS less what the study sets itself (weight decay),
    with speculators' 1% warmup written as steps of this study's runs."""
    from pathlib import Path

    from eagle3lab.study.atscale import steps_per_run
    from eagle3lab.train.config import SPECULATORS_EAGLE3_DEFAULTS

    raw = json.loads((Path(__file__).resolve().parents[2] / "data/studies/h200-grok/"
                      "config.json").read_text())
    cfg = AtScaleConfig.from_dict({**raw, "out": "o"})
    rec = dict(cfg.recipes["speculators"])
    warmup = rec.pop("warmup_steps")
    want = {k: v for k, v in SPECULATORS_EAGLE3_DEFAULTS.items() if k != "weight_decay"}
    assert rec == want
    assert warmup == round(0.01 * steps_per_run(cfg, "speculators"))
    assert SPECULATORS_EAGLE3_DEFAULTS["weight_decay"] == cfg.weight_decays[0]


def test_long_arms_run_first_on_their_own_tokens_at_a_constant_rate(files, tmp_path):
    """Long arms: small data trained far past the plateau at a constant learning rate, on
    their own token count; planned before the equal-compute core, the rest unchanged."""
    base = dict(out=str(tmp_path / "st"), target="t", greedy=files["greedy"],
                eval_conversations=files["eval"], data_tokens=[60, 0], regen_tokens=None,
                tokens_per_run=16384, weight_decays=[0.01, 0.1], seeds=[0],
                train={"max_tokens_per_batch": 256})
    plain = plan_arms(AtScaleConfig.from_dict(base))
    cfg = AtScaleConfig.from_dict({**base, "long": [
        {"data_tokens": [60], "tokens_per_run": 65536, "weight_decays": [0.01, 0.1]},
        {"data_tokens": [0], "tokens_per_run": 32768, "schedule": "cosine",
         "weight_decays": [0.01]}]})
    arms = plan_arms(cfg)
    assert [a["name"] for a in arms[:3]] == ["long-0.06k-65.536k-wd0.01-s0",
                                             "long-0.06k-65.536k-wd0.1-s0",
                                             "long-all-32.768k-wd0.01-s0"]
    assert [a["name"] for a in arms[3:]] == [a["name"] for a in plain]
    study = prepare_study(cfg)
    runs = {a["name"]: a for a in study["arms"]}
    long, data = runs["long-0.06k-65.536k-wd0.1-s0"], runs["data-0.06k-wd0.1-s0"]
    assert long["train"]["max_tokens"] == 65536 and long["train"]["schedule"] == "constant"
    assert long["train"]["weight_decay"] == 0.1
    assert data["train"]["max_tokens"] == 16384 and data["train"]["schedule"] == "cosine"
    assert long["data"] == data["data"]  # the same prefix of the pool
    # evaluations and checkpoints spread over the long run's own steps
    assert long["train"]["eval_every"] == 4 * data["train"]["eval_every"]
    more = runs["long-all-32.768k-wd0.01-s0"]["train"]
    assert more["max_tokens"] == 32768 and more["schedule"] == "cosine"
    with pytest.raises(UserError, match="schedule"):
        AtScaleConfig.from_dict({**base, "long": [{"data_tokens": [60], "tokens_per_run": 1,
                                                   "schedule": "step"}]})
    # a long block may train another recipe of the config: named in its runs, trained with
    # that recipe's settings under the block's schedule; an unknown recipe is one line
    spec = {"lr": 0.001, "ttt_steps": 3, "max_tokens_per_batch": 128}
    cfg = AtScaleConfig.from_dict({**base, "recipes": {"speculators": spec}, "long": [
        {"data_tokens": [0], "tokens_per_run": 32768, "schedule": "linear",
         "weight_decays": [0.01], "recipe": "speculators"}]})
    arms = plan_arms(cfg)
    assert arms[0]["name"] == "long-speculators-all-32.768k-wd0.01-s0"
    assert arms[0]["recipe"] == "speculators" and arms[0]["kind"] == "long"
    kw = train_kwargs(cfg, {**arms[0], "data": {"tokens": 10**6}}, "d.jsonl")
    assert (kw["lr"], kw["ttt_steps"], kw["schedule"], kw["max_tokens"]) == (
        0.001, 3, "linear", 32768)
    assert kw["max_tokens_per_batch"] == 128 and kw["eval_every"] == 32768 // 128 // 32
    with pytest.raises(UserError, match=r"long\[0\]\.recipe: 'spec' is not a recipe .*"
                                        r"known: eagle3lab, speculators"):
        AtScaleConfig.from_dict({**base, "recipes": {"speculators": spec}, "long": [
            {"data_tokens": [0], "tokens_per_run": 32768, "recipe": "spec"}]})
    twice = {"data_tokens": [60], "tokens_per_run": 99, "weight_decays": [0.01]}
    with pytest.raises(UserError, match="long-0.06k-0.099k-wd0.01-s0 more than once"):
        plan_arms(AtScaleConfig.from_dict({**base, "long": [twice, twice]}))


def test_a_missing_conversations_file_is_one_line(files, tmp_path):
    with pytest.raises(UserError, match=r"g9\.jsonl do not exist .*unpack"):
        build_pool(greedy=[*files["greedy"], str(tmp_path / "g9.jsonl")], out=tmp_path / "st")
