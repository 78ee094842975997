"""eagle3lab.study.atscale_read: the at-scale study's committed results read back (runs by
status, curves, live tau from raw counts, plateaus and late drops), the equal-compute table
with the seed spread, the verdict, the planner, and the notebook sections rendering them.

Three kinds of fixture: curves and tau points from known formulas (the plateau/late-drop
rule and the planner must recover what was built in); a study whose files are written
from known per-arm numbers in the committed layout (the verdict must name the arm that was
built to win, and call a gap inside the seed noise a tie); and a REAL tiny study on the
default target (demo shards, drafters trained offline, `atscale.live_tau` decoding on the
CPU, `atscale.collect` copying what is committed), read back and checked against the raw
files it came from."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eagle3lab.errors import UserError
from eagle3lab.study.atscale import (AtScaleConfig, collect, measure_live, measure_reference,
                                     plan_arms)
from eagle3lab.study.atscale_read import (FINAL_METRICS, against_reference, arm_name, compare,
                                          equal_compute_table,
                                          final_values, fit_tau_curve, load_results,
                                          open_results, plan_budget, planned_recipes,
                                          planner_points,
                                          plateau_check, summary_numbers, tokens_for, verdict,
                                          _short)

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
#: The study's reference "shipped" (bench/study_chain.sh): the drafter that was the default
#: when the study set its bar, shipped on as the SGLang-servable one.
SHIPPED = (Path(__file__).resolve().parents[2] / "data" / "drafters"
           / "smollm2-135m-instruct-sglang")


# --- plateau and late drop on curves built from formulas ----------------------------------
def _curve(tokens, losses):
    return pd.DataFrame({"tokens": tokens, "eval_loss_mean": losses})


def test_plateau_check_finds_the_first_plateau_and_a_late_drop():
    xs = np.arange(0, 2100, 100.0)
    flat = 5.0 + 2.0 * np.exp(-xs / 100)  # falls, then flat from ~400 on
    drop = flat.copy()
    drop[xs >= 1500] *= 0.9  # a late 10% fall after a long plateau
    steady = plateau_check(_curve(xs, flat), window=3, threshold=0.01, drop_threshold=0.02)
    late = plateau_check(_curve(xs, drop), window=3, threshold=0.01, drop_threshold=0.02)
    # the first call is where the rule says "plateaued" on the shortest prefix
    from eagle3lab.study.plateau import detect_plateau

    for e in range(4, len(xs) + 1):
        p = detect_plateau(_curve(xs[:e], flat[:e]), "eval_loss_mean", window=3, threshold=0.01)
        if p.plateaued:
            break
    assert steady.first_start == p.start and steady.first_called_at == xs[e - 1]
    assert late.first_start == steady.first_start  # the same curve until the drop
    assert steady.late_drop is False and steady.plateaued
    assert steady.past_plateau == pytest.approx(xs[-1] / steady.first_start)
    assert late.late_drop is True and late.drop_at == 1500
    assert late.drop_fraction == pytest.approx(1500 / xs[-1])
    assert late.drop_relative == pytest.approx(1 - drop.min() / late.first_level)
    assert "LATE DROP" in late.describe() and "no late drop" in steady.describe()
    # a drop smaller than the threshold is no late drop
    small = flat.copy()
    small[xs >= 1500] *= 0.99
    assert plateau_check(_curve(xs, small), drop_threshold=0.02).late_drop is False


def test_plateau_check_on_a_curve_that_never_plateaus_and_on_accuracy():
    xs = np.arange(0, 1000, 100.0)
    falling = 6.0 * 0.9 ** (xs / 100)  # 10% better every point
    pc = plateau_check(_curve(xs, falling))
    assert pc.first_start is None and pc.late_drop is None and not pc.plateaued
    assert "never plateaued" in pc.describe()
    # accuracies improve upwards: a late RISE is the drop's counterpart
    acc = np.minimum(0.5, 0.1 + xs / 1000)
    acc = np.where(xs >= 800, acc * 1.2, acc)
    df = pd.DataFrame({"tokens": xs, "eval_full_acc_0": acc})
    up = plateau_check(df, "eval_full_acc_0", window=2)
    assert up.late_drop is True and up.drop_at == 800


# --- the planner on curves from formulas --------------------------------------------------
SIZES = [1e5, 4e5, 1.6e6, 6e6, 2e7]


def _tau(t, c=3.6, a=1.2, b=0.3, t0=1e6):
    return c - a * (t / t0) ** -b


def test_fit_recovers_a_known_saturating_curve():
    fit = fit_tau_curve([(t, _tau(t), s) for t in SIZES for s in (0, 1)])
    assert fit.model == "saturating" and fit.ceiling == pytest.approx(3.6, abs=1e-6)
    assert fit.predict(3e7) == pytest.approx(_tau(3e7), abs=1e-6)
    for goal in (3.0, 3.5):
        truth = 1e6 * (1.2 / (3.6 - goal)) ** (1 / 0.3)
        need = tokens_for(fit, goal)
        assert need.reachable and need.estimate == pytest.approx(truth, rel=1e-4)
        assert need.low <= need.estimate <= need.high
        est, low, high = need.as_tuple()
        assert (low, high) == (need.low, need.high)
    # with seed noise (0.02 in tau, two seeds) the 90% range holds the truth in most draws
    truth = 1e6 * (1.2 / 0.6) ** (1 / 0.3)
    held = ceiling_held = 0
    for k in range(20):
        rng = np.random.default_rng(k)
        noisy = fit_tau_curve([(t, _tau(t) + rng.normal(0, 0.02), s) for t in SIZES
                               for s in (0, 1)], n_boot=100)
        need = tokens_for(noisy, 3.0)
        held += need.low <= truth <= need.high
        lo, hi = noisy.ceiling_range()
        ceiling_held += lo <= 3.6 <= hi
    assert held >= 14 and ceiling_held >= 14, (held, ceiling_held)


def test_a_ceiling_below_the_goal_is_out_of_reach():
    fit = fit_tau_curve([(t, _tau(t, c=2.6)) for t in SIZES])
    need = tokens_for(fit, 3.0)
    assert not need.reachable and need.as_tuple() == "out of reach"
    assert need.estimate is None and "out of reach" in need.text and "2.6" in need.text
    assert tokens_for(fit, 2.0).reachable  # below the ceiling it is not


def test_few_sizes_fit_a_line_in_log_tokens_and_one_size_is_refused():
    fit = fit_tau_curve([(1e5, 1.8), (1e6, 2.2), (1e7, 2.6)])
    assert fit.model == "log-linear" and fit.ceiling is None
    need = tokens_for(fit, 3.0)
    assert need.estimate == pytest.approx(1e8, rel=1e-6) and "optimistic" in need.text
    falling = fit_tau_curve([(1e5, 2.0), (1e6, 1.9)])
    assert not tokens_for(falling, 3.0).reachable
    two = tokens_for(fit_tau_curve([(1e5, 1.8), (1e6, 2.2)]), 3.0)  # 2 points, 2 parameters
    assert two.low is None and two.high is None and "no range" in two.text
    with pytest.raises(UserError, match="at least two"):
        fit_tau_curve([(1e5, 1.8), (1e5, 1.9)])
    with pytest.raises(UserError, match="tokens > 0"):
        fit_tau_curve([(0, 1.8), (1e5, 1.9)])


def test_compare_against_the_seed_spread():
    a = pd.Series({"m_n": 2, "m": 2.0, "m_min": 1.95, "m_max": 2.05})
    b = pd.Series({"m_n": 2, "m": 2.5, "m_min": 2.4, "m_max": 2.6})
    c = compare(b, a, "m")
    assert c.gap == pytest.approx(0.5) and c.spread == pytest.approx(0.2) and c.decisive
    near = pd.Series({"m_n": 2, "m": 2.1, "m_min": 1.9, "m_max": 2.3})
    assert compare(near, a, "m").decisive is False
    one = pd.Series({"m_n": 1, "m": 2.5, "m_min": 2.5, "m_max": 2.5})
    assert compare(one, a, "m").decisive is None
    assert "spread unknown" in compare(one, a, "m").uncertainty()


# --- a study written from known per-arm numbers, in the committed layout -------------------
def _write_run(run_dir: Path, *, loss: float, tau: dict[str, float], tokens: int,
               drop_late: bool = False, status: str = "done", settings=()) -> None:
    """run.json, metrics.jsonl and live.json as `train` and `measure_live` write them:
    eval loss falling to `loss` and flat, live tau `tau[setting]` at half and full run."""
    run_dir.mkdir(parents=True)
    xs = np.linspace(0, tokens, 21)
    lines = []
    for k, x in enumerate(xs):
        v = loss + 2.0 * math.exp(-x / (tokens / 20))
        if drop_late and x >= 0.8 * tokens:
            v *= 0.9
        acc = 0.5 - 0.1 * (v - loss)
        lines.append({"step": k * 10, "epoch": 0, "tokens": int(x), "wall_s": float(k),
                      "eval": {"loss": [v, v + 0.2], "full_acc": [acc, acc * 0.8],
                               "cond_acc": [acc, 0.8]}})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "run.json").write_text(json.dumps({
        "status": status, "summary": {"steps": 200, "tokens": tokens, "wall_s": 20.0,
                                      "tokens_per_s": tokens / 20.0} if status == "done"
        else None, "progress": {"step": 200, "tokens": tokens, "wall_s": 20.0}}))
    rows = [{"fraction": f, "step": int(200 * f), "tokens": int(tokens * f), "path": "x",
             "setting": s, "tau": tau[s] - (1 - f) * 0.2, "requests": 4,
             "completion_tokens": round(1000 * (tau[s] - (1 - f) * 0.2)), "verify_ct": 1000,
             "accept_histogram": [1000], "acceptance_cumulative": [], "per_prompt_tokens": [],
             "per_prompt_verify": [], "seconds": 1.0}
            for f in (0.5, 1.0) for s in settings]
    (run_dir / "live.json").write_text(json.dumps({"run": run_dir.name, "engine": "static",
                                                   "rows": rows}))


def _synthetic_study(root: Path, *, tau_of, noise: float, late: str | None = None,
                     skip=(), recipe_sizes: list[int] | None = None) -> Path:
    """The planner's own arms (data 100 / 400 / 1.6k unique tokens x weight decays 0.01 and
    0.1 x seeds 0 and 1; regeneration at 400; a speculators recipe at 400), each run's
    numbers from `tau_of(arm)` plus +-`noise` by seed; eval loss falls where tau rises."""
    cfg = AtScaleConfig.from_dict(dict(
        out=str(root), target="t", greedy=["g.jsonl"], eval_conversations="e.jsonl",
        data_tokens=[100, 400, 1600], regen_tokens=400, recipes={"speculators": {}},
        recipe_tokens=[400], tokens_per_run=10_000, live_settings=["3,1,4", "5,1,6"],
        recipe_tokens_by={"speculators": recipe_sizes} if recipe_sizes else {}))
    arms = plan_arms(cfg)
    for a in arms:
        a["data"] = {"path": "d", "records": 1, "tokens": a["unique_tokens"], "sha256": "0"}
        a["train"] = {}
    (root / "study.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "study.json").write_text(json.dumps({
        "format": "eagle3lab-study-atscale", "version": 1, "config": cfg.model_dump(),
        "pool": {}, "steps_per_run": 200, "arms": arms}))
    for a in arms:
        if skip == "all" or a["name"] in skip:
            continue
        base = tau_of(a) + (noise if a["seed"] else -noise)
        _write_run(root / "runs" / a["name"], loss=8.0 - base, tokens=10_000,
                   tau={"3,1,4": base - 0.2, "5,1,6": base}, drop_late=a["name"] == late,
                   settings=cfg.live_settings)
    return root


def _more_data_wins(a):
    return 1.5 + 0.3 * math.log10(a["unique_tokens"] / 100) + (
        0.1 if a["kind"] == "regen" and a["pair"] == "both" else 0.0) - (
        0.05 if a["recipe"] == "speculators" else 0.0) + (
        0.02 if a["weight_decay"] == 0.1 else 0.0)


def test_verdict_names_the_arm_built_to_win(tmp_path):
    res = load_results(_synthetic_study(tmp_path / "s", tau_of=_more_data_wins, noise=0.01,
                                        late="data-0.4k-wd0.01-s1"))
    table = equal_compute_table(res)
    big = table[table["arm"] == "data-1.6k-wd0.01"].iloc[0]
    small = table[table["arm"] == "data-0.1k-wd0.01"].iloc[0]
    assert big["seeds"] == 2 and big["tau@5,1,6"] == pytest.approx(_more_data_wins(
        {"unique_tokens": 1600, "kind": "data", "pair": False, "recipe": "eagle3lab",
         "weight_decay": 0.01}), abs=1e-3)
    assert big["tau@5,1,6_max"] - big["tau@5,1,6_min"] == pytest.approx(0.02, abs=2e-3)
    v = verdict(res)
    assert v["more_data_wins"] and v["decisive"] and v["metric"] == "live tau at 5,1,6"
    assert v["text"].startswith("At equal compute (10,000 tokens per run), more data (1.6k "
                                "unique answer tokens) beat longer training on less (100)")
    assert f"{big['tau@5,1,6']:.2f} vs {small['tau@5,1,6']:.2f}" in v["text"]
    assert "beyond the seed spread" in v["text"]
    assert "late drop in eval loss (grokking?) in 1 of" in v["text"]
    assert "data-0.4k-wd0.01-s1" in v["text"]
    joined = " ".join(v["sentences"])
    assert "Weight decay 0.1 vs 0.01: better live tau at 5,1,6 at 3 of 3 data sizes" in joined
    assert "Regeneration at 400 unique answer tokens" in joined and "best both" in joined
    assert "Recipe at 400 unique answer tokens" in joined and "best eagle3lab" in joined
    # the planner on the final drafters: tau rises 0.3 per decade, three sizes: log-linear
    plan = plan_budget(res, goals=(3.0,))
    assert plan["fit"].model == "log-linear"
    # (tau is read back from counts: completion tokens rounded per 1000 verify steps)
    assert plan["fit"].params["a"] == pytest.approx(0.3, abs=2e-3)
    assert plan["needs"][0].estimate == pytest.approx(100 * 10 ** ((3.0 - 1.5) / 0.3),
                                                      rel=0.1)
    numbers = summary_numbers(res)
    assert numbers["atscale_runs_done"] == len(res.arms) and numbers["atscale_verdict"] == v["text"]
    assert numbers["atscale_tokens_for_tau_3"] == pytest.approx(plan["needs"][0].estimate)


def test_the_planner_fits_each_recipe_given_its_own_data_sizes(tmp_path):
    """A recipe with its own data sizes (config recipe_tokens_by) gets its own planner, fit
    on its arms alone, with its numbers in the report under its name; ours is unchanged."""
    res = load_results(_synthetic_study(tmp_path / "s", tau_of=_more_data_wins, noise=0.01,
                                        recipe_sizes=[100, 400, 1600]))
    assert planned_recipes(res) == ["eagle3lab", "speculators"]
    pts = planner_points(res, recipe="speculators")
    assert sorted({t for t, _, _ in pts}) == [100, 400, 1600] and len(pts) == 6
    ours, theirs = plan_budget(res, goals=(3.0,)), plan_budget(res, goals=(3.0,),
                                                               recipe="speculators")
    # built in: the same 0.3 per decade, 0.05 lower: the same slope, a later goal
    assert theirs["fit"].params["a"] == pytest.approx(0.3, abs=2e-3)
    assert theirs["needs"][0].estimate > ours["needs"][0].estimate
    assert theirs["needs"][0].estimate == pytest.approx(
        100 * 10 ** ((3.0 - 1.45) / 0.3), rel=0.1)
    assert theirs["text"].startswith("Planner, the speculators recipe (live tau at 5,1,6)")
    assert "Every point is the speculators recipe trained on 10,000 tokens" in theirs["text"]
    numbers = summary_numbers(res)
    assert numbers["atscale_speculators_tokens_for_tau_3"] == pytest.approx(
        theirs["needs"][0].estimate)
    assert numbers["atscale_tokens_for_tau_3"] == pytest.approx(ours["needs"][0].estimate)
    # one size only (the default recipe_tokens): no planner of its own
    one = load_results(_synthetic_study(tmp_path / "one", tau_of=_more_data_wins, noise=0.01))
    assert planned_recipes(one) == ["eagle3lab"]
    assert plan_budget(one, recipe="speculators")["text"].startswith(
        "Planner (the speculators recipe): 1 finished data size(s)")


def test_less_data_winning_a_tie_and_one_seed_are_said_so(tmp_path):
    less = load_results(_synthetic_study(tmp_path / "less", noise=0.01,
                                         tau_of=lambda a: 3.0 - _more_data_wins(a) + 1.5))
    v = verdict(less)
    assert not v["more_data_wins"] and v["text"].split(", ", 1)[1].startswith(
        "longer training on less data (100 unique answer tokens) beat more data (1.6k)")
    assert "beyond the seed spread" in v["text"]
    tie = load_results(_synthetic_study(tmp_path / "tie", noise=0.5, tau_of=_more_data_wins))
    v = verdict(tie)
    assert v["decisive"] is False and "tie within seed noise" in v["text"]
    assert "within the seed spread" in v["text"] and "no late drop" in v["text"]
    # the second seeds not run yet: one seed, spread unknown; missing runs are listed
    skip = ["data-0.1k-wd0.01-s1", "data-0.4k-wd0.01-s1", "data-1.6k-wd0.01-s1"]
    one = load_results(_synthetic_study(tmp_path / "one", noise=0.01, tau_of=_more_data_wins,
                                        skip=skip))
    assert set(one.arms.loc[one.arms["status"] == "missing", "run"]) == set(skip)
    v = verdict(one)
    assert "one seed: spread unknown" in v["text"] and v["decisive"] is None
    # both seeds trained, one not yet decoded live: its tau has one seed, its loss two
    (tmp_path / "one" / "runs" / "data-0.1k-wd0.01-s0" / "live.json").unlink()
    t = equal_compute_table(load_results(tmp_path / "one"))
    row = t[t["arm"] == "data-0.1k-wd0.01"].iloc[0]
    assert row["seeds"] == 1 and row["tau@5,1,6_n"] == 0
    t2 = equal_compute_table(load_results(tmp_path / "less"))
    (tmp_path / "less" / "runs" / "data-1.6k-wd0.01-s1" / "live.json").unlink()
    t3 = equal_compute_table(load_results(tmp_path / "less"))
    big2, big3 = (x[x["arm"] == "data-1.6k-wd0.01"].iloc[0] for x in (t2, t3))
    assert (big2["seeds"], big2["tau@5,1,6_n"]) == (2, 2)
    assert (big3["seeds"], big3["tau@5,1,6_n"], big3["eval_loss_mean_n"]) == (2, 1, 2)
    # the largest arm's second seed not decoded: the spread the other sizes' seeds
    # measured stands in for its own, and says where it comes from
    v3 = verdict(load_results(tmp_path / "less"))
    assert v3["seed_spread"] == pytest.approx(t3.loc[t3["arm"] == "data-0.4k-wd0.01",
                                                     "tau@5,1,6_max"].iloc[0]
                                              - t3.loc[t3["arm"] == "data-0.4k-wd0.01",
                                                       "tau@5,1,6_min"].iloc[0])
    assert v3["decisive"] is True and v3["seed_spread_from"] == (
        "2 seeds at 100, 400; one at the other sizes")
    assert "beyond the largest seed spread measured, 0.02 (2 seeds at 100, 400; one at " \
        "the other sizes)" in v3["text"]
    assert "more data (1.6k unique answer tokens) came out ahead of longer training" in v["text"]


def test_a_study_with_no_finished_run_renders_a_line(tmp_path):
    res, line = open_results(tmp_path / "nothing-here")
    assert res is None and "no study.json" in line
    root = _synthetic_study(tmp_path / "s", noise=0.0, tau_of=_more_data_wins, skip="all")
    res, line = open_results(root)
    assert res is None and "No finished run yet" in line and "missing" in line
    v = verdict(load_results(root))
    assert v["text"].startswith("Not enough finished data arms")


def test_unreadable_files_are_noted_and_the_rest_renders(tmp_path):
    from eagle3lab.config import repo_root

    root = _synthetic_study(tmp_path / "s", noise=0.01, tau_of=_more_data_wins)
    (root / "runs" / "data-0.1k-wd0.01-s0" / "live.json").write_text("{not json")
    (root / "runs" / "data-0.1k-wd0.01-s1" / "run.json").write_text("")
    live = root / "runs" / "data-1.6k-wd0.01-s0" / "live.json"
    rows = json.loads(live.read_text())
    del rows["rows"][0]["verify_ct"]
    live.write_text(json.dumps(rows))
    res = load_results(root)
    notes = " | ".join(res.notes)
    assert len(res.notes) == 3 and "data-0.1k-wd0.01-s0/live.json is not a live.json" in notes
    assert "data-1.6k-wd0.01-s0/live.json: row 0 has no raw counts" in notes
    assert "data-0.1k-wd0.01-s1/run.json is not readable JSON" in notes
    assert res.arms.set_index("run").loc["data-0.1k-wd0.01-s1", "status"] == "missing"
    assert "Note: " in res.describe() and verdict(res)["text"].startswith("At equal compute")
    (root / "study.json").write_text("{")
    with pytest.raises(UserError, match="study.json is not valid JSON"):
        load_results(root)
    # a relative directory not found from here is the checkout's (the committed results)
    res, line = open_results("data/studies/no-such-study")
    assert res is None and str(repo_root() / "data/studies/no-such-study") in line


# --- a REAL tiny study on the default target ---------------------------------------------
#: Three runs that finish (two seeds of the half-data arm, one of the full-data arm) and
#: one stopped early, all at the same token budget; one planned run never started.
REAL_RUNS = [("data-half-wd0.01-s0", 0.5, 0, 0.01), ("data-half-wd0.01-s1", 0.5, 1, 0.01),
             ("data-all-wd0.01-s0", 1.0, 0, 0.01), ("data-all-wd0.1-s0", 1.0, 0, 0.1)]
MISSING = ("data-all-wd0.01-s1", 1.0, 1, 0.01)
BUDGET = 3000


@pytest.fixture(scope="session")
def real_study(tmp_path_factory, default_target_dir, real_target) -> Path:
    """Demo shards through the default target, drafters trained offline on 8 and 16 of
    them, live tau of each finished run at half and full budget (CPU, 2 held-out prompts,
    8 new tokens, 2,1,3), then `collect`: the committed layout (~60 s)."""
    from eagle3lab.study.sweep import demo_data
    from eagle3lab.train import read_run, train

    root = tmp_path_factory.mktemp("atscale-real")
    d = demo_data(root / "data", target=str(default_target_dir), n_train=16, n_eval=4,
                  draft_vocab_size=256)
    cfg = AtScaleConfig.from_dict(dict(
        out=str(root / "study"), target=str(default_target_dir), greedy=["g.jsonl"],
        eval_conversations="e.jsonl", data_tokens=[500, 0], weight_decays=[0.01, 0.1],
        seeds=[0, 1], tokens_per_run=BUDGET, live_points=[0.5, 1.0], live_settings=["2,1,3"],
        live_limit=2, live_max_new_tokens=8, live_dtype="float32", live_batch_size=2,
        regen_tokens=None))
    arms = []
    for name, frac, seed, wd in REAL_RUNS + [MISSING]:
        out = root / "study" / "runs" / name
        kw = dict(data=d["train"], eval_data=d["eval"], out=str(out), data_fraction=frac,
                  seed=seed, weight_decay=wd, max_tokens=BUDGET, epochs=100,
                  max_tokens_per_batch=256, eval_every=1, checkpoint_every=4,
                  keep_checkpoints=10, lr=1e-3, device="cpu", progress=False)
        if name != MISSING[0]:
            train(**kw, stop_after_steps=2 if wd == 0.1 else None)
        arms.append({"name": name, "kind": "data", "source": "greedy",
                     "unique_tokens": 0 if frac == 1 else 500, "pair": False,
                     "weight_decay": wd, "seed": seed, "recipe": "eagle3lab", "train": kw})
    for a in arms:  # the actual unique answer tokens: what each run trained on
        run = root / "study" / "runs" / a["name"]
        tokens = read_run(run)["data"]["tokens_per_epoch"] if (run / "run.json").is_file() \
            else None
        a["data"] = {"path": d["train"], "records": None, "tokens": tokens, "sha256": None}
    (root / "study" / "study.json").write_text(json.dumps({
        "format": "eagle3lab-study-atscale", "version": 1, "config": cfg.model_dump(),
        "pool": {}, "steps_per_run": None, "arms": arms}))
    for name, *_ in REAL_RUNS[:3]:
        measure_live(root / "study", name, target=real_target, device="cpu")
    measure_reference(root / "study", drafter=SHIPPED, name="shipped", target=real_target,
                      device="cpu")
    collect(root / "study", root / "committed")
    return root / "committed"


def _count_decodes(monkeypatch, real) -> list[tuple[float, str]]:
    """Patch atscale.live_tau to note each (fraction, setting) it measures: the list."""
    import eagle3lab.study.atscale as atscale

    measured: list[tuple[float, str]] = []

    def counting(**kw):
        inner = kw["on_row"]

        def note(row):
            measured.append((row["fraction"], row["setting"]))
            inner(row)

        return real(**{**kw, "on_row": note})

    monkeypatch.setattr(atscale, "live_tau", counting)
    return measured


@pytest.mark.real
@pytest.mark.slow
def test_live_decode_cut_short_keeps_its_rows_and_resumes(real_study, real_target, tmp_path,
                                                          monkeypatch):
    """A live decode stopped after its first row (a deadline, a lost machine) leaves a
    live.json with that row, the final drafter's, marked incomplete, and the reader says
    so; the next measure_live decodes only what is missing, and the whole file equals an
    uninterrupted decode's."""
    import shutil

    import eagle3lab.study.atscale as atscale

    name = REAL_RUNS[0][0]
    src, dst = real_study.parent / "study", tmp_path / "study"
    shutil.copytree(src / "runs" / name, dst / "runs" / name)
    shutil.copyfile(src / "study.json", dst / "study.json")
    (dst / "runs" / name / "live.json").unlink()
    real = atscale.live_tau

    class Cut(Exception):
        pass

    def cut_after_one(**kw):
        def once(row):
            kw_on_row(row)
            raise Cut

        kw_on_row = kw["on_row"]
        return real(**{**kw, "on_row": once})

    monkeypatch.setattr(atscale, "live_tau", cut_after_one)
    with pytest.raises(Cut):
        measure_live(dst, name, target=real_target, device="cpu")
    part = json.loads((dst / "runs" / name / "live.json").read_text())
    assert part["complete"] is False and len(part["rows"]) == 1
    assert part["rows"][0]["fraction"] == 1.0  # the final drafter first
    assert not atscale.live_complete(dst / "runs" / name)
    collect(dst, tmp_path / "res")
    res = load_results(tmp_path / "res")
    assert any("the live decode stopped before its last point (1 row(s) measured)" in n
               for n in res.notes)
    assert list(res.live["fraction"]) == [1.0]

    measured = _count_decodes(monkeypatch, real)
    measure_live(dst, name, target=real_target, device="cpu")
    whole = json.loads((dst / "runs" / name / "live.json").read_text())
    assert measured == [(0.5, "2,1,3")]  # the kept row was not measured again
    assert whole["complete"] is True and atscale.live_complete(dst / "runs" / name)
    assert [r["fraction"] for r in whole["rows"]] == [0.5, 1.0]
    assert whole["rows"][1] == part["rows"][0]
    ref = json.loads((src / "runs" / name / "live.json").read_text())
    keys = ("fraction", "setting", "tau", "completion_tokens", "verify_ct",
            "accept_histogram", "per_prompt_tokens", "per_prompt_verify")
    assert [[r[k] for k in keys] for r in whole["rows"]] == \
        [[r[k] for k in keys] for r in ref["rows"]]
    assert {e: v["serves"] for e, v in whole["serving"].items()} == \
        {e: v["serves"] for e, v in ref["serving"].items()}  # `via` names the run's path
    # a truncated live.json: not complete, and one line naming it and the fix
    (dst / "runs" / name / "live.json").write_text('{"rows": [')
    assert not atscale.live_complete(dst / "runs" / name)
    with pytest.raises(UserError, match=r"The live tau file .*live.json is not valid JSON "
                       r"\(line 1, column 11: .*\)\. Delete it: the next call decodes"):
        measure_live(dst, name, target=real_target, device="cpu")


