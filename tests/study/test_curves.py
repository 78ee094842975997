"""A training curve's key numbers: last LOGGED values (train and eval rows interleave),
the plateau step by the plotted rule, throughput; on a real run and on a known frame."""

import json
import math

import pandas as pd
import pytest

from eagle3lab.study.curves import last_values, summary_numbers
from eagle3lab.study.plateau import detect_plateau


def test_on_a_real_run_the_numbers_are_its_last_logged_lines(trained_run):
    from eagle3lab.study.importers import load_metrics

    df = load_metrics(trained_run)
    n = summary_numbers(df, plateau_metric="eval_loss_0", plateau_window=2,
                        plateau_threshold=0.05)
    lines = [json.loads(x) for x in (trained_run / "metrics.jsonl").read_text().splitlines()]
    last_eval = [x["eval"] for x in lines if x.get("eval")][-1]
    last_any = [x for x in lines if x.get("wall_s")][-1]
    assert n["run"] == df.attrs["run"] and n["steps"] == max(x["step"] for x in lines)
    assert n["eval_loss_per_position"] == pytest.approx(last_eval["loss"])
    assert n["eval_full_acc_per_position"] == pytest.approx(last_eval["full_acc"])
    assert n["eval_cond_acc_per_position"] == pytest.approx(last_eval["cond_acc"])
    assert n["final_eval_loss"] == pytest.approx(sum(last_eval["loss"]) / len(last_eval["loss"]))
    assert n["eval_sim_accept_len"] == pytest.approx(1 + sum(last_eval["full_acc"]))
    assert n["train_tokens_per_s"] == pytest.approx(last_any["tokens"] / last_any["wall_s"])
    p = detect_plateau(df, "eval_loss_0", x="step", window=2, threshold=0.05)
    assert n["plateau_step"] == (p.start if p.plateaued else None)


def test_sparse_eval_rows_and_missing_columns():
    df = pd.DataFrame({
        "step": [1, 2, 3, 4, 5, 6],
        "tokens": [10, 20, 30, 40, 50, 60],
        "train_loss_0": [3.0, 2.5, 2.2, 2.1, 2.05, 2.0],
        "eval_loss_0": [math.nan, 2.0, math.nan, 1.0, math.nan, math.nan],
        "eval_loss_mean": [math.nan, 2.0, math.nan, 1.0, math.nan, math.nan],
        "eval_full_acc_0": [math.nan, 0.2, math.nan, 0.4, math.nan, math.nan],
    })
    df.attrs["run"] = "known"
    assert last_values(df)["eval_loss_0"] == 1.0 and "wall_s" not in last_values(df)
    n = summary_numbers(df, plateau_metric="eval_loss_9")
    assert n["final_eval_loss"] == 1.0 and n["eval_loss_per_position"] == [1.0]
    assert n["eval_full_acc_per_position"] == [0.4]
    assert n["eval_cond_acc_per_position"] == [None] and n["eval_sim_accept_len"] is None
    assert n["plateau_step"] is None and n["train_tokens_per_s"] is None
    assert n["steps"] == 6
