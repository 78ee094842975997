"""eagle3lab.study.sweep: equal-compute plan, sweep that skips finished and resumes interrupted
runs, the equal-compute table, and the verdict against seed-to-seed spread."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from eagle3lab.errors import UserError
from eagle3lab.study.sweep import (StudyConfig, compare_at_equal_compute, full_epoch_tokens,
                                   plan_study, run_study, summary_numbers, verdict,
                                   verdict_report)

TRAIN = dict(max_tokens_per_batch=512, lr=1e-3, eval_every=0, eval_at_start=False)


def test_plan_gives_every_run_the_same_budget(tmp_path, sharp_data):
    cfg = StudyConfig.from_dict(dict(data=sharp_data["train"], eval_data=sharp_data["eval"],
                                     out=str(tmp_path), data_fractions=[1.0, 0.25],
                                     weight_decays=[0.0, 0.1], seeds=[0, 1], budget_epochs=2.0,
                                     epoch_multipliers=[1.0, 0.5], train=TRAIN))
    plan = plan_study(cfg)
    assert len(plan) == 8 and len({r["run_dir"] for r in plan}) == 8
    full = full_epoch_tokens(sharp_data["train"], 512)
    levels = [round(full), round(2 * full)]
    assert all(r["kwargs"]["max_tokens"] == levels[-1] for r in plan)
    assert all(r["kwargs"]["eval_at_tokens"] == levels for r in plan)
    small = [r for r in plan if r["data_fraction"] == 0.25]
    assert all(r["kwargs"]["epochs"] >= 8 for r in small)  # budget / fraction passes


def test_study_config_is_strict(tmp_path):
    with pytest.raises(UserError, match="set by the study"):
        StudyConfig.from_dict(dict(data="d", out="o", train={"seed": 3}))
    with pytest.raises(UserError, match="unknown field"):
        StudyConfig.from_dict(dict(data="d", out="o", fractions=[0.5]))
    with pytest.raises(UserError, match="data_fractions"):
        StudyConfig.from_dict(dict(data="d", out="o", data_fractions=[0.0]))
    with pytest.raises(UserError) as e:
        StudyConfig.from_dict(dict(data="d", out="o", data_fractions=[0.5, 1.5]))
    assert str(e.value) == ("study config: field 'data_fractions[1]' has value 1.5 (float); "
                            "expected a value less than or equal to 1.")
    with pytest.raises(UserError, match=r"field 'seeds\[0\]' has value '0' \(str\); expected a "
                       "valid integer"):
        StudyConfig.from_dict(dict(data="d", out="o", seeds=["0"]))
    with pytest.raises(UserError, match="field 'budget_epochs' has value 0 .*greater than 0"):
        StudyConfig.from_dict(dict(data="d", out="o", budget_epochs=0))
    with pytest.raises(UserError, match="field 'seeds' .*at least 1 item"):
        StudyConfig.from_dict(dict(data="d", out="o", seeds=[]))
    # the train overrides are TrainConfig fields, checked before any run starts
    with pytest.raises(UserError, match=r"^study.yaml.train: unknown field\(s\) lr_schedle"):
        StudyConfig.from_dict(dict(data="d", out="o", train={"lr_schedle": "cosine"}),
                              "study.yaml")
    with pytest.raises(UserError, match="^study config.train: field 'lr' has value -1"):
        StudyConfig.from_dict(dict(data="d", out="o", train={"lr": -1}))
    cfg = StudyConfig.from_dict(dict(data="d", out="o", budget_epochs=3))
    assert cfg.budget_epochs == 3.0 and list(cfg.model_dump()) == [
        "data", "out", "eval_data", "data_fractions", "weight_decays", "seeds",
        "budget_epochs", "epoch_multipliers", "train"]


def test_sweep_skips_finished_resumes_interrupted_and_compares(tmp_path, sharp_data):
    from eagle3lab.train import train

    cfg = StudyConfig.from_dict(dict(data=sharp_data["train"], eval_data=sharp_data["eval"],
                                     out=str(tmp_path / "study"), data_fractions=[1.0, 0.5],
                                     seeds=[0, 1], budget_epochs=1.0,
                                     epoch_multipliers=[0.5, 1.0], train=TRAIN))
    plan = plan_study(cfg)
    train(**plan[0]["kwargs"], stop_after_steps=1, progress=False)  # an interrupted run
    status = run_study(cfg, progress=False)
    assert all(s == "done" for s in status.values()), status
    again = run_study(cfg, progress=False)
    assert all(s.startswith("done (skipped") for s in again.values())

    table = compare_at_equal_compute(cfg.out)
    assert len(table) == 4 * 2
    for level, t in table.groupby("multiplier"):
        assert t["budget_tokens"].nunique() == 1  # equal compute
        assert (t["tokens"] >= t["budget_tokens"]).all()
        assert (t["tokens"] < t["budget_tokens"] + 512).all()  # the first eval past it
    full_budget = table[table["multiplier"] == 1.0]
    half, whole = (full_budget[full_budget["data_fraction"] == f] for f in (0.5, 1.0))
    assert (half["epochs_over_subset"] > 1.5).all()  # twice the passes over half the data
    assert (whole["epochs_over_subset"] < 1.2).all()
    v = verdict(table)
    assert "At equal compute" in v["text"] and "won" in v["text"]
    assert "seed-to-seed spread" in v["text"] and v["seeds"] == 2
    assert v["decisive"] == (v["gap"] > v["spread"])
    one_seed = verdict(table[table["seed"] == 0])
    assert "spread is unknown" in one_seed["text"] and one_seed["decisive"] is None
    info = json.loads((tmp_path / "study" / "study.json").read_text())
    assert info["budget_tokens_levels"] == plan[0]["kwargs"]["eval_at_tokens"]


def test_verdict_arithmetic_on_a_known_table():
    rows = []
    for f, base in ((1.0, 2.0), (0.25, 2.5)):
        for seed, noise in ((0, -0.05), (1, 0.05)):
            rows.append({"data_fraction": f, "weight_decay": 0.01, "seed": seed,
                         "multiplier": 1.0, "budget_tokens": 1000,
                         "eval_loss_mean": base + noise})
    v = verdict(pd.DataFrame(rows))
    assert v["winner"] == (1.0, 0.01) and v["gap"] == pytest.approx(0.5)
    assert v["spread"] == pytest.approx(0.1) and v["decisive"] is True
    assert "more data (data fraction 1" in v["text"] and "20.0% lower" in v["text"]
    tie = pd.DataFrame(rows).assign(eval_loss_mean=lambda d: 2.0 + d["seed"] * 0.3)
    assert verdict(tie)["decisive"] is False and "tie within seed noise" in verdict(tie)["text"]


def _known_table():
    rows = []
    for m, scale in ((0.5, 1.2), (1.0, 1.0)):
        for f, base, acc in ((1.0, 2.0, 0.4), (0.25, 2.5, 0.3)):
            for seed, noise in ((0, -0.05), (1, 0.05)):
                rows.append({"run": f"frac{f:g}-seed{seed}", "data_fraction": f,
                             "weight_decay": 0.01, "seed": seed, "multiplier": m,
                             "budget_tokens": int(1000 * m), "eval_loss_mean": scale * base
                             + noise, "eval_full_acc_0": acc + noise, "accept_len": 1 + acc})
    return pd.DataFrame(rows)


def test_verdict_report_covers_every_level_and_metric():
    table = _known_table()
    parts = verdict_report(table).split("\n\n")
    assert parts[0] == verdict(table)["text"]
    assert parts[1] == "At 0.5x the budget: " + verdict(table, level=0.5)["text"]
    assert parts[2] == ("On position-0 accuracy: "
                        + verdict(table, metric="eval_full_acc_0")["text"])
    assert parts[3] == "On measured accept length: " + verdict(table, metric="accept_len")["text"]
    assert len(parts) == 4
    no_accept = verdict_report(table.drop(columns="accept_len"))
    assert "On measured accept length" not in no_accept
    empty = verdict_report(pd.DataFrame())  # no finished evaluation yet: no KeyError
    assert empty.startswith("No finished evaluations to compare yet.")


def test_summary_numbers_of_the_study_and_a_skipped_large_data_arm():
    from eagle3lab.study.scaling import LargeDataArm

    table = _known_table()
    skipped = LargeDataArm("large-data (GPU)", skip="large_data_drafter is 'none'")
    n = summary_numbers(table, metric="eval_loss_mean", tokens_per_run=1000, large=skipped)
    v = verdict(table)
    assert n["verdict"] == v["text"] and n["winning_arm"] == "data fraction 1, weight decay 0.01"
    assert n["decisive"] is True and n["gap"] == v["gap"] and n["seed_spread"] == v["spread"]
    assert (n["metric"], n["runs"], n["tokens_per_run"]) == ("eval_loss_mean", 4, 1000)
    assert n["large_data_verdict"] == "Skipped: large_data_drafter is 'none'"
    assert n["large_data_drafter"] is None and n["large_data_ratio"] is None
    assert list(n)[:8] == ["verdict", "winning_arm", "decisive", "metric", "gap",
                           "seed_spread", "runs", "tokens_per_run"]
    assert list(n)[8:] == list(skipped.summary_numbers())
    empty = summary_numbers(pd.DataFrame(), tokens_per_run=0)
    assert empty["runs"] == 0 and empty["winning_arm"] is None and "large_data_verdict" not in empty


def test_large_data_arm_skips_saying_why(tmp_path, sharp_data):
    from eagle3lab.study.scaling import large_data_arm

    none = large_data_arm("none", study_dir=tmp_path, table=pd.DataFrame(),
                          data=sharp_data["eval"])
    assert none.describe() == "Large-data arm skipped: large_data_drafter is 'none'"
    assert none.path is None and none.scaling is None
    # The shipped drafter (hidden 576) does not fit the tiny target the shards came from.
    misfit = large_data_arm("", study_dir=tmp_path, table=pd.DataFrame(),
                            data=sharp_data["eval"])
    assert misfit.path and misfit.row is None and "[hidden-size]" in misfit.skip
    assert misfit.verdict() == {"text": f"Skipped: {misfit.skip}"}
    assert misfit.summary_numbers()["large_data_drafter"] is None


def test_large_data_eval_uses_the_runs_held_out_samples(tmp_path, sharp_data):
    """Without eval_data the runs hold out part of the train shards; evaluate_drafter on the
    study's split (study_eval_split) reproduces a run's own final eval counts exactly."""
    from eagle3lab.study.scaling import evaluate_drafter, study_eval_split

    cfg = StudyConfig.from_dict(dict(data=sharp_data["train"], out=str(tmp_path / "study"),
                                     data_fractions=[1.0], seeds=[0], budget_epochs=0.5,
                                     epoch_multipliers=[1.0],
                                     train={**TRAIN, "eval_fraction": 0.25}))
    assert all(s == "done" for s in run_study(cfg, progress=False).values())
    split = study_eval_split(cfg.out)
    assert split["data"] == sharp_data["train"] and len(split["indices"]) == 12
    run = tmp_path / "study" / "runs" / "frac1-wd0.01-seed0"
    ev = evaluate_drafter(run / "final", eval_data=split["data"], indices=split["indices"],
                          ttt_steps=split["ttt_steps"],
                          max_tokens_per_batch=split["max_tokens_per_batch"], device="cpu")
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert ev["counts"] == last["eval"]["counts"]


def test_large_data_verdict_arithmetic_on_a_known_table():
    from eagle3lab.study.scaling import CPU_KIND, LARGE_KIND, large_data_verdict

    rows = [{"run": f"r{f}{s}", "kind": CPU_KIND, "data_fraction": f, "weight_decay": 0.01,
             "seed": s, "train_tokens": 1000 * f, "tokens_processed": 4000,
             "eval_full_acc_0": acc, "eval_full_acc_1": acc / 2,
             "eval_sim_accept_len": 1 + 1.5 * acc}
            for f, s, acc in ((1.0, 0, 0.20), (1.0, 1, 0.22), (0.25, 0, 0.10), (0.25, 1, 0.12))]
    rows.append({"run": "big", "kind": LARGE_KIND, "data_fraction": None,
                 "weight_decay": None, "seed": None, "train_tokens": 100_000,
                 "tokens_processed": 400_000, "eval_full_acc_0": 0.61, "eval_full_acc_1": 0.3,
                 "eval_sim_accept_len": 1.91, "ttt_steps_trained": 5})
    v = large_data_verdict(pd.DataFrame(rows))
    assert v["data_ratio"] == pytest.approx(100) and v["compute_ratio"] == pytest.approx(100)
    assert v["arm"] == pytest.approx(0.21) and v["gap"] == pytest.approx(0.40)
    assert v["arm_label"] == "data fraction 1, weight decay 0.01"
    assert "100x the training data" in v["text"] and "2.0 orders of magnitude" in v["text"]
    assert "0.610" in v["text"] and "0.210" in v["text"] and "(2 TTT positions)" in v["text"]
    assert "20.0x the largest seed-to-seed range" in v["text"]
    assert "NOT an equal-compute comparison" in v["text"] and "TTT 5" in v["text"]