@pytest.mark.real
@pytest.mark.slow
def test_early_live_decode_then_the_rest(real_study, real_target, tmp_path, monkeypatch):
    """--live-early: while a run trains (no final drafter yet), measure_live(early=True)
    decodes the points its checkpoints have settled and leaves live.json incomplete (what a
    poll returns if the machine is then lost); called again it measures nothing; after the
    run, the decode measures only the final drafter, and the file equals an uninterrupted
    decode's."""
    import shutil

    import eagle3lab.study.atscale as atscale

    name = REAL_RUNS[0][0]
    src, dst = real_study.parent / "study", tmp_path / "study"
    shutil.copytree(src / "runs" / name, dst / "runs" / name)
    shutil.copyfile(src / "study.json", dst / "study.json")
    run = dst / "runs" / name
    (run / "live.json").unlink()
    (run / "final").rename(tmp_path / "final")  # still training
    measured = _count_decodes(monkeypatch, atscale.live_tau)
    measure_live(dst, name, target=real_target, device="cpu", early=True)
    part = json.loads((run / "live.json").read_text())
    assert measured == [(0.5, "2,1,3")]
    assert part["complete"] is False and [r["fraction"] for r in part["rows"]] == [0.5]
    assert part["serving"] is None and not atscale.live_complete(run)
    measure_live(dst, name, target=real_target, device="cpu", early=True)
    assert measured == [(0.5, "2,1,3")]  # nothing new settled: nothing decoded
    (tmp_path / "final").rename(run / "final")  # the run has finished
    measure_live(dst, name, target=real_target, device="cpu")
    assert measured == [(0.5, "2,1,3"), (1.0, "2,1,3")]
    whole = json.loads((run / "live.json").read_text())
    ref = json.loads((src / "runs" / name / "live.json").read_text())
    assert whole["complete"] is True and atscale.live_complete(run)
    keys = ("fraction", "setting", "tau", "accept_histogram", "per_prompt_tokens")
    assert [[r[k] for k in keys] for r in whole["rows"]] == \
        [[r[k] for k in keys] for r in ref["rows"]]


