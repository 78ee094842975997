"""Figures and tables for training curves (notebook 02) and the grokking study (06).

Prevents misleading training plots: every curve is drawn against tokens processed (the
compute axis) when the log has it, train and eval of one run share a colour with eval
marked, TTT positions get their own panels instead of being averaged away, a detected
plateau is marked where the rule in `plateau.py` puts it, and losses of trainers whose
loss is a different quantity (SpecForge soft CE vs speculators KL) are labelled so.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from eagle3lab.study.plateau import detect_plateau
from eagle3lab.train.counts import read_metrics

_X_LABEL = {"tokens": "tokens processed (positions)", "step": "optimizer step",
            "epoch": "epoch", "wall_s": "wall time (s)"}
_KIND = {"loss": "loss (nats)", "full_acc": "full accuracy (fraction)",
         "cond_acc": "conditional accuracy (fraction)"}


def _positions(df, kind: str) -> list[int]:
    return sorted({int(m.group(1)) for c in df.columns
                   if (m := re.fullmatch(fr"(?:train|eval)_{kind}_(\d+)", c))})


def _x_for(df, x: str) -> str:
    return x if x in df.columns and df[x].notna().any() else "step"


def _label(df) -> str:
    run, src, lk = df.attrs.get("run", "run"), df.attrs.get("source"), df.attrs.get("loss_kind")
    extra = f" [{src}, loss={lk}]" if src and src != "eagle3lab" else ""
    return f"{run}{extra}"


def plot_curves(frames: Sequence[Any], *, kind: str = "loss", x: str = "tokens",
                positions: Sequence[int] | None = None, plateau_metric_split: str = "eval",
                plateau_window: int = 3, plateau_threshold: float = 0.01,
                train_smooth: int = 5, reference: float | None = None,
                reference_label: str = "reference", figsize_per_panel=(4.2, 3.4)):
    """One panel per TTT position: train (smoothed line) and eval (markers) of every run
    overlaid, plateau markers, and an optional horizontal reference level."""
    import matplotlib.pyplot as plt

    frames = list(frames)
    pos = list(positions) if positions is not None else sorted(
        set().union(*[_positions(df, kind) for df in frames]) or {0})
    fig, axes = plt.subplots(1, len(pos), figsize=(figsize_per_panel[0] * len(pos),
                                                   figsize_per_panel[1]), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    xs_used = set()
    for k, i in enumerate(pos):
        ax = axes[0][k]
        for r, df in enumerate(frames):
            c = colors[r % len(colors)]
            xc = _x_for(df, x)
            xs_used.add(xc)
            tr, ev = f"train_{kind}_{i}", f"eval_{kind}_{i}"
            if tr in df.columns and df[tr].notna().any():
                d = df[[xc, tr]].dropna()
                y = d[tr].rolling(train_smooth, min_periods=1).mean()
                ax.plot(d[xc], y, color=c, lw=1, alpha=0.6, label=f"{_label(df)} train")
            if ev in df.columns and df[ev].notna().any():
                d = df[[xc, ev]].dropna()
                ax.plot(d[xc], d[ev], color=c, lw=1.8, marker="o", ms=3,
                        label=f"{_label(df)} eval")
                p = detect_plateau(df, f"{plateau_metric_split}_{kind}_{i}", x=xc,
                                   window=plateau_window, threshold=plateau_threshold) \
                    if f"{plateau_metric_split}_{kind}_{i}" in df.columns else None
                if p is not None and p.plateaued:
                    ax.axvline(p.start, color=c, ls=":", lw=1)
                    ax.plot([p.start], [p.level], marker="v", color=c, ms=9,
                            label=f"plateau {p.level:.3g} from {p.start:,.0f}")
        if reference is not None and kind == "loss":
            ax.axhline(reference, color="k", ls="--", lw=1, label=reference_label)
        ax.set_title(f"{_KIND.get(kind, kind)}, TTT position {i}")
        ax.set_xlabel(" / ".join(_X_LABEL.get(v, v) for v in sorted(xs_used)))
        ax.set_ylabel(_KIND.get(kind, kind))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_lr(frames: Sequence[Any], *, x: str = "tokens"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    for df in frames:
        if "lr" in df.columns and df["lr"].notna().any():
            xc = _x_for(df, x)
            d = df[[xc, "lr"]].dropna()
            ax.plot(d[xc], d["lr"], label=_label(df))
            ax.set_xlabel(_X_LABEL.get(xc, xc))
    ax.set_ylabel("learning rate")
    ax.set_title("Learning rate schedule")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def final_table(frames: Sequence[Any], *, plateau_metric: str = "eval_loss_0",
                plateau_window: int = 3, plateau_threshold: float = 0.01):
    """Last logged train and eval values per run and position, plus the plateau verdict."""
    import pandas as pd

    rows = []
    for df in frames:
        row: dict[str, Any] = {"run": df.attrs.get("run"), "source": df.attrs.get("source"),
                               "loss_kind": df.attrs.get("loss_kind"),
                               "steps": int(df["step"].max()) if len(df) else 0,
                               "tokens": df["tokens"].dropna().max() if "tokens" in df else None}
        for c in df.columns:
            if re.fullmatch(r"(train|eval)_(loss|full_acc|cond_acc)_\d+|"
                            r"(train|eval)_(loss_mean|sim_accept_len)", c):
                s = df[c].dropna()
                row[c] = s.iloc[-1] if len(s) else None
        if plateau_metric in df.columns:
            p = detect_plateau(df, plateau_metric, x=_x_for(df, "tokens"),
                               window=plateau_window, threshold=plateau_threshold)
            row["plateau"] = p.describe()
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")


def plot_study_curves(study_dir, *, metric: str = "eval_loss_mean", extra: Sequence[Any] = (),
                      logx: bool = False):
    """Eval metric against tokens for every run of a study, one colour per arm. `extra`:
    more read_metrics frames drawn in black (e.g. `scaling.drafter_curve`: a drafter trained
    on far more data, on its own eval split, labelled so); `logx`: log token axis."""
    import json
    from pathlib import Path

    import matplotlib.pyplot as plt

    study = json.loads((Path(study_dir) / "study.json").read_text())
    arms = sorted({(r["data_fraction"], r["weight_decay"]) for r in study["runs"]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in study["runs"]:
        if not (Path(r["run_dir"]) / "metrics.jsonl").exists():
            continue
        df = read_metrics(r["run_dir"])
        if metric not in df.columns:
            continue
        d = df[["tokens", metric]].dropna()
        d = d[d["tokens"] > 0] if logx else d
        arm = (r["data_fraction"], r["weight_decay"])
        first = r["seed"] == min(x["seed"] for x in study["runs"]
                                 if (x["data_fraction"], x["weight_decay"]) == arm)
        ax.plot(d["tokens"], d[metric], marker="o", ms=3, color=colors[arms.index(arm) % 10],
                label=f"fraction {arm[0]:g}, wd {arm[1]:g}" if first else None)
    for k, df in enumerate(f for f in extra if f is not None and metric in f.columns):
        d = df[["tokens", metric]].dropna()
        d = d[d["tokens"] > 0] if logx else d
        ax.plot(d["tokens"], d[metric], color="k", ls=("--", "-.", ":")[k % 3], marker="s",
                ms=3, label=df.attrs.get("run", "extra"))
    for level in study["budget_tokens_levels"]:
        ax.axvline(level, color="grey", ls=":", lw=1)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel("tokens processed (positions)" + (", log scale" if logx else "")
                  + "; dotted: equal-compute levels")
    ax.set_ylabel(metric + (" (nats)" if "loss" in metric else ""))
    ax.set_title(f"{metric} during training, every seed (equal compute per run)"
                 + ("\nblack: not equal compute (its label names its eval split)"
                    if extra else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_equal_compute(table, *, metric: str = "eval_loss_mean"):
    """Each arm's metric at each compute level: seeds as dots, mean as a bar."""
    import matplotlib.pyplot as plt

    levels = sorted(table["multiplier"].unique())
    arms = sorted({(f, w) for f, w in zip(table["data_fraction"], table["weight_decay"])})
    fig, axes = plt.subplots(1, len(levels), figsize=(4.5 * len(levels), 3.6), squeeze=False)
    for k, m in enumerate(levels):
        ax = axes[0][k]
        t = table[table["multiplier"] == m]
        for j, (f, w) in enumerate(arms):
            v = t[(t["data_fraction"] == f) & (t["weight_decay"] == w)][metric].dropna()
            if len(v):
                ax.bar(j, v.mean(), color="C%d" % j, alpha=0.5)
                ax.scatter([j] * len(v), v, color="k", s=12, zorder=3)
        ax.set_xticks(range(len(arms)), [f"frac {f:g}\nwd {w:g}" for f, w in arms])
        tokens = int(t["budget_tokens"].iloc[0]) if len(t) else 0
        ax.set_title(f"{m:g}x budget ({tokens:,} tokens)")
        ax.set_ylabel(metric + (" (nats)" if "loss" in metric else ""))
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Equal compute: bars = mean over seeds, dots = seeds")
    fig.tight_layout()
    return fig


