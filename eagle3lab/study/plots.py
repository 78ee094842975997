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

from eagle3lab.study.atscale_read import equal_compute_table, final_values
from eagle3lab.study.gap import _short
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


# --- the at-scale study (eagle3lab.study.atscale_read) ---------------------------------------
def _arm_colors(arms) -> dict[str, str]:
    """One colour per arm, in the order given."""
    return {a: f"C{k % 10}" for k, a in enumerate(dict.fromkeys(arms))}


def _seed_style(seed) -> str:
    return ("-", "--", ":", "-.")[int(seed or 0) % 4]


def _tokens_axis(ax, label: str) -> None:
    """A log token axis labelled 100k / 1M / 10M; minor ticks (2, 3, 5 x 10^k) labelled
    only on an axis that spans under ~1.3 decades, where majors are too few."""
    import math

    from matplotlib.ticker import FuncFormatter

    def minor(v, _):
        lo, hi = ax.get_xlim()
        lead = round(v / 10 ** math.floor(math.log10(v))) if v > 0 else 0
        return _short(v) if 0 < lo and hi / lo < 20 and lead in (2, 3, 5) else ""

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
    ax.xaxis.set_minor_formatter(FuncFormatter(minor))
    ax.set_xlabel(label + " (log scale)")
    ax.grid(alpha=0.3, which="both")


def plot_atscale_curves(results, *, metric: str = "eval_loss_mean", runs: Sequence[str] = (),
                        logx: bool = True):
    """Eval `metric` against tokens processed for every run with curves: one panel per
    group (data arms at each weight decay, regeneration, recipe), one colour per arm,
    seeds by line style; a triangle where the plateau rule FIRST called a plateau (at its
    level, dotted line at its start), a star at a late drop (grokking), and the run's
    plateau start at the end (square) where it differs. `runs`: only these."""
    import matplotlib.pyplot as plt

    cur = results.curves
    if runs:
        cur = cur[cur["run"].isin(list(runs))]
    cur = cur[cur[metric].notna()] if metric in cur.columns else cur.iloc[0:0]
    if logx:
        cur = cur[cur["tokens"] > 0]
    arms = results.arms[results.arms["run"].isin(cur["run"].unique())]

    def group(a) -> str:
        return f"data arms, weight decay {a['weight_decay']:g}" if a["kind"] == "data" \
            else {"regen": "regeneration arms", "recipe": "recipe arms"}.get(a["kind"], a["kind"])

    kinds = {"data": 0, "regen": 1, "recipe": 2}
    groups = list(dict.fromkeys(group(a) for _, a in arms.assign(
        _k=arms["kind"].map(kinds).fillna(3)).sort_values(["_k", "weight_decay"]).iterrows())
    ) or ["no curves yet"]
    fig, axes = plt.subplots(1, len(groups), figsize=(5.6 * len(groups), 4.2), squeeze=False,
                             sharey=True)
    colors = _arm_colors(arms.sort_values(["kind", "unique_tokens"])["arm"])
    pl = results.plateaus.set_index("run") if len(results.plateaus) else None
    for _, a in arms.iterrows():
        ax = axes[0][groups.index(group(a))]
        d = cur[cur["run"] == a["run"]]
        c = colors[a["arm"]]
        first_seed = a["seed"] == arms[arms["arm"] == a["arm"]]["seed"].min()
        ax.plot(d["tokens"], d[metric], color=c, ls=_seed_style(a["seed"]), lw=1.4, marker=".",
                ms=3, label=f"{a['arm']} ({_short(a['unique_tokens'] or 0)} unique)"
                if first_seed else None)
        p = pl.loc[a["run"]] if pl is not None and a["run"] in pl.index else None
        if p is None or p["first_start"] is None or p["first_start"] != p["first_start"]:
            continue
        if p["metric"] == metric:
            ax.axvline(p["first_start"], color=c, ls=":", lw=0.8)
            ax.plot([max(p["first_start"], d["tokens"].min())], [p["first_level"]],
                    marker="v", color=c, ms=8, ls="none")
            if p["late_drop"]:
                ax.plot([p["drop_at"]], [p["drop_best"]], marker="*", color=c, ms=14,
                        ls="none", label=f"late drop: {a['run']}")
            if p["plateaued"] and p["start"] != p["first_start"]:
                ax.plot([p["start"]], [p["level"]], marker="s", color=c, ms=6, ls="none")
    for ax, g in zip(axes[0], groups):
        ax.set_title(g, fontsize=10)
        if logx:
            _tokens_axis(ax, "tokens processed")
        else:
            ax.set_xlabel("tokens processed")
            ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(metric + (" (nats)" if "loss" in metric else ""))
    fig.suptitle(f"{metric} during training at equal compute ({results.tokens_per_run:,} "
                 f"tokens per run); v: plateau first called, *: late drop, square: final "
                 f"plateau start; line style: seed", fontsize=10)
    fig.tight_layout()
    return fig