@pytest.mark.real
@pytest.mark.slow
def test_real_study_read_back_from_its_files(real_study):
    res = load_results(real_study)
    status = dict(zip(res.arms["run"], res.arms["status"]))
    assert status == {"data-half-wd0.01-s0": "done", "data-half-wd0.01-s1": "done",
                      "data-all-wd0.01-s0": "done", "data-all-wd0.1-s0": "running",
                      "data-all-wd0.01-s1": "missing"}
    assert not any((real_study / "runs" / r / "checkpoints").exists() for r in status)
    for _, a in res.arms[res.arms["status"] == "done"].iterrows():
        run = json.loads((real_study / "runs" / a["run"] / "run.json").read_text())
        assert a["tokens"] == run["summary"]["tokens"] >= BUDGET
        assert a["unique_tokens"] == run["data"]["tokens_per_epoch"]
    half, full = (res.arms.set_index("run").loc[r, "unique_tokens"]
                  for r in ("data-half-wd0.01-s0", "data-all-wd0.01-s0"))
    assert half < full
    # live: tau from the summed raw counts = the per-prompt counts summed = what was written
    for _, r in res.live.iterrows():
        raw = json.loads((real_study / "runs" / r["run"] / "live.json").read_text())["rows"]
        row = next(x for x in raw if x["step"] == r["step"] and x["setting"] == r["setting"])
        assert r["tau"] == pytest.approx(sum(row["per_prompt_tokens"])
                                         / sum(row["per_prompt_verify"]))
        assert r["tau"] == pytest.approx(row["tau"]) and r["requests"] == 2
        assert r["sim_chain"] is not None and r["eval_tokens"] is not None
    assert sorted(res.live["run"].unique()) == sorted(r for r, s in status.items()
                                                      if s == "done")
    # the shipped drafter, decoded as the runs' final drafters are: same prompts and shape
    raw = json.loads((real_study / "references/shipped/live.json").read_text())
    assert raw["reference"] == "shipped" and raw["complete"] is True
    assert raw["serving"]["vllm"]["serves"] is True
    ref = res.references
    assert list(ref["reference"]) == ["shipped"] and list(ref["setting"]) == ["2,1,3"]
    row = raw["rows"][0]
    assert ref["tau"].iloc[0] == pytest.approx(sum(row["per_prompt_tokens"])
                                               / sum(row["per_prompt_verify"]))
    assert ref["requests"].iloc[0] == 2
    vs = against_reference(res)  # 5,1,6 not measured here: the shape that was
    best = res.live[res.live["final"] & res.live["run"].isin(res.done)]
    best = best.loc[best["tau"].idxmax()]
    assert vs["setting"] == "2,1,3" and vs["best_run"] == best["run"]
    finals = res.live[res.live["final"] & res.live["run"].isin(res.done)
                      & (res.live["setting"] == "2,1,3")]
    means = finals.groupby(finals["run"].map(arm_name))["tau"].mean()
    # the best arm by its seeds' mean (the tiny target's arms may tie: either is the best)
    assert vs["best_arm_tau"] == pytest.approx(means.max())
    assert means[vs["best_arm"]] == pytest.approx(means.max())
    assert set(vs["best_arm_runs"]) == {r for r in finals["run"]
                                        if arm_name(r) == vs["best_arm"]}
    assert vs["reference_tau"] == pytest.approx(ref["tau"].iloc[0])
    assert vs["replaces"] == (best["tau"] > ref["tau"].iloc[0])
    assert ("does not replace it." if not vs["replaces"] else "replaces it.") in vs["text"]
    assert set(res.live["fraction"]) == {0.5, 1.0}
    # curves: every eval line of every run that has metrics
    for run in ("data-half-wd0.01-s0", "data-all-wd0.1-s0"):
        lines = [json.loads(x) for x in (real_study / "runs" / run / "metrics.jsonl")
                 .read_text().splitlines()]
        got = res.curves[(res.curves["run"] == run) & res.curves["eval_loss_mean"].notna()]
        assert len(got) == sum(1 for x in lines if x.get("eval"))
    # plateaus: one row per run with curves, consistent with the rule on its own curve
    assert set(res.plateaus["run"]) == {r for r, s in status.items() if s != "missing"}
    for _, p in res.plateaus.iterrows():
        c = res.curves[res.curves["run"] == p["run"]]
        again = plateau_check(c, "eval_loss_mean")
        assert p["first_start"] == again.first_start and p["late_drop"] == again.late_drop
        assert p["text"] == again.describe()