def plot_data_scaling(scaling, *, metrics: Sequence[str] = ("eval_full_acc_0",
                                                            "eval_sim_accept_len")):
    """`scaling.data_scaling_table`: each metric against training-data tokens (log axis),
    study runs as dots coloured by arm, the large-data drafter as a labelled star."""
    import matplotlib.pyplot as plt

    metrics = [m for m in metrics if m in scaling.columns]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.8), squeeze=False)
    large = scaling[scaling["data_fraction"].isna()]
    runs = scaling[scaling["data_fraction"].notna()]
    arms = sorted({(f, w) for f, w in zip(runs["data_fraction"], runs["weight_decay"])})
    for ax, metric in zip(axes[0], metrics):
        for j, (f, w) in enumerate(arms):
            t = runs[(runs["data_fraction"] == f) & (runs["weight_decay"] == w)]
            ax.scatter(t["train_tokens"], t[metric], color="C%d" % j, s=25,
                       label=f"frac {f:g}, wd {w:g} (equal compute)")
        for _, r in large.iterrows():
            ax.scatter([r["train_tokens"]], [r[metric]], color="k", marker="*", s=160,
                       label=f"{r['run']} (not equal compute)")
            ax.annotate(f"{r[metric]:.3g}", (r["train_tokens"], r[metric]),
                        textcoords="offset points", xytext=(6, -12), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("training data: tokens per pass (log scale)")
        ax.set_ylabel(metric + (" (nats)" if "loss" in metric else ""))
        ax.set_title(f"{metric} on the same held-out shards")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
