"""eagle3lab.study: equal-compute plan, sweep that skips finished and resumes interrupted
runs, the equal-compute table, and the verdict against seed-to-seed spread."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from eagle3lab.errors import UserError
from eagle3lab.study import (StudyConfig, compare_at_equal_compute, full_epoch_tokens,
                             plan_study, run_study, verdict)

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