@pytest.mark.real
@pytest.mark.slow
def test_real_study_table_verdict_and_planner(real_study):
    res = load_results(real_study)
    fin = final_values(res)
    assert sorted(fin["run"]) == sorted(res.done)
    from eagle3lab.train.counts import read_metrics

    for _, f in fin.iterrows():  # the last logged value of each metric, per run
        df = read_metrics(real_study / "runs" / f["run"])
        for m in FINAL_METRICS:
            assert f[m] == pytest.approx(df[m].dropna().iloc[-1])
    table = equal_compute_table(res)
    half = table[table["arm"] == "data-half-wd0.01"].iloc[0]
    seeds = fin[fin["arm"] == "data-half-wd0.01"]
    assert half["seeds"] == 2 and half["seeds_planned"] == 2
    assert half["eval_loss_mean"] == pytest.approx(seeds["eval_loss_mean"].mean())
    assert half["tau@2,1,3_min"] == pytest.approx(seeds["tau@2,1,3"].min())
    assert half["tau@2,1,3_max"] == pytest.approx(seeds["tau@2,1,3"].max())
    assert "data-all-wd0.1" not in set(table["arm"])  # not finished: not at equal compute
    v = verdict(res)  # 5,1,6 not measured here: the verdict reads the shape that was
    assert v["metric"] == "live tau at 2,1,3"
    full = table[table["arm"] == "data-all-wd0.01"].iloc[0]
    wins = full["tau@2,1,3"] > half["tau@2,1,3"]
    assert v["more_data_wins"] == wins
    # the whole pool has one seed: the half arm's two seeds give the spread, named as such
    assert v["seed_spread"] == pytest.approx(half["tau@2,1,3_max"] - half["tau@2,1,3_min"])
    assert v["seed_spread_from"] == (f"2 seeds at {_short(float(half['unique_tokens']))}; "
                                     "one at the other sizes")
    assert v["decisive"] == (abs(full["tau@2,1,3"] - half["tau@2,1,3"]) > v["seed_spread"])
    assert ("tie exactly" in v["text"]) == (full["tau@2,1,3"] == half["tau@2,1,3"])
    assert f"{full['tau@2,1,3']:.2f} vs {half['tau@2,1,3']:.2f}" in v["text"]
    pts = planner_points(res, setting="2,1,3")
    assert sorted(p[0] for p in pts) == sorted([half["unique_tokens"]] * 2
                                               + [full["unique_tokens"]])
    plan = plan_budget(res, setting="2,1,3", goals=(3.0, 3.5))
    assert plan["fit"].model == "log-linear" and len(plan["needs"]) == 2
    assert [n.as_tuple() for n in plan["needs"]] == [
        tokens_for(fit_tau_curve(pts), g).as_tuple() for g in (3.0, 3.5)]