def plot_atscale_arms(results, *, metrics: Sequence[str] = ("eval_loss_mean",
                                                            "tau@5,1,6")):
    """The equal-compute table drawn: one panel per metric (those measured), one bar per
    arm at its mean over seeds, each seed a dot, the min-max range as a line."""
    import matplotlib.pyplot as plt

    table, fin = equal_compute_table(results), final_values(results)
    metrics = [m for m in metrics if m in table.columns and table[m].notna().any()] or [
        "eval_loss_mean"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(5.0, 0.7 * len(table) + 2.5)
                                                       * len(metrics), 4.2), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for j, (_, r) in enumerate(table.iterrows()):
            if r[m] is None or r[m] != r[m]:
                continue
            ax.bar(j, r[m], color=f"C{j % 10}", alpha=0.45)
            ax.plot([j, j], [r[f"{m}_min"], r[f"{m}_max"]], color="k", lw=1.5)
            v = fin[fin["arm"] == r["arm"]][m].dropna()
            ax.scatter([j] * len(v), v, color="k", s=14, zorder=3)
        ax.set_xticks(range(len(table)), [f"{a}\n{int(s)} of {int(p)} seeds" for a, s, p in
                                          zip(table["arm"], table["seeds"],
                                              table["seeds_planned"])],
                      rotation=60, ha="right", fontsize=7)
        lo = table[f"{m}_min"].dropna()
        if len(lo) and "loss" in m:
            ax.set_ylim(lo.min() * 0.97, table[f"{m}_max"].max() * 1.01)
        ax.set_ylabel(m.replace("tau@", "live tau at ") + (" (nats)" if "loss" in m else ""))
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Equal compute ({results.tokens_per_run:,} tokens per run): bars = mean "
                 f"over seeds, dots = seeds, lines = seed range", fontsize=10)
    fig.tight_layout()
    return fig


