"""The plateau-and-gap view of training runs: the loss summed over the TTT positions, train
against held-out eval, with where each stopped improving, for a small run next to a large
one (notebook 02; the report's key figure of it).

Prevents reading a toy curve as the regime the grokking-vs-data study is about: a 60-step
CPU run shows neither a plateau nor a train/eval gap; the shipped default drafter's own
training curve (data/drafters/NAME/metrics.jsonl, measured on its own eval split) shows
both, so the two are drawn on one tokens axis (log scale: they differ ~1000x in compute).
The numbers the figure shows are computed here and tested:

    loss sum   sum over the run's TTT positions of loss_i (no decay; the positions a run
               has are named in its legend: runs of different depth are not the same sum)
    gap        eval loss sum - train loss sum at each evaluation, the train value being the
               mean of the last `train_smooth` logged train steps up to that point (one
               train batch is noisy), in nats; positive: the drafter fits its training data
               better than held-out data
    plateau    eagle3lab.study.plateau's rule on the eval curve (loss sum and first-token
               accuracy eval_full_acc_0)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from eagle3lab.study.importers import load_metrics
from eagle3lab.study.plateau import Plateau, detect_plateau
from eagle3lab.study.scaling import metrics_file
from eagle3lab.workdir import default_drafter

ACC = "full_acc_0"


def positions(df, split: str = "eval") -> list[int]:
    """TTT positions with a per-position loss column for `split`."""
    return sorted(int(m.group(1)) for c in df.columns
                  if (m := re.fullmatch(fr"{split}_loss_(\d+)", c)))


def with_loss_sum(df):
    """A copy of a metrics frame with {split}_loss_sum columns: the sum over the split's
    TTT positions of loss_i (missing where any position is missing)."""
    df = df.copy()
    for split in ("train", "eval"):
        cols = [f"{split}_loss_{i}" for i in positions(df, split)]
        if cols:
            df[f"{split}_loss_sum"] = df[cols].sum(axis=1, min_count=len(cols)).where(
                df[cols].notna().all(axis=1))
    return df


def _x(df, x: str) -> str:
    return x if x in df.columns and df[x].notna().any() else "step"


def gap_curve(df, *, x: str = "tokens", kind: str = "loss_sum", train_smooth: int = 5):
    """Eval points of `{split}_{kind}` with the smoothed train value at each and the gap:
    a DataFrame with columns x, eval, train, gap (train/gap missing before the first
    logged train step)."""
    import pandas as pd

    df = with_loss_sum(df) if kind == "loss_sum" else df
    xc = _x(df, x)
    ev_col, tr_col = f"eval_{kind}", f"train_{kind}"
    if ev_col not in df.columns:
        return pd.DataFrame(columns=[xc, "eval", "train", "gap"])
    ev = df[[xc, ev_col]].dropna().rename(columns={ev_col: "eval"}).sort_values(xc)
    if tr_col in df.columns and df[tr_col].notna().any():
        tr = df[[xc, tr_col]].dropna().sort_values(xc)
        tr = pd.DataFrame({xc: tr[xc], "train": tr[tr_col].rolling(
            train_smooth, min_periods=1).mean()})
        out = pd.merge_asof(ev, tr, on=xc, direction="backward")
    else:
        out = ev.assign(train=float("nan"))
    out["gap"] = out["eval"] - out["train"]
    return out.reset_index(drop=True)


def plateau_and_gap(df, *, x: str = "tokens", window: int = 3, threshold: float = 0.01,
                    train_smooth: int = 5) -> dict[str, Any]:
    """One run's plateau-and-gap numbers: the final eval and (smoothed) train loss sums,
    the gap between them, first-token accuracies, and the plateaus of the eval loss sum
    and of eval_full_acc_0 (eagle3lab.study.plateau.Plateau, or None without the column)."""
    d = with_loss_sum(df)
    xc = _x(d, x)
    curve = gap_curve(d, x=x, train_smooth=train_smooth)
    acc = gap_curve(d, x=x, kind=ACC, train_smooth=train_smooth)

    def plateau(col: str) -> Plateau | None:
        return (detect_plateau(d, col, x=xc, window=window, threshold=threshold)
                if col in d.columns and d[col].notna().any() else None)

    last = curve.iloc[-1] if len(curve) else None
    last_acc = acc.iloc[-1] if len(acc) else None

    def num(row, key):
        return None if row is None or row[key] != row[key] else float(row[key])

    return {"run": d.attrs.get("run"), "x": xc, "positions": len(positions(d)),
            "last_x": num(last, xc), "eval_loss_sum": num(last, "eval"),
            "train_loss_sum": num(last, "train"), "gap": num(last, "gap"),
            "eval_full_acc_0": num(last_acc, "eval"), "train_full_acc_0": num(last_acc, "train"),
            "loss_plateau": plateau("eval_loss_sum"), "acc_plateau": plateau(f"eval_{ACC}"),
            "curve": curve, "acc_curve": acc}


def gap_table(frames: Sequence[Any], **kw):
    """plateau_and_gap of every run as a table (one row per run)."""
    import pandas as pd

    rows = []
    for df in frames:
        r = plateau_and_gap(df, **kw)
        lp, ap = r["loss_plateau"], r["acc_plateau"]
        rows.append({
            "run": r["run"], "positions": r["positions"], f"last {r['x']}": r["last_x"],
            "eval loss sum": r["eval_loss_sum"], "train loss sum (smoothed)": r["train_loss_sum"],
            "gap (nats)": r["gap"], "eval acc0": r["eval_full_acc_0"],
            "train acc0 (smoothed)": r["train_full_acc_0"],
            "loss plateau from": lp.start if lp and lp.plateaued else None,
            "loss plateau level": lp.level if lp and lp.plateaued else None,
            "acc0 plateau from": ap.start if ap and ap.plateaued else None,
            "loss plateau": lp.describe() if lp else "no eval loss logged"})
    return pd.DataFrame(rows).set_index("run")


def key_numbers(run, reference=None, **kw) -> dict[str, Any]:
    """The plateau-and-gap numbers notebook 02 records for the report: the run's final gap,
    and the reference's (e.g. the shipped drafter's) eval and train loss sums, gap and
    where its eval loss sum plateaued (kw: plateau_and_gap's options)."""
    r = plateau_and_gap(run, **kw)
    out: dict[str, Any] = {"train_eval_gap": r["gap"]}
    if reference is not None:
        ref = plateau_and_gap(reference, **kw)
        lp = ref["loss_plateau"]
        out.update(reference_run=ref["run"], reference_eval_loss_sum=ref["eval_loss_sum"],
                   reference_train_loss_sum=ref["train_loss_sum"],
                   reference_train_eval_gap=ref["gap"],
                   reference_plateau_at=lp.start if lp and lp.plateaued else None,
                   reference_eval_full_acc_0=ref["eval_full_acc_0"])
    return out


def _short(v: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def _draw_gap(ax, g, xc: str, color: str) -> None:
    """Shade where eval is above train; write the last gap beside a double arrow."""
    if not len(g):
        return
    ax.fill_between(g[xc], g["train"], g["eval"], where=g["gap"] > 0, interpolate=True,
                    color=color, alpha=0.15, lw=0)
    end = g.iloc[-1]
    if end["gap"] > 0:
        ax.annotate("", (end[xc], end["train"]), (end[xc], end["eval"]),
                    arrowprops=dict(arrowstyle="<->", color=color, lw=1.2))
        ax.annotate(f"gap {end['gap']:.2f}", (end[xc], (end["train"] + end["eval"]) / 2),
                    xytext=(-6, 0), textcoords="offset points", ha="right", va="center",
                    color=color, fontsize=9, fontweight="bold")


def _mark(ax, p: Plateau | None, color: str, x_label: str) -> None:
    if p is not None and p.plateaued:
        ax.axvline(p.start, color=color, ls=":", lw=1.2)
        ax.plot([p.start], [p.level], marker="v", color=color, ms=10, ls="none",
                label=f"plateau at {p.level:.3g} from {_short(p.start)} {x_label}")


def plot_plateau_and_gap(frames: Sequence[Any], *, x: str = "tokens", logx: bool = True,
                         window: int = 3, threshold: float = 0.01, train_smooth: int = 5,
                         figsize=(13.5, 4.6)):
    """Two panels on one x axis for every run (one colour each): the loss summed over the
    TTT positions (train: thin line, eval: markers; the shaded band between them is the
    train/eval gap, the last one written beside it when positive) and the first-token
    accuracy, each with the plateau detector's marks (dotted line and triangle at the
    plateau level)."""
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=figsize)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    used = set()
    for k, df in enumerate(frames):
        c = colors[k % len(colors)]
        r = plateau_and_gap(df, x=x, window=window, threshold=threshold,
                            train_smooth=train_smooth)
        xc, name = r["x"], _name(df)
        used.add(xc)
        d = with_loss_sum(df)
        for ax, kind, curve, p in ((ax_l, "loss_sum", r["curve"], r["loss_plateau"]),
                                   (ax_a, ACC, r["acc_curve"], r["acc_plateau"])):
            pos = f" ({r['positions']} positions)" if kind == "loss_sum" else ""
            tr = d[[xc, f"train_{kind}"]].dropna() if f"train_{kind}" in d.columns else None
            if logx:
                curve = curve[curve[xc] > 0]
                tr = tr[tr[xc] > 0] if tr is not None else None
            if tr is not None and len(tr):
                ax.plot(tr[xc], tr[f"train_{kind}"].rolling(train_smooth, min_periods=1).mean(),
                        color=c, lw=1, alpha=0.55, label=f"{name}: train{pos}")
            if len(curve):
                ax.plot(curve[xc], curve["eval"], color=c, lw=1.8, marker="o", ms=4,
                        label=f"{name}: eval{pos}")
            if kind == "loss_sum":
                _draw_gap(ax, curve.dropna(subset=["gap"]), xc, c)
            _mark(ax, p, c, xc)
    label = {"tokens": "tokens processed (positions)", "step": "optimizer step"}
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax_l.set_yscale("log")  # the early loss is ~10x the plateau level
    ax_l.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax_l.yaxis.set_minor_locator(LogLocator(subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    ax_l.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_l.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    for ax, title, ylab in ((ax_l, "Loss summed over the TTT positions: train vs eval",
                             "loss sum (nats, log scale)"),
                            (ax_a, "First-token accuracy (full_acc_0): train vs eval",
                             "accuracy")):
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(" / ".join(label.get(v, v) for v in sorted(used))
                      + (", log scale" if logx else ""))
        ax.set_ylabel(ylab)
        ax.set_title(title, fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Plateau and train/eval gap (shaded: eval - train; dotted line and triangle: "
                 "the plateau detector)", fontsize=10)
    fig.tight_layout()
    return fig


def _name(df) -> str:
    src, lk = df.attrs.get("source"), df.attrs.get("loss_kind")
    extra = f" [{src}, loss={lk}]" if src and src != "eagle3lab" else ""
    return f"{df.attrs.get('run', 'run')}{extra}"


def reference_frames(references: Sequence[str | os.PathLike], *, names: Sequence[str] = (),
                     exclude: Sequence[str | os.PathLike] = ()) -> tuple[list, list[str]]:
    """The training curves of reference runs to draw beside a notebook's own runs: each a
    run dir, a drafter dir (its own metrics.jsonl, as data/drafters/NAME ships it) or a
    run's final/ drafter, or "default" (the shipped default drafter). Returns (frames,
    notes): a reference with no curve, or whose curve is one of `exclude` (the runs
    already drawn), is left out with a note saying why."""
    seen = {m.resolve() for e in exclude if (m := metrics_file(e))}
    frames, notes = [], []
    for k, ref in enumerate(references):
        if str(ref) == "default":
            ref = default_drafter()
            if ref is None:
                notes.append("'default': no shipped default drafter was found")
                continue
        path = Path(ref)
        metrics = metrics_file(path)
        metrics = metrics.resolve() if metrics is not None else None
        if metrics in seen and metrics is not None:
            notes.append(f"{path}: its curve {metrics} is already drawn")
            continue
        if metrics is None and not path.exists():
            notes.append(f"{path}: does not exist")
            continue
        if metrics is not None:
            seen.add(metrics)
        name = (names[k] if k < len(names) and names[k] else
                f"{'shipped default drafter' if str(references[k]) == 'default' else path.name}"
                ", own eval split")
        frames.append(load_metrics(metrics or path, name=name))
    return frames, notes