def _section(notebook: str, out: Path) -> Path:
    """The notebook's parameters cell and its at-scale section (cells tagged `atscale`),
    as a notebook of their own: the section must run from the parameters alone."""
    nb = json.loads((NOTEBOOKS / notebook).read_text())
    tags = [set(c.get("metadata", {}).get("tags", [])) for c in nb["cells"]]
    assert sum("atscale" in t for t in tags) >= 2, f"{notebook} has no at-scale section"
    nb["cells"] = [c for c, t in zip(nb["cells"], tags) if t & {"parameters", "atscale"}]
    out.write_text(json.dumps(nb))
    return out


def _execute(path: Path, params: dict) -> tuple[str, int, dict]:
    from eagle3lab.report.kernel import execute_notebook

    from eagle3lab.report.summary import read_summary

    execute_notebook(str(path), str(path), kernel_name="python3", progress_bar=False,
                     parameters=params, cwd=str(path.parent))
    nb = json.loads(path.read_text())
    texts, images = [], 0
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            t = o.get("text") or o.get("data", {}).get("text/plain", "")
            texts.append(t if isinstance(t, str) else "".join(t))
            images += "image/png" in o.get("data", {})
    return "\n".join(texts), images, read_summary(nb) or {}


@pytest.mark.slow
@pytest.mark.parametrize("notebook", ["06_grokking_vs_data.ipynb", "02_training_curves.ipynb"])
def test_notebook_sections_say_one_line_without_results(tmp_path, notebook):
    text, images, numbers = _execute(_section(notebook, tmp_path / notebook),
                                     {"atscale_dir": str(tmp_path / "absent")})
    assert f"No at-scale results in {tmp_path / 'absent'}" in text
    assert images == 0 and not any(k.startswith("atscale") for k in numbers)


@pytest.mark.real
@pytest.mark.slow
def test_notebook_sections_render_the_real_study(tmp_path, real_study):
    text, images, numbers = _execute(_section("06_grokking_vs_data.ipynb", tmp_path / "06.ipynb"),
                                     {"atscale_dir": str(real_study)})
    res = load_results(real_study)
    assert res.describe() in text
    v = verdict(res)
    assert v["text"] in text and numbers["atscale_verdict"] == v["text"]
    assert numbers["atscale_runs_done"] == 3 and numbers["atscale_runs_planned"] == 5
    assert against_reference(res)["text"] in text
    assert numbers["atscale_reference_tau"] == pytest.approx(res.references["tau"].iloc[0])
    plan = plan_budget(res)  # 5,1,6 not measured in this tiny study: the shape that was
    assert plan["setting"] == "2,1,3" and plan["fit"].model == "log-linear"
    assert plan["text"] in text and all(n.text in text for n in plan["needs"])
    assert images >= 5  # curves, equal-compute table, live tau, curves vs serving, planner
    text2, images2, _ = _execute(_section("02_training_curves.ipynb", tmp_path / "02.ipynb"),
                                 {"atscale_dir": str(real_study)})
    assert images2 == 1 and res.describe() in text2
    for run in res.plateaus["run"]:
        assert run in text2


