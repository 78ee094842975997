"""eagle3lab.study.gap on the SGLang-servable shipped drafter's real H200 training curve
(data/drafters/smollm2-135m-instruct-sglang/metrics.jsonl, the default drafter until the
study's winner replaced it): the loss summed over its 5 TTT positions, the plateau the
detector finds in it, and the train/eval gap, each checked against numbers computed here
straight from the JSONL lines."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from eagle3lab.study.gap import (gap_curve, gap_table, key_numbers, plateau_and_gap,
                                 plot_plateau_and_gap, reference_frames, with_loss_sum)

SHIPPED = (Path(__file__).resolve().parents[2] / "data" / "drafters"
           / "smollm2-135m-instruct-sglang")


def _lines() -> list[dict]:
    return [json.loads(line) for line in (SHIPPED / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def shipped():
    frames, notes = reference_frames([SHIPPED], names=["shipped"])
    assert notes == [] and len(frames) == 1
    return frames[0]


def test_eval_loss_sum_is_the_sum_over_the_five_positions(shipped):
    by_step = {r["step"]: r for r in _lines()}
    d = with_loss_sum(shipped).set_index("step")
    # the curve the issue describes: 13.0 -> 6.96 -> 5.91 -> 5.46 -> 5.31, acc0 0.43 -> 0.70
    for step, expected in [(300, 13.02), (900, 6.96), (1200, 5.91), (1500, 5.46), (1800, 5.31)]:
        raw = sum(by_step[step]["eval"]["loss"])
        assert d.loc[step, "eval_loss_sum"] == pytest.approx(raw)
        assert raw == pytest.approx(expected, abs=0.01)
        # no decay in this run: the summed loss is its eval objective
        assert raw == pytest.approx(by_step[step]["eval"]["objective"])
    assert d.loc[300, "eval_full_acc_0"] == pytest.approx(0.43, abs=0.005)
    assert d.loc[1955, "eval_full_acc_0"] == pytest.approx(0.70, abs=0.005)


def test_the_plateau_is_found_where_the_rule_puts_it(shipped):
    r = plateau_and_gap(shipped, window=3, threshold=0.01)
    evals = [(rec["tokens"], sum(rec["eval"]["loss"])) for rec in _lines() if rec.get("eval")]
    tokens = [t for t, _ in evals]
    ys = [y for _, y in evals]
    j = tokens.index(27_398_141)  # step 1700
    # the rule by hand: from step 1700 on no 3-evaluation window improves by 1%; at 1600 one does
    for k in range(j, len(ys) - 3):
        assert (ys[k] - min(ys[k + 1:k + 4])) / ys[k] < 0.01
    assert (ys[j - 1] - min(ys[j:j + 3])) / ys[j - 1] > 0.01
    lp = r["loss_plateau"]
    assert lp.plateaued and lp.start == 27_398_141 and lp.x == "tokens"
    assert lp.level == pytest.approx(sum(ys[j:]) / len(ys[j:]))
    assert r["acc_plateau"].plateaued and r["acc_plateau"].start == 22_566_840  # step 1400


def test_the_gap_is_eval_minus_the_recent_train_mean(shipped):
    lines = _lines()
    train = [sum(rec["train"]["loss"]) for rec in lines if rec.get("train")]
    last_eval = sum(lines[-1]["eval"]["loss"])
    r = plateau_and_gap(shipped, train_smooth=5)
    assert r["positions"] == 5 and r["last_x"] == 31_504_880
    assert r["eval_loss_sum"] == pytest.approx(last_eval)
    assert r["train_loss_sum"] == pytest.approx(sum(train[-5:]) / 5)
    assert r["gap"] == pytest.approx(last_eval - sum(train[-5:]) / 5)
    assert 1.5 < r["gap"] < 2.1  # eval 5.29 vs train ~3.47: the train objective pulled away
    curve = r["curve"].set_index("tokens")
    assert curve.loc[4_843_127, "gap"] < 0.5 < 1.5 < curve["gap"].iloc[-1]  # the gap opened
    numbers = key_numbers(shipped, shipped, window=3, threshold=0.01)
    assert numbers["reference_plateau_at"] == 27_398_141
    assert numbers["reference_train_eval_gap"] == pytest.approx(r["gap"])
    table = gap_table([shipped])
    assert table.loc["shipped", "gap (nats)"] == pytest.approx(r["gap"])
    assert "plateaued at tokens=2.73981e+07" in table.loc["shipped", "loss plateau"]


def test_gap_curve_takes_the_train_mean_up_to_each_evaluation():
    df = pd.DataFrame({"step": [0, 1, 2, 3, 4], "tokens": [0, 10, 20, 30, 40],
                       "train_loss_0": [None, 4.0, 3.0, 2.0, 1.0],
                       "eval_loss_0": [5.0, None, 3.5, None, 2.5]})
    c = gap_curve(df, train_smooth=2)
    assert list(c["tokens"]) == [0, 20, 40]
    assert pd.isna(c.loc[0, "train"])  # no train step logged yet
    assert c.loc[1, "train"] == pytest.approx(3.5) and c.loc[1, "gap"] == pytest.approx(0.0)
    assert c.loc[2, "train"] == pytest.approx(1.5) and c.loc[2, "gap"] == pytest.approx(1.0)


def test_reference_frames_default_names_and_leaves_out_what_is_drawn(tmp_path):
    frames, notes = reference_frames(["default"])
    assert frames[0].attrs["run"] == "shipped default drafter, own eval split"
    default = SHIPPED.with_name("smollm2-135m-instruct")  # "default": the default drafter
    frames, notes = reference_frames(["default", tmp_path / "nope"], exclude=[default])
    assert frames == []
    assert "already drawn" in notes[0] and "does not exist" in notes[1]


def test_the_figure_marks_the_plateau_and_writes_the_gap(shipped):
    import matplotlib

    matplotlib.use("Agg")
    fig = plot_plateau_and_gap([shipped], window=3, threshold=0.01)
    loss_ax, acc_ax = fig.axes
    assert loss_ax.get_xscale() == "log"
    vlines = [ln.get_xdata()[0] for ln in loss_ax.lines if ln.get_linestyle() == ":"]
    assert vlines == [27_398_141]
    labels = loss_ax.get_legend_handles_labels()[1]
    assert "plateau at 5.31 from 27.4M tokens" in labels
    assert "shipped: eval (5 positions)" in labels and "shipped: train (5 positions)" in labels
    assert any(t.get_text() == "gap 1.82" for t in loss_ax.texts)
    assert loss_ax.collections, "the gap band is shaded"
    assert "plateau at 0.696 from 22.6M tokens" in acc_ax.get_legend_handles_labels()[1]
