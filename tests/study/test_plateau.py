"""eagle3lab.study.plateau: synthetic curves with known (analytic) answers, and a real run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from eagle3lab.study.plateau import detect_plateau, plateau_of_arrays


def test_exponential_decay_plateaus_where_the_algebra_says():
    """y = 1 + 4 exp(-x/10): the relative gain over a 5-point window at x is
    4e^{-x/10}(1 - e^{-1/2}) / (1 + 4e^{-x/10}); it first drops below 1% after
    x* = 10 ln(4 (1 - e^{-1/2} - 0.01) / 0.01) = 50.3, so the plateau starts at x = 51."""
    x = np.arange(100)
    y = 1 + 4 * np.exp(-x / 10)
    x_star = 10 * math.log(4 * (1 - math.exp(-0.5) - 0.01) / 0.01)
    p = detect_plateau(y, window=5, threshold=0.01)
    assert p.plateaued and p.start == math.ceil(x_star) == 51
    assert p.level == pytest.approx(y[51:].mean())
    assert "plateaued at index=51" in p.describe()


def test_the_array_rule_is_the_frame_rule_on_every_prefix():
    """plateau_of_arrays (what the at-scale reader calls per prefix) gives detect_plateau's
    answer on a frame of the same curve, tokens as x, at every prefix length."""
    x = np.arange(60) * 1e5
    y = 1 + 4 * np.exp(-np.arange(60) / 10)
    df = pd.DataFrame({"tokens": x, "eval_loss_mean": y})
    called = 0
    for e in range(1, 61):
        a = plateau_of_arrays(x[:e], y[:e], metric="eval_loss_mean", x="tokens", window=5,
                              threshold=0.01, mode="min")
        assert a == detect_plateau(df.iloc[:e], "eval_loss_mean", window=5, threshold=0.01)
        called += a.plateaued
    assert called > 0  # the curve plateaus inside the prefixes judged


def test_a_steady_decline_never_plateaus():
    p = detect_plateau(100.0 - np.arange(50), window=5, threshold=0.01)
    assert not p.plateaued and p.start is None
    assert p.last_improvement == pytest.approx(5 / 56)
    assert "has not plateaued" in p.describe()


def test_a_step_plateaus_right_after_the_step():
    y = np.r_[np.full(20, 5.0), np.full(20, 2.0)]
    p = detect_plateau(y, window=3, threshold=0.01)
    assert p.plateaued and p.start == 20 and p.level == 2.0


def test_accuracy_rises_to_a_plateau_in_a_dataframe():
    """max mode (picked from the name): y = 0.8 (1 - e^{-j/5}) at tokens = 100 j; the gain
    over 3 points falls below 1% after j* = 5 ln((1 - e^{-3/5} + 0.01) / 0.01) = 19.2."""
    j = np.arange(60)
    df = pd.DataFrame({"tokens": 100 * j, "eval_full_acc_0": 0.8 * (1 - np.exp(-j / 5))})
    df.loc[::7, "eval_full_acc_0"] = np.nan  # missing points are dropped, not misread
    j_star = 5 * math.log((1 - math.exp(-0.6) + 0.01) / 0.01)
    full = pd.DataFrame({"tokens": 100 * j, "eval_full_acc_0": 0.8 * (1 - np.exp(-j / 5))})
    p = detect_plateau(full, "eval_full_acc_0", window=3, threshold=0.01)
    assert p.mode == "max" and p.plateaued and p.start == 100 * math.ceil(j_star) == 2000
    assert detect_plateau(df, "eval_full_acc_0", window=3, threshold=0.01).plateaued


def test_smoothing_finds_the_level_of_a_noisy_flat_curve():
    rng = np.random.default_rng(0)
    y = 3.0 + rng.uniform(-0.1, 0.1, 200)
    p = detect_plateau(y, window=5, threshold=0.03, smooth=10)
    assert p.plateaued and p.start < 20 and p.level == pytest.approx(3.0, abs=0.02)


def test_too_few_points():
    p = detect_plateau([3.0, 2.0], window=3)
    assert not p.plateaued and p.last_improvement is None and "too few" in p.describe()
    with pytest.raises(KeyError, match="eval_loss_9"):
        detect_plateau(pd.DataFrame({"tokens": [1]}), "eval_loss_9")


@pytest.mark.parametrize("metric,window,threshold,smooth", [
    ("eval_loss_0", 2, 0.05, 1), ("train_loss_0", 5, 0.02, 5), ("eval_full_acc_0", 2, 0.02, 1)])
def test_on_a_real_run_the_boundary_is_tight(trained_run, metric, window, threshold, smooth):
    """On the curves of a real training run the rule holds exactly: from the detected start
    on, no window gains more than the threshold, and the window just before does (else the
    plateau would start earlier); without a plateau, the last window still gains."""
    from eagle3lab.train.counts import read_metrics

    df = read_metrics(trained_run)
    p = detect_plateau(df, metric, window=window, threshold=threshold, smooth=smooth)
    y = df[["tokens", metric]].dropna()[metric].to_numpy()
    y = np.array([y[max(0, i - smooth + 1):i + 1].mean() for i in range(len(y))])
    sign = 1 if p.mode == "min" else -1
    gains = [sign * (y[j] - (min if sign > 0 else max)(y[j + 1:j + window + 1])) / abs(y[j])
             for j in range(len(y) - window)]
    if p.plateaued:
        assert all(g < threshold for g in gains[p.start_index:])
        assert p.start_index == 0 or gains[p.start_index - 1] >= threshold
        assert p.level == pytest.approx(df[metric].dropna().to_numpy()[p.start_index:].mean())
    else:
        assert gains[-1] >= threshold