def test_long_runs_are_read_apart_from_equal_compute(tmp_path):
    """Long runs (their own token count, constant rate) are not rows of the equal-compute
    table; the verdict gets their own sentence: how far past the first plateau each went
    and whether eval loss dropped late."""
    from eagle3lab.study.atscale_read import long_runs

    root = tmp_path / "s"
    cfg = AtScaleConfig.from_dict(dict(
        out=str(root), target="t", greedy=["g.jsonl"], eval_conversations="e.jsonl",
        data_tokens=[100, 1600], weight_decays=[0.01], seeds=[0], regen_tokens=None,
        tokens_per_run=10_000, live_settings=["5,1,6"],
        long=[{"data_tokens": [100], "tokens_per_run": 50_000, "weight_decays": [0.01, 0.1]}]))
    arms = plan_arms(cfg)
    for a in arms:
        a["data"] = {"path": "d", "records": 1, "tokens": a["unique_tokens"], "sha256": "0"}
    (root).mkdir(parents=True)
    (root / "study.json").write_text(json.dumps({
        "format": "eagle3lab-study-atscale", "version": 1, "config": cfg.model_dump(),
        "pool": {}, "steps_per_run": 200, "arms": arms}))
    for a in arms:
        tokens = a.get("tokens_per_run", 10_000)
        _write_run(root / "runs" / a["name"], loss=6.0 if "100" in a["name"] else 5.0,
                   tau={"5,1,6": 1.5}, tokens=tokens, settings=["5,1,6"],
                   drop_late=a["name"] == "long-0.1k-50k-wd0.1-s0")
    res = load_results(root)
    assert set(equal_compute_table(res)["kind"]) == {"data"}
    long = long_runs(res)
    assert list(long["run"]) == ["long-0.1k-50k-wd0.01-s0", "long-0.1k-50k-wd0.1-s0"]
    assert list(long["tokens"]) == [50_000, 50_000]
    assert (long["past_plateau"] > 4).all()
    assert list(long["late_drop"]) == [False, True]
    s = [x for x in verdict(res)["sentences"] if x.startswith("Far past the plateau")]
    assert len(s) == 1 and "2 of 2 long run(s) at least 4x past it; constant rate" in s[0]
    assert "100 wd 0.1: plateaued at" in s[0] and "a late drop of" in s[0]
    assert "100 wd 0.01: plateaued at" in s[0] and "no late drop" in s[0]
    # a study without long arms has no such table
    assert long_runs(load_results(_synthetic_study(tmp_path / "plain", noise=0.01,
                                                   tau_of=_more_data_wins))) is None


def test_long_sentence_names_a_recipe_other_than_ours():
    """A long run of another recipe (the speculators candidate) says so in the sentence;
    ours stays unnamed, as in every study before long blocks had recipes."""
    import pandas as pd

    from eagle3lab.study.atscale_read import long_sentence

    row = dict(unique_tokens=18_293_581.0, weight_decay=0.01, tokens=32_000_000.0,
               first_start=27_600_000.0, past_plateau=1.16, late_drop=False,
               drop_relative=0.003, drop_fraction=None)
    long = pd.DataFrame([{**row, "recipe": "eagle3lab", "schedule": "cosine"},
                         {**row, "recipe": "speculators", "schedule": "linear"}])
    text = long_sentence(long)
    assert "18.3M wd 0.01 (cosine rate): plateaued at 27.6M tokens" in text
    assert "18.3M wd 0.01, speculators recipe (linear rate): plateaued at" in text
    assert "0 of 2 long run(s)" in text


@pytest.fixture(scope="module")
def committed():
    """The committed study (data/studies/h200-grok) read once for the tests that only read
    it; each test leaves it as it found it."""
    return load_results(Path(__file__).resolve().parents[2] / "data/studies/h200-grok")


def test_planner_names_what_its_ceiling_is_not_a_ceiling_of(committed):
    """On the committed H200 study: our recipe's data arms at 16M tokens fit a ceiling near
    2.0, and the planner says which final drafters went past it (speculators' recipe on the
    whole pool at 128M and 64M tokens, on 6M tokens at 64M, on the whole pool at 32M), best
    first, one per arm (its best seed, saying of how many) and at most four, so nobody
    reads the ceiling as the target's."""

    res = committed
    plan = plan_budget(res)
    ceiling = plan["fit"].ceiling
    fin = final_values(res).set_index("run")["tau@5,1,6"]
    assert plan["setting"] == "5,1,6" and 1.9 < ceiling < 2.2
    assert (fin["long-speculators-all-32M-wd0.01-s0"] > fin["recipe-speculators-1.6M-s0"]
            > fin["long-all-32M-wd0.01-s0"] > ceiling)
    tail = plan["text"].split("Past that ceiling: ")[1]
    # the 128M run (one seed, session 24: 2.840), then the 64M run's better seed (seed 1,
    # 2.754 against seed 0's 2.751, since session 19)
    long = "long-speculators-all-128M-wd0.01-s0"
    assert tail.startswith(f"{long} {fin[long]:.2f} (speculators recipe, 18.3M unique answer "
                           "tokens, 128M tokens of training); ")
    best = max(("long-speculators-all-64M-wd0.01-s0", "long-speculators-all-64M-wd0.01-s1"),
               key=fin.get)
    assert best == "long-speculators-all-64M-wd0.01-s1"
    assert (f"; {best} {fin[best]:.2f} (speculators recipe, 18.3M unique answer tokens, 64M "
            "tokens of training; best of 2 seeds); ") in tail
    named = re.findall(r"(?:^|; )(\S+) (\d\.\d\d) \(", tail)
    # the 6M arm at 64M: seed 0 (2.700) against seed 1's 2.685 (an H100, session 20)
    six = max(("long-speculators-6M-64M-wd0.01-s0", "long-speculators-6M-64M-wd0.01-s1"),
              key=fin.get)
    assert six == "long-speculators-6M-64M-wd0.01-s0"
    # four at most: speculators' recipe at equal compute (2.51) is left out since session 24
    assert [n for n, _ in named] == [long, best, six, "long-speculators-all-32M-wd0.01-s0"]
    assert [float(t) for _, t in named] == sorted((float(t) for _, t in named), reverse=True)
    assert (f"{six} {fin[six]:.2f} (speculators recipe, 6M unique answer tokens, 64M tokens "
            "of training; best of 2 seeds)") in tail
    assert "data-" not in tail


