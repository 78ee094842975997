"""The key numbers of one training curve (notebook 02): the last logged value of each
metric, per TTT position, the plateau step, and the training throughput.

Prevents reading a final number off the wrong row: train and eval metrics are logged on
different steps, so the last ROW of a run's frame holds NaN for whichever was not logged
there; every number here is the metric's last LOGGED value. The plateau step comes from
the same rule the plots mark (eagle3lab.study.plateau), on the optimizer-step axis.
"""

from __future__ import annotations

import re
from typing import Any

from eagle3lab.study.plateau import detect_plateau


def last_values(df) -> dict[str, Any]:
    """Each column's last non-missing value (columns never logged are left out)."""
    logged = df.notna().to_numpy()
    if not len(logged):
        return {}
    last = len(logged) - 1 - logged[::-1].argmax(axis=0)  # each column's last logged row
    return {c: df[c].iloc[last[j]] for j, c in enumerate(df.columns) if logged[:, j].any()}


def summary_numbers(df, *, plateau_metric: str = "eval_loss_0", plateau_window: int = 3,
                    plateau_threshold: float = 0.01) -> dict[str, Any]:
    """One run's key numbers for the batch report (`df` from `load_metrics`): final eval
    loss, per-position eval loss, full and conditional accuracy, the teacher-forced accept
    length, the step where `plateau_metric` plateaued (None: it did not, or is not logged)
    and train tokens per second (None without wall time)."""
    last = last_values(df)
    n_pos = len([c for c in df.columns if re.fullmatch(r"eval_full_acc_\d+", c)])
    flat = (detect_plateau(df, plateau_metric, x="step", window=plateau_window,
                           threshold=plateau_threshold) if plateau_metric in df.columns
            else None)
    return {
        "run": df.attrs["run"], "steps": int(df["step"].max()),
        "final_eval_loss": last.get("eval_loss_mean"),
        "eval_loss_per_position": [last.get(f"eval_loss_{i}") for i in range(n_pos)],
        "eval_full_acc_per_position": [last.get(f"eval_full_acc_{i}") for i in range(n_pos)],
        "eval_cond_acc_per_position": [last.get(f"eval_cond_acc_{i}") for i in range(n_pos)],
        "eval_sim_accept_len": last.get("eval_sim_accept_len"),
        "plateau_step": flat.start if flat is not None and flat.plateaued else None,
        "train_tokens_per_s": (last["tokens"] / last["wall_s"]
                               if last.get("wall_s") and "tokens" in last else None),
    }