def plot_live_tau(results, *, weight_decay: float | None = None):
    """Live tau (static engine, greedy) of the data arms at one weight decay (default: the
    study's first; our recipe): left, the final drafters against unique answer tokens, one
    line per draft shape through the seed means (seeds as dots); then one panel per shape
    against tokens processed (every live point of every run, one colour per arm, seeds by
    line style)."""
    import matplotlib.pyplot as plt

    wd = weight_decay if weight_decay is not None else \
        results.study["config"]["weight_decays"][0]
    lv = results.live
    lv = lv[(lv["kind"] == "data") & (lv["recipe"] == "eagle3lab")
            & (lv["weight_decay"] == wd)]
    settings = [s for s in results.settings if (lv["setting"] == s).any()]
    fig, axes = plt.subplots(1, 1 + len(settings), figsize=(5.0 * (1 + len(settings)), 4.0),
                             squeeze=False)
    ax = axes[0][0]
    fin = lv[lv["final"]]
    for k, s in enumerate(settings):
        d = fin[fin["setting"] == s]
        m = d.groupby("unique_tokens")["tau"].mean()
        ax.plot(m.index, m.values, color=f"C{k}", marker="o", label=f"{s} (S,K,D)")
        ax.scatter(d["unique_tokens"], d["tau"], color=f"C{k}", s=10, alpha=0.6)
    _tokens_axis(ax, "unique answer tokens (final drafters)")
    ax.set_ylabel("live tau (tokens per verify, bonus included)")
    ax.set_title(f"final drafters, weight decay {wd:g}", fontsize=10)
    ax.legend(fontsize=7)
    colors = _arm_colors(lv.sort_values("unique_tokens")["arm"])
    for ax, s in zip(axes[0][1:], settings):
        d = lv[lv["setting"] == s]
        for run, g in d.groupby("run", sort=False):
            g = g.sort_values("tokens")
            a = g.iloc[0]
            ax.plot(g["tokens"], g["tau"], color=colors[a["arm"]], ls=_seed_style(a["seed"]),
                    marker="o", ms=3, label=f"{_short(a['unique_tokens'] or 0)} unique"
                    if a["seed"] == d[d["arm"] == a["arm"]]["seed"].min() else None)
        _tokens_axis(ax, "tokens processed")
        ax.set_title(f"live tau at {s} along training", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_sim_vs_live(results):
    """How far the teacher-forced curves predict serving: at every live point, the live
    tau against the teacher-forced chain estimate 1 + sum_{i<S} full_acc_i at the nearest
    evaluation (S: the shape's draft steps), one colour per shape; the diagonal is
    "the curves predict serving exactly"."""
    import matplotlib.pyplot as plt

    lv = results.live[results.live["sim_chain"].notna()]
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    for k, s in enumerate(results.settings):
        d = lv[lv["setting"] == s]
        if len(d):
            ax.scatter(d["sim_chain"], d["tau"], color=f"C{k}", s=18, alpha=0.8,
                       label=f"{s}: {len(d)} checkpoints")
    if len(lv):
        lo = min(lv["sim_chain"].min(), lv["tau"].min())
        hi = max(lv["sim_chain"].max(), lv["tau"].max())
        ax.plot([lo, hi], [lo, hi], color="k", ls="--", lw=1, label="live = teacher-forced")
    ax.set_xlabel("teacher-forced chain estimate 1 + sum_{i<S} full_acc_i")
    ax.set_ylabel("live tau (static engine)")
    ax.set_title("Curves vs serving, same checkpoints"
                 + ("" if len(lv) else "\n(no live point with a teacher-forced estimate)"),
                 fontsize=10)
    ax.grid(alpha=0.3)
    if len(lv):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_tau_fit(fit, *, needs: Sequence[Any] = (), goals: Sequence[float] = (3.0, 3.5),
                 label: str = "live tau", x_label: str = "unique answer tokens",
                 title: str = "Planner: tokens for a tau goal"):
    """The planner: measured points, the fitted curve with its bootstrap 90% band, the
    goals as horizontal lines, and where the fit reaches each (`needs`: tokens_for's
    answers; a shaded span for the range); a dashed ceiling for the saturating model.
    x_label: what the tokens are (the compute planner's: "tokens of training")."""
    import matplotlib.pyplot as plt
    import numpy as np

    xs = np.array([t for t, _ in fit.points])
    reach = [n.estimate for n in needs if n.reachable and n.estimate]
    hi = max([xs.max() * 3] + [min(r * 2, xs.max() * 1e4) for r in reach])
    grid = np.geomspace(xs.min() / 2, hi, 200)
    fig, ax = plt.subplots(figsize=(7, 4.4))
    ax.scatter(xs, [v for _, v in fit.points], color="k", s=18, zorder=3, label="measured")
    ax.plot(grid, fit.predict(grid), color="C0", lw=2, label=f"{fit.model} fit")
    if fit.boot:
        ax.fill_between(grid, *fit.band(grid), color="C0", alpha=0.15, lw=0,
                        label="90% bootstrap band")
    if fit.ceiling is not None:
        ax.axhline(fit.ceiling, color="C0", ls="--", lw=1, label=f"ceiling {fit.ceiling:.3g}")
    for k, g in enumerate(goals):
        ax.axhline(g, color=f"C{k + 1}", ls=":", lw=1.2, label=f"goal {g:g}")
    for k, n in enumerate(needs):
        c = f"C{[*goals].index(n.goal) + 1 if n.goal in goals else k + 1}"
        if n.reachable:
            ax.axvline(n.estimate, color=c, lw=1.2)
            if n.low is not None:
                ax.axvspan(n.low, n.high if n.high is not None else hi, color=c, alpha=0.1)
            ax.annotate(f"{_short(n.estimate)}", (n.estimate, n.goal), xytext=(4, 4),
                        textcoords="offset points", fontsize=8, color=c)
    _tokens_axis(ax, x_label)
    ax.set_ylabel(label)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