def test_compute_planner_answers_train_longer_on_the_committed_study(committed, tmp_path):
    """On the committed H200 study: the speculators recipe on the whole pool (18.3M unique
    answer tokens, weight decay 0.01) at 16M, 32M, 64M and 128M tokens of training (two
    seeds at 16M since session 15 and at 64M since session 19, their means; 128M since
    session 24). Four lengths: a saturating fit with a ranged ceiling between 3.0 and 3.5
    at 5,1,6, so tau 3 needs ~1.1G tokens of training (more than the longest run, in tokens
    of training, not the data planner's unique answer tokens) and 3.5 is out of reach on
    this data. Without the 128M run (the study as session 23 left it): three lengths, a
    log-linear (optimistic) fit, the measured gains per doubling (each adds less) and the
    ceiling their geometric decay implies (~3.01, no range), which the 128M run then
    passed by little (its gain shrank less than geometrically)."""
    from eagle3lab.study.atscale_read import compute_recipes, plan_compute, three_point_ceiling

    res = committed
    fin = final_values(res).set_index("run")["tau@5,1,6"]
    seeds16 = [fin["recipe-speculators-all-s0"], fin["recipe-speculators-all-s1"]]
    seeds64 = [fin["long-speculators-all-64M-wd0.01-s0"],
               fin["long-speculators-all-64M-wd0.01-s1"]]
    t128 = fin["long-speculators-all-128M-wd0.01-s0"]
    taus = [sum(seeds16) / 2, fin["long-speculators-all-32M-wd0.01-s0"],
            sum(seeds64) / 2, t128]  # the means over seeds at 16M and 64M
    plan = plan_compute(res)
    fit, text = plan["fit"], plan["text"]
    assert plan["setting"] == "5,1,6" and plan["recipe"] == "speculators"
    assert sorted(fit.points) == sorted([(16e6, t) for t in seeds16] + [(32e6, taus[1])]
                                        + [(64e6, t) for t in seeds64] + [(128e6, t128)])
    assert text.startswith("Compute planner, the speculators recipe (live tau at 5,1,6 against "
                           "tokens of training; 18.3M unique answer tokens, weight decay 0.01")
    d = [b - a for a, b in zip(taus, taus[1:])]
    assert 0 < d[2] < d[1] < d[0]
    assert (f"{d[0]:+.3f} from 16M to 32M, {d[1]:+.3f} from 32M to 64M, {d[2]:+.3f} from 64M "
            "to 128M: each doubling adds less" in text)
    assert fit.model == "saturating" and 3.0 < fit.ceiling < 3.3
    assert f"ceiling {fit.ceiling:.3g} (90% range " in text
    need, far = plan["needs"]
    assert need.goal == 3.0 and need.reachable and 128e6 * 4 < need.estimate < 4e9
    assert need.low < need.estimate < need.high
    assert need.text.startswith(f"tau 3 needs ~{_short(need.estimate)} tokens of training (")
    assert "x the longest run measured)" in need.text
    assert far.goal == 3.5 and not far.reachable
    assert "tau 3.5 is out of reach: the fitted ceiling" in text
    assert plan["numbers"]["compute_speculators_ceiling_3pt"] is None
    assert plan["numbers"]["compute_speculators_tokens_for_tau_3_5"] == "out of reach"
    assert "unique answer tokens (" not in text and need.text in text
    # notebook 06 plots it on its own axis: tokens of training, the ceiling drawn
    import matplotlib.pyplot as plt

    from eagle3lab.study.plots import plot_tau_fit

    fig = plot_tau_fit(fit, needs=plan["needs"], x_label="tokens of training",
                       title="Compute planner")
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("tokens of training") and ax.get_title() == \
        "Compute planner"
    labels = ax.get_legend_handles_labels()[1]
    assert {"measured", "saturating fit", f"ceiling {fit.ceiling:.3g}", "goal 3"} <= set(labels)
    plt.close(fig)
    # the study as it stood before the 128M run: three lengths
    before = tmp_path / "h200-grok"
    shutil.copytree(res.study_dir, before, ignore=lambda d, names: [
        n for n in names if n == "long-speculators-all-128M-wd0.01-s0" or n.startswith(
            "session-")])
    three_res = load_results(before)
    plan3 = plan_compute(three_res)
    text3, need3 = plan3["text"], plan3["needs"][0]
    assert plan3["fit"].model == "log-linear"
    assert f"tau {taus[0]:.3f} at 16M, " in text3
    assert (f"{d[0]:+.3f} from 16M to 32M, {d[1]:+.3f} from 32M to 64M: each doubling adds "
            "less" in text3)
    three = three_point_ceiling([16e6, 32e6, 64e6], taus[:3])
    r = d[1] / d[0]
    assert three["ratio"] == pytest.approx(r) and 0.65 < r < 0.75
    assert three["ceiling"] == pytest.approx(taus[2] + d[1] * r / (1 - r))
    assert 2.9 < three["ceiling"] < 3.1
    # the 128M run's gain shrank less than the geometric decay's next term
    assert d[2] > d[1] * r
    assert plan3["numbers"]["compute_speculators_ceiling_3pt"] == pytest.approx(
        three["ceiling"])
    assert (f"a ceiling of ~{three['ceiling']:.3g} (an extrapolation from three points, no "
            "range)") in text3
    assert need3.goal == 3.0 and need3.reachable and 64e6 < need3.estimate < math.inf
    assert "the longest run measured; log-linear fit: no ceiling, optimistic" in need3.text
    assert "3 training lengths are too few for a ceiling" in text3
    assert plan["numbers"]["compute_speculators_tokens_for_tau_3"] == pytest.approx(
        need.estimate)
    numbers = summary_numbers(res)
    assert numbers["atscale_compute_speculators_tokens_for_tau_3"] == pytest.approx(
        need.estimate)
    assert numbers["atscale_compute_speculators_ceiling_3pt"] is None
    assert numbers["atscale_compute_speculators_ceiling"] == pytest.approx(fit.ceiling)
    low, high = numbers["atscale_compute_speculators_ceiling_range"]
    assert 3.0 < low < fit.ceiling < high < 3.5
    assert "speculators" in compute_recipes(res)
    # the data planner's words are its own, unchanged
    data = plan_budget(res, recipe="speculators")
    assert all("unique answer tokens (" in n.text for n in data["needs"] if n.reachable)
    # the 6M arms: two lengths now (16M and 64M, two seeds each since session 20), a fit
    # without a ceiling
    six = plan_compute(res, unique_tokens=float(final_values(res).set_index("run").loc[
        "recipe-speculators-6M-s0", "unique_tokens"]))
    assert sorted(x for x, _ in six["fit"].points) == [16e6, 16e6, 64e6, 64e6]
    assert six["numbers"]["compute_speculators_ceiling_3pt"] is None
    assert six["text"].startswith("Compute planner, the speculators recipe (live tau at 5,1,6 "
                                  "against tokens of training; 6M unique answer tokens")
    assert "(per doubling: " in six["text"] and "one step, no bend to see" in six["text"]
    # one training length only (1.6M): no fit, one line saying why
    one = plan_compute(res, unique_tokens=float(final_values(res).set_index("run").loc[
        "recipe-speculators-1.6M-s0", "unique_tokens"]))
    assert one["fit"] is None and one["numbers"] == {}
    assert one["text"] == ("Compute planner (the speculators recipe): 1 finished training "
                           "length(s) with live tau at 5,1,6 at 1.6M unique answer tokens, "
                           "weight decay 0.01; it needs at least two.")


def test_data_gain_at_each_training_length_on_the_committed_study(committed):
    """On the committed H200 study: speculators' recipe on 6M and on the whole pool (18.3M
    unique answer tokens), each at 16M and 64M tokens of training. More data gains little at
    the study's equal compute and about three times as much at 64M; the 1.6M arms (one
    length) take no part; the gains are means over seeds, and the largest seed spread of a
    cell (at 16M both sizes have two seeds, at 64M the whole pool since session 19 and 6M
    since session 20) is named. Our recipe has no such pair: one line
    why."""
    from eagle3lab.study.atscale_read import data_by_training

    res = committed
    fin = final_values(res).set_index("run")["tau@5,1,6"]
    gain = data_by_training(res)
    six16 = [fin["recipe-speculators-6M-s0"], fin["recipe-speculators-6M-s1"]]
    all16 = [fin["recipe-speculators-all-s0"], fin["recipe-speculators-all-s1"]]
    all64 = [fin["long-speculators-all-64M-wd0.01-s0"], fin["long-speculators-all-64M-wd0.01-s1"]]
    six64 = [fin["long-speculators-6M-64M-wd0.01-s0"], fin["long-speculators-6M-64M-wd0.01-s1"]]
    want = [(16e6, sum(all16) / 2, sum(six16) / 2, 2, 2),
            (64e6, sum(all64) / 2, sum(six64) / 2, 2, 2)]
    rows = gain["rows"]
    assert [(r["training"], r["seeds_more"], r["seeds_less"]) for r in rows] == [
        (t, a, b) for t, _, _, a, b in want]
    for r, (_, more, less, _, _) in zip(rows, want):
        assert r["tau_more"] == pytest.approx(more) and r["tau_less"] == pytest.approx(less)
        assert r["gain"] == pytest.approx(more - less)
        assert r["more"] == pytest.approx(18_293_581) and r["less"] == pytest.approx(6_000_078)
    g16, g64 = rows[0]["gain"], rows[1]["gain"]
    assert 0 < g16 < 0.03 and 0.03 < g64 < 0.08
    spread = max(max(c) - min(c) for c in (six16, all16, all64, six64))
    text = gain["text"]
    assert text.startswith("Data at each training length, the speculators recipe (live tau "
                           "at 5,1,6, weight decay 0.01), 18.3M vs 6M unique answer tokens: "
                           f"at 16M tokens of training {want[0][1]:.3f} vs {want[0][2]:.3f} "
                           f"({g16:+.3f}; seeds 2 / 2); at 64M tokens of training ")
    assert text.endswith(f"The data gain grows with training: x{g64 / g16:.1f} from 16M to "
                         f"64M (the largest seed spread of any cell: {spread:.3f}).")
    assert gain["numbers"]["datagain_speculators_gain"] == pytest.approx([g16, g64])
    assert summary_numbers(res)["atscale_datagain_speculators_gain"] == pytest.approx(
        [g16, g64])
    # our recipe: 18.3M vs 6M at 16M (two seeds each) and at 32M (session 17, one seed):
    # no gain beyond the seed spread at either length
    ours = data_by_training(res, recipe="eagle3lab")
    o_six16 = [fin["data-6M-wd0.01-s0"], fin["data-6M-wd0.01-s1"]]
    o_all16 = [fin["data-all-wd0.01-s0"], fin["data-all-wd0.01-s1"]]
    o_want = [(16e6, sum(o_all16) / 2, sum(o_six16) / 2, 2, 2),
              (32e6, fin["long-all-32M-wd0.01-s0"], fin["long-6M-32M-wd0.01-s0"], 1, 1)]
    assert [(r["training"], r["seeds_more"], r["seeds_less"]) for r in ours["rows"]] == [
        (t, a, b) for t, _, _, a, b in o_want]
    for r, (_, more, less, _, _) in zip(ours["rows"], o_want):
        assert r["gain"] == pytest.approx(more - less)
    o_spread = max(max(c) - min(c) for c in (o_six16, o_all16))
    assert all(abs(r["gain"]) <= o_spread for r in ours["rows"])
    assert ours["text"].startswith("Data at each training length, our recipe (live tau at "
                                   "5,1,6, weight decay 0.01), 18.3M vs 6M unique answer "
                                   "tokens: at 16M tokens of training ")
    assert ours["text"].endswith("No data gain beyond the seed spread at any training length "
                                 f"(the largest seed spread of any cell: {o_spread:.3f}).")
    assert ours["numbers"]["datagain_eagle3lab_gain"] == pytest.approx(
        [r["gain"] for r in ours["rows"]])


