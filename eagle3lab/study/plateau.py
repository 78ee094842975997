"""Where did a training curve stop improving, and at what level?

Prevents two misreadings of training curves: calling a run "converged" while its metric
still improves (so more steps would pay), and training on long after a plateau (so the
compute would be better spent on more data). The rule is explicit and testable:

    a curve has plateaued at point j when, from j to the end, no window of `window`
    following points improves the (optionally smoothed) metric by more than `threshold`
    relative to its value at the window's start.

Improvement means falling for losses and rising for accuracies and accept lengths
(`mode="auto"` picks from the metric name). The plateau level is the mean of the raw
values from j on. A curve whose last window still improves has not plateaued; the result
then says how much it improved over that window.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal


@dataclasses.dataclass(frozen=True)
class Plateau:
    metric: str
    x: str  # the x column the position is given in
    plateaued: bool
    start: float | None  # x value where the plateau starts
    start_index: int | None  # index into the non-missing points
    level: float | None  # mean of the metric from the start on
    last_improvement: float | None  # relative improvement over the final window
    window: int
    threshold: float
    mode: str

    def describe(self) -> str:
        if self.plateaued:
            return (f"{self.metric} plateaued at {self.x}={self.start:,.6g} at level "
                    f"{self.level:.4g} (no window of {self.window} points improved it by "
                    f"more than {self.threshold:.1%} after that).")
        if self.last_improvement is None:
            return (f"{self.metric}: too few points to judge (need more than {self.window}).")
        return (f"{self.metric} has not plateaued: it still improved by "
                f"{self.last_improvement:.1%} over the last {self.window} points.")


def _mode_for(metric: str) -> str:
    m = metric.lower()
    return "max" if ("acc" in m or "accept" in m) else "min"


def detect_plateau(data: Any, metric: str | None = None, *, x: str = "tokens",
                   window: int = 3, threshold: float = 0.01, smooth: int = 1,
                   mode: Literal["auto", "min", "max"] = "auto") -> Plateau:
    """Detect a plateau in `metric` of a DataFrame (rows with the metric missing are
    dropped), or in a plain sequence of values (`data`, x = point index).

    window: following points each window spans. threshold: relative improvement below
    which a window counts as flat. smooth: trailing rolling mean over this many points
    before judging (for noisy per-step train curves).
    """
    import numpy as np

    if metric is None:  # a plain sequence
        ys = np.asarray(list(data), dtype=float)
        xs, metric, x = np.arange(len(ys), dtype=float), "value", "index"
    else:
        if metric not in data.columns:
            raise KeyError(f"No column {metric!r}; columns: {list(data.columns)}")
        d = data[[x, metric]].dropna() if x in data.columns else data[[metric]].dropna()
        ys = d[metric].to_numpy(dtype=float)
        xs = d[x].to_numpy(dtype=float) if x in d.columns else np.arange(len(ys), dtype=float)
    mode = _mode_for(metric) if mode == "auto" else mode
    return plateau_of_arrays(xs, ys, metric=metric, x=x, window=window, threshold=threshold,
                             smooth=smooth, mode=mode)


def plateau_of_arrays(xs: Any, ys: Any, *, metric: str, x: str, window: int = 3,
                      threshold: float = 0.01, smooth: int = 1,
                      mode: Literal["min", "max"] = "min") -> Plateau:
    """detect_plateau's rule on float arrays (no missing values): for callers judging many
    prefixes of one curve without a DataFrame per call."""
    import numpy as np

    sign = 1.0 if mode == "min" else -1.0
    if smooth > 1:
        ys_s = np.array([ys[max(0, i - smooth + 1):i + 1].mean() for i in range(len(ys))])
    else:
        ys_s = ys
    n = len(ys)
    common = dict(metric=metric, x=x, window=window, threshold=threshold, mode=mode)
    if n <= window:
        return Plateau(plateaued=False, start=None, start_index=None, level=None,
                       last_improvement=None, **common)
    gains = np.empty(n - window)
    for j in range(n - window):
        ahead = ys_s[j + 1:j + window + 1]
        best = ahead.min() if mode == "min" else ahead.max()
        gains[j] = sign * (ys_s[j] - best) / max(abs(ys_s[j]), 1e-12)
    flat = gains < threshold
    if not flat[-1]:
        return Plateau(plateaued=False, start=None, start_index=None, level=None,
                       last_improvement=float(gains[-1]), **common)
    j = len(flat) - 1
    while j > 0 and flat[j - 1]:
        j -= 1
    return Plateau(plateaued=True, start=float(xs[j]), start_index=int(j),
                   level=float(ys[j:].mean()), last_improvement=float(gains[-1]), **common)