def test_three_point_ceiling_recovers_a_saturating_curve():
    """Three points on tau = c - a x^-b, equally or unequally spaced in log x, give back c;
    gains that do not shrink per log-x give no ceiling."""
    from eagle3lab.study.atscale_read import three_point_ceiling

    def tau(x):
        return 3.0 - 1.2 * (x / 1e6) ** -0.5

    for xs in ([16e6, 32e6, 64e6], [16e6, 48e6, 64e6], [1e6, 2e6, 10e6]):
        got = three_point_ceiling(xs, [tau(x) for x in xs])
        assert got["ceiling"] == pytest.approx(3.0, abs=1e-6)
        assert got["b"] == pytest.approx(0.5, abs=1e-6)
    assert three_point_ceiling([1, 2, 4], [1.0, 1.1, 1.2]) is None  # straight in log x
    assert three_point_ceiling([1, 2, 4], [1.0, 1.1, 1.05]) is None  # a fall


def test_late_drops_on_the_committed_study_carry_live_tau_across_them(committed):
    """Session 17's constant-rate runs (0.1M and 0.4M unique tokens to 48M tokens) and
    session 20's 6M run at 64M: eval loss drops late, and the verdict gives live tau before
    each drop and at the end, read from the runs' own live points. Only a point on the
    plateau counts in the range: the 6M run's last point before its drop (31.1M) and the
    0.4M run's at weight decay 0.1 (23.0M) predate their plateaus (48.6M, 28.6M), so they
    are named with the plateau's start and left out (the 6M run's +0.107 is mostly what it
    learned before its plateau)."""
    res = committed
    v = verdict(res)
    lv, p = res.live, res.plateaus.set_index("run")
    gains, early = [], []
    for run in ("long-100k-48M-wd0.01-s0", "long-100k-48M-wd0.1-s0",
                "long-400k-48M-wd0.01-s0", "long-400k-48M-wd0.1-s0",
                "long-speculators-6M-64M-wd0.01-s1"):
        assert bool(p.loc[run, "late_drop"])
        rows = lv[(lv["run"] == run) & (lv["setting"] == "5,1,6")].sort_values("tokens")
        last = rows[rows["tokens"] <= p.loc[run, "drop_at"]].iloc[-1]
        before, end = last["tau"], rows.iloc[-1]["tau"]
        assert f"{run} (" in v["text"]
        if last["tokens"] >= p.loc[run, "first_start"]:
            assert abs(end - before) < 0.05  # the drop barely reaches live tau
            assert f"live tau {before:.3f} before it, {end:.3f} at the end" in v["text"]
            gains.append(end - before)
        else:
            early.append(run)
            assert (f"live tau {before:.3f} at {_short(last['tokens'])} tokens, before its "
                    f"plateau began at {_short(p.loc[run, 'first_start'])}, {end:.3f} at "
                    "the end") in v["text"]
    assert early == ["long-400k-48M-wd0.1-s0", "long-speculators-6M-64M-wd0.01-s1"]
    assert "across those drops live tau at 5,1,6 moved " in v["text"]
    m = re.search(r"moved ([+-]\d\.\d+) to ([+-]\d\.\d+) \((\d+) run\(s\) with a live point "
                  r"on the plateau before the drop; (\d+) more whose last live point before "
                  r"the drop predates the plateau\)", v["text"])
    assert m is not None and int(m.group(4)) >= len(early)
    assert float(m.group(2)) == pytest.approx(v["late_drop_tau_gain_max"], abs=5e-4)
    assert v["late_drop_tau_gain_max"] >= max(gains)
    assert v["late_drop_tau_gain_max"] < 0.1  # the 6M run's +0.107 is not in it
    assert summary_numbers(res)["atscale_late_drop_tau_gain_max"] == v["late_drop_tau_gain_max"]


def test_regeneration_verdict_on_the_committed_study_has_two_seeds(committed):
    """On the committed H200 study: the three regeneration arms at 1.6M unique answer tokens
    have two seeds each (seed 1 came back on an H100, 2026-12-06), so the regeneration
    sentence names greedy best by a gap beyond the measured seed spread, from the means of
    the runs' own live counts."""
    res = committed
    fin = final_values(res).set_index("run")["tau@5,1,6"]
    mean = {p: (fin[f"regen-{p}-1.6M-s0"] + fin[f"regen-{p}-1.6M-s1"]) / 2
            for p in ("greedy", "sampled", "both")}
    assert mean["greedy"] > max(mean["sampled"], mean["both"])
    line = next(s for s in verdict(res)["sentences"] if s.startswith("Regeneration at"))
    assert line.startswith("Regeneration at 1.6M unique answer tokens: live tau at 5,1,6 "
                           f"greedy {mean['greedy']:.2f}, sampled {mean['sampled']:.2f}, "
                           f"both {mean['both']:.2f}; best greedy (gap ")
    assert "beyond the seed spread" in line and "over 2 seeds" in line


def test_a_late_drop_whose_only_live_point_predates_the_plateau_is_not_in_the_range():
    """A late drop whose last live point before it lies before the plateau began: named with
    the plateau's start, no range and no `late_drop_tau_gain_max` (what the run learned on
    its way to the plateau is not the drop's); with a point on the plateau, the range."""
    from types import SimpleNamespace

    from eagle3lab.study.atscale_read import _grokking

    plateaus = pd.DataFrame([{"run": "r", "status": "done", "first_start": 40e6,
                              "late_drop": True, "drop_at": 50e6, "drop_relative": 0.03,
                              "drop_fraction": 0.8}])
    live = pd.DataFrame([{"run": "r", "setting": "5,1,6", "final": f, "tokens": t, "tau": x}
                         for f, t, x in ((False, 30e6, 2.5), (False, 60e6, 2.6),
                                         (True, 64e6, 2.62))])
    text, numbers = _grokking(SimpleNamespace(plateaus=plateaus, live=live))
    assert ("r (3.0% below its plateau at 80% of the run; live tau 2.500 at 30M tokens, "
            "before its plateau began at 40M, 2.620 at the end)") in text
    assert text.endswith("; no run has a live point on its plateau before the drop (1 whose "
                         "last one predates the plateau)")
    assert "late_drop_tau_gain_max" not in numbers and numbers["late_drops"] == 1
    on = live.assign(tokens=[45e6, 60e6, 64e6])
    text, numbers = _grokking(SimpleNamespace(plateaus=plateaus, live=on))
    assert "live tau 2.500 before it, 2.620 at the end" in text
    assert text.endswith("moved +0.120 to +0.120 (1 run(s) with a live point on the plateau "
                         "before the drop)")
    assert numbers["late_drop_tau_gain_max"] == pytest.approx(0.12)
