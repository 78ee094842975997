"""Reading the at-scale study's committed results (the layout `atscale.collect` writes):
which runs are done, their curves with plateaus and late drops, the equal-compute table
with the seed spread, live tau beside the teacher-forced numbers, the verdict, and the
planner (tokens needed for a tau goal, with a range).

Prevents the misreadings such a study invites:
- a half-finished study read as a finished one, or crashing the notebook: every planned
  run has a row saying done / running / failed / missing, and everything renders from
  whatever is there;
- tau averaged over prompts or seeds as ratios: each live row's tau is recomputed from its
  summed raw counts (completion tokens / verify steps, `specdec.stats.AcceptStats`), and the
  arms' means and ranges are taken over those per-run values last;
- a late drop (grokking) missed because the plateau rule finds only the LAST flat stretch:
  `plateau_check` also finds the FIRST point at which the project's rule (study/plateau.py)
  would have called a plateau had the run stopped there, and reports either way whether
  eval loss later fell more than `drop_threshold` below that level, where (as a fraction
  of the run: a drop in a cosine schedule's last part is the annealing, not necessarily
  grokking), and how far past its plateau each run trained (the study asks >= 4x);
- a verdict inside seed noise or on one seed: the gap is compared with the seed spread
  (the largest min-max range of the two arms, as in study/sweep.py) and one seed says
  "spread unknown";
- a data budget read off a curve by eye: `fit_tau_curve` fits live tau against unique
  answer tokens and `tokens_for` gives the tokens for a goal with a bootstrap range, or
  says the goal is out of reach when the fitted ceiling is below it;
- that ceiling (of the study's equal compute) read as the answer to "train longer?":
  `plan_compute` fits live tau against tokens of training at one data size (the long
  runs), gives the measured gain of each doubling and, from three lengths, the ceiling
  their geometric decay implies; `data_by_training` gives the gain of more data at each
  training length where two data sizes were both trained (the data effect at equal
  compute is not the data effect at the lengths drafters are trained to).

The notebooks (06, 02) call these with keyword arguments; the figures are in study/plots.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Sequence

from eagle3lab.config import repo_root
from eagle3lab.errors import UserError
from eagle3lab.specdec.stats import AcceptStats
from eagle3lab.study.atscale import (MAIN_SETTING, OUR_RECIPE, REFERENCES, parse_setting,
                                      read_study)
from eagle3lab.study.curves import last_values
from eagle3lab.study.gap import _short
from eagle3lab.study.plateau import detect_plateau, plateau_of_arrays
from eagle3lab.train.counts import read_metrics

#: The columns every per-run frame starts with (the arm's description).
ARM_COLUMNS = ["run", "arm", "kind", "source", "pair", "planned_tokens", "unique_tokens",
               "weight_decay", "seed", "recipe"]
#: The final teacher-forced numbers the equal-compute table compares.
FINAL_METRICS = ("eval_loss_mean", "eval_full_acc_0", "eval_sim_accept_len")
#: How far past its plateau a run should train (issue 28: at least 4x the plateau's tokens).
PAST_GOAL = 4.0


def resolve_study_dir(study_dir: str | os.PathLike) -> Path:
    """A study directory as given; a relative one that is not found from the current
    directory is looked up in the checkout (the committed results, data/studies/NAME:
    papermill runs notebooks in other directories)."""
    p = Path(study_dir)
    if p.is_absolute() or p.exists():
        return p
    return repo_root() / p


def arm_name(run: str) -> str:
    """A run's arm: its name without the seed suffix (data-0.1M-wd0.01-s1 -> data-0.1M-wd0.01)."""
    return re.sub(r"-s\d+$", "", run)


# --- plateau and late drop ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PlateauCheck:
    """One curve judged by the plateau rule twice: on the whole curve (`plateaued`, `start`,
    `level`: where it is flat at the end) and at the FIRST point the rule would have called
    a plateau had training stopped there (`first_start`, `first_level`, `first_called_at`).
    `late_drop`: the metric later went more than `drop_threshold` (relative) past
    `first_level` (None: it never plateaued, so there is nothing to drop from)."""

    metric: str
    x: str
    points: int
    last_x: float | None
    plateaued: bool
    start: float | None
    level: float | None
    first_start: float | None
    first_level: float | None
    first_called_at: float | None
    past_plateau: float | None  # last_x / first_start
    late_drop: bool | None
    drop_at: float | None  # x of the first point past the threshold
    drop_best: float | None  # the best value after the first call
    drop_relative: float | None  # (first_level - drop_best) / first_level, losses
    drop_threshold: float

    @property
    def drop_fraction(self) -> float | None:
        """Where the drop happened, as a fraction of the run's last x."""
        return self.drop_at / self.last_x if self.drop_at is not None and self.last_x else None

    def describe(self) -> str:
        if self.first_start is None:
            return (f"{self.metric} never plateaued ({self.points} points): no late drop to "
                    f"look for.")
        past = (f"trained to {self.past_plateau:.1f}x the tokens where it plateaued"
                if self.past_plateau is not None else "plateaued from its first point")
        head = (f"{self.metric} first plateaued at {self.first_level:.4g} from "
                f"{self.x}={_short(self.first_start)} (called at {_short(self.first_called_at)}"
                f"); {past}; ")
        if self.late_drop:
            return head + (f"LATE DROP: {self.drop_relative:.1%} past that level from "
                           f"{_short(self.drop_at)} ({self.drop_fraction:.0%} of the run).")
        return head + (f"no late drop (best later value {self.drop_relative:.1%} beyond that "
                       f"level; threshold {self.drop_threshold:.0%}).")


def plateau_check(df, metric: str = "eval_loss_mean", *, x: str = "tokens", window: int = 3,
                  threshold: float = 0.01, drop_threshold: float = 0.02) -> PlateauCheck:
    """Judge `metric` of a metrics frame (rows without it dropped) with study/plateau.py's
    rule (window, threshold) on the whole curve and on each prefix: the first prefix the
    rule calls plateaued gives the first plateau; a later point more than `drop_threshold`
    below its level (above, for accuracies) is a late drop."""
    d = df[[x, metric]].dropna().reset_index(drop=True) if metric in df.columns else df.iloc[0:0]
    n = len(d)
    full = detect_plateau(d, metric, x=x, window=window, threshold=threshold) if n else None
    mode = full.mode if full else "min"
    sign = 1.0 if mode == "min" else -1.0
    ys, xs = d[metric].to_numpy(dtype=float), d[x].to_numpy(dtype=float)
    first = None
    for e in range(window + 1, n + 1):
        p = plateau_of_arrays(xs[:e], ys[:e], metric=metric, x=x, window=window,
                              threshold=threshold, mode=mode)
        if p.plateaued:
            first, called = p, e - 1
            break
    last_x = float(xs[-1]) if n else None
    common = dict(metric=metric, x=x, points=n, last_x=last_x,
                  plateaued=bool(full and full.plateaued),
                  start=full.start if full and full.plateaued else None,
                  level=full.level if full and full.plateaued else None,
                  drop_threshold=drop_threshold)
    if first is None:
        return PlateauCheck(**common, first_start=None, first_level=None, first_called_at=None,
                            past_plateau=None, late_drop=None, drop_at=None, drop_best=None,
                            drop_relative=None)
    level = first.level
    after = range(called + 1, n)
    best = (min if sign > 0 else max)((ys[i] for i in after), default=None)
    rel = (sign * (level - best) / max(abs(level), 1e-12)) if best is not None else 0.0
    past = [i for i in after if sign * (level - ys[i]) / max(abs(level), 1e-12)
            > drop_threshold]
    return PlateauCheck(**common, first_start=first.start, first_level=level,
                        first_called_at=float(xs[called]),
                        past_plateau=last_x / first.start if first.start else None,
                        late_drop=bool(past), drop_at=float(xs[past[0]]) if past else None,
                        drop_best=best, drop_relative=rel)


# --- loading --------------------------------------------------------------------------------
@dataclasses.dataclass
class AtScaleResults:
    """What a study directory holds. Frames (pandas): `arms` (one row per planned run:
    status done / running / failed / missing, tokens processed, wall_s, tokens_per_s,
    live rows), `curves` (every run's metrics rows with the arm columns), `live` (one row
    per run x live point x draft shape: raw counts, tau from them, cumulative acceptance,
    and the teacher-forced estimates at the nearest evaluation), `plateaus` (one row per
    run with curves: `plateau_check`'s fields and its sentence), `references` (drafters
    trained elsewhere, decoded as the runs are: one row per reference x draft shape, raw
    counts and tau). `notes`: what could not be read."""

    study_dir: Path
    study: dict[str, Any]
    arms: Any
    curves: Any
    live: Any
    plateaus: Any
    notes: list[str]
    references: Any

    @functools.cached_property
    def _final(self):
        """`final_values`' table, built once: every reader starts from it, and the frames
        above are not changed after loading."""
        return _final_values(self)

    @property
    def tokens_per_run(self) -> int:
        return int(self.study["config"]["tokens_per_run"])

    @property
    def settings(self) -> list[str]:
        """The draft shapes measured live, the study's order first."""
        planned = list(self.study["config"].get("live_settings") or [])
        seen = list(self.live["setting"].unique()) if len(self.live) else []
        return planned + [s for s in seen if s not in planned]

    @property
    def done(self) -> list[str]:
        return list(self.arms.loc[self.arms["status"] == "done", "run"])

    def describe(self) -> str:
        """One line: runs by status, live measurements, where."""
        counts = self.arms["status"].value_counts()
        parts = [f"{int(counts.get(s, 0))} {s}" for s in ("done", "running", "failed",
                                                          "missing") if counts.get(s, 0)]
        lived = self.live["run"].nunique() if len(self.live) else 0
        return (f"At-scale study {self.study_dir}: {len(self.arms)} planned runs "
                f"({', '.join(parts)}), {self.tokens_per_run:,} tokens each; live tau for "
                f"{lived} run(s)." + "".join(f" Note: {n}" for n in self.notes))


def _status(run_dir: Path) -> tuple[str, dict[str, Any]]:
    p = run_dir / "run.json"
    if not p.is_file():
        return "missing", {}
    try:
        info = json.loads(p.read_text())
    except (OSError, ValueError):
        return "unreadable", {}
    s = info.get("status")
    return {"done": "done", "failed": "failed"}.get(s, "running"), info


def _nearest_eval(frame, tokens: float | None, step: int | None):
    """The eval row nearest the live point (by tokens, else by step)."""
    ev = frame[frame["eval_loss_mean"].notna()] if "eval_loss_mean" in frame else frame.iloc[0:0]
    if not len(ev):
        return None
    key, at = ("tokens", tokens) if tokens is not None and ev["tokens"].notna().any() \
        else ("step", step)
    if at is None:
        return None
    return ev.loc[(ev[key] - at).abs().idxmin()]


def _sim_columns(row, setting: str) -> dict[str, Any]:
    """Teacher-forced estimates at an eval row: the all-positions accept length and the
    chain estimate 1 + sum_{i<S} full_acc_i for the shape's S draft steps (for a tree,
    K > 1, the chain estimate of its depth: a lower bound of what a tree accepts)."""
    if row is None:
        return {"eval_tokens": None, "eval_sim_accept_len": None, "sim_chain": None}
    steps = parse_setting(setting)[0]
    accs = [row.get(f"eval_full_acc_{i}") for i in range(steps)]
    chain = (1.0 + sum(accs)) if all(a is not None and not math.isnan(a) for a in accs) else None
    return {"eval_tokens": row.get("tokens"), "eval_sim_accept_len":
            row.get("eval_sim_accept_len"), "sim_chain": chain}


def _live_rows(path: Path, desc: dict[str, Any], frame, notes: list[str]) -> list[dict]:
    """A run's live.json as rows: tau and cumulative acceptance from the raw counts, the
    teacher-forced estimates at the nearest evaluation. A row without counts is left out
    (and said in `notes`)."""
    if not path.is_file():
        return []
    try:
        whole = json.loads(path.read_text())
        raw = whole["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        notes.append(f"{path} is not a live.json (no rows); left out.")
        return []
    if whole.get("complete", True) is False:
        notes.append(f"{path}: the live decode stopped before its last point ({len(raw)} "
                     f"row(s) measured); the rows it has are read.")
    rows = []
    for k, r in enumerate(raw):
        try:
            st = AcceptStats(requests=int(r.get("requests") or 0),
                             completion_tokens=int(r["completion_tokens"]),
                             verify_ct=int(r["verify_ct"]),
                             histogram=list(r.get("accept_histogram") or []))
            setting = str(r["setting"])
            parse_setting(setting)
        except (KeyError, TypeError, ValueError, UserError):
            notes.append(f"{path}: row {k} has no raw counts or draft shape; left out.")
            continue
        ev = _nearest_eval(frame, r.get("tokens"), r.get("step")) if frame is not None \
            else None
        rows.append({**desc, "fraction": r.get("fraction"), "step": r.get("step"),
                     "tokens": r.get("tokens"), "setting": setting,
                     "final": (r.get("fraction") or 0) >= 1, "requests": st.requests,
                     "completion_tokens": st.completion_tokens, "verify_ct": st.verify_ct,
                     "tau": st.tau, "acceptance_cumulative": st.cumulative(),
                     **_sim_columns(ev, setting)})
    return rows


def pair_label(pair) -> str:
    """How an arm took its records from the pool (atscale.PAIRINGS; "" for a plain prefix,
    so that group-bys keep it); True (older plans) meant "both"."""
    return "both" if pair is True else (pair or "")


def load_results(study_dir: str | os.PathLike, *, plateau_metric: str = "eval_loss_mean",
                 window: int = 3, threshold: float = 0.01,
                 drop_threshold: float = 0.02) -> AtScaleResults:
    """Read STUDY/study.json and each planned run's runs/NAME/{run.json, metrics.jsonl,
    live.json}, whatever is there. `window` / `threshold`: the plateau rule's; a late drop
    is a fall of more than `drop_threshold` (relative) below the first plateau's level."""
    import pandas as pd

    study_dir = resolve_study_dir(study_dir)
    study = read_study(study_dir)  # a torn or hand-edited file: one line
    notes: list[str] = []
    arm_rows, curves, live_rows, plateau_rows = [], [], [], []
    for a in study.get("arms") or []:
        run_dir = study_dir / "runs" / a["name"]
        desc = {"run": a["name"], "arm": arm_name(a["name"]), "kind": a.get("kind"),
                "source": a.get("source"), "pair": pair_label(a.get("pair")),
                "planned_tokens": a.get("unique_tokens"),
                "unique_tokens": (a.get("data") or {}).get("tokens"),
                "weight_decay": a.get("weight_decay"), "seed": a.get("seed"),
                "recipe": a.get("recipe", "eagle3lab")}
        status, info = _status(run_dir)
        if status == "unreadable":
            notes.append(f"{run_dir / 'run.json'} is not readable JSON; counted as missing.")
            status = "missing"
        summary = info.get("summary") or {}
        progress = info.get("progress") or {}
        frame = None
        if (run_dir / "metrics.jsonl").is_file():
            frame = read_metrics(run_dir)
            if len(frame):
                curves.append(frame.assign(**desc))
            else:
                frame = None
        tokens = summary.get("tokens", progress.get("tokens"))
        if tokens is None and frame is not None and "tokens" in frame:
            tokens = frame["tokens"].max()
        wall = summary.get("wall_s", progress.get("wall_s"))
        rows = _live_rows(run_dir / "live.json", desc, frame, notes)
        live_rows += rows
        arm_rows.append({**desc, "status": status, "steps": summary.get(
            "steps", progress.get("step")), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": summary.get("tokens_per_s") or (
                tokens / wall if tokens and wall else None), "live_rows": len(rows)})
        if frame is not None and plateau_metric in frame.columns:
            pc = plateau_check(frame, plateau_metric, x="tokens", window=window,
                               threshold=threshold, drop_threshold=drop_threshold)
            plateau_rows.append({**desc, "status": status,
                                 **{f.name: getattr(pc, f.name)
                                    for f in dataclasses.fields(pc)},
                                 "drop_fraction": pc.drop_fraction,
                                 "enough_past": (pc.past_plateau >= PAST_GOAL
                                                 if pc.past_plateau is not None else None),
                                 "text": pc.describe()})
    arms = pd.DataFrame(arm_rows, columns=ARM_COLUMNS + [
        "status", "steps", "tokens", "wall_s", "tokens_per_s", "live_rows"])
    return AtScaleResults(
        study_dir=study_dir, study=study, arms=arms,
        curves=pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
            columns=ARM_COLUMNS + ["step", "tokens"]),
        live=pd.DataFrame(live_rows, columns=ARM_COLUMNS + [
            "fraction", "step", "tokens", "setting", "final", "requests", "completion_tokens",
            "verify_ct", "tau", "acceptance_cumulative", "eval_tokens", "eval_sim_accept_len",
            "sim_chain"]),
        plateaus=pd.DataFrame(plateau_rows), notes=notes,
        references=pd.DataFrame(_reference_rows(study_dir, notes), columns=REFERENCE_COLUMNS))


#: The columns of `AtScaleResults.references`.
REFERENCE_COLUMNS = ["reference", "setting", "requests", "completion_tokens", "verify_ct",
                     "tau", "acceptance_cumulative"]


def _reference_rows(study_dir: Path, notes: list[str]) -> list[dict[str, Any]]:
    """STUDY/references/NAME/live.json (measure_reference) as rows."""
    rows = []
    for p in sorted((study_dir / REFERENCES).glob("*/live.json")):
        for r in _live_rows(p, {"reference": p.parent.name}, None, notes):
            rows.append({k: r[k] for k in REFERENCE_COLUMNS})
    return rows


def shipped_run(results: AtScaleResults, drafter: str | os.PathLike) -> str | None:
    """The study run whose drafter `drafter` is (a shipped drafter keeps its run's
    `metrics.jsonl` byte for byte, as the study's winner stage packs it), or None: no run's
    curve is the drafter's (trained elsewhere, or its run's results are not here)."""
    mine = Path(drafter) / "metrics.jsonl"
    if not mine.is_file():
        return None
    body = mine.read_bytes()
    for a in results.study["arms"]:
        run = results.study_dir / "runs" / a["name"] / "metrics.jsonl"
        if run.is_file() and run.stat().st_size == len(body) and run.read_bytes() == body:
            return str(a["name"])
    return None


def against_reference(results: AtScaleResults, *, reference: str = "shipped",
                      setting: str = MAIN_SETTING,
                      shipped: str | os.PathLike | None = None) -> dict[str, Any]:
    """The best finished run's final live tau at `setting` against a reference drafter's,
    measured the same way (issue 28, part 4: a run replaces the shipped drafter only if it
    beats it on the held-out prompts). `setting` falls back as the verdict's does
    (`measured_setting`). Only finished runs count. Returns {"text", "setting",
    "reference_tau", "best_run", "best_tau", "replaces", "best_arm", "best_arm_tau",
    "best_arm_runs"} (None where not measured): the best arm is the one whose seeds' mean is
    highest, `best_arm_runs` its runs' taus, so a best run whose lead over its own arm's
    other seeds is seed noise reads as the arm's, not as a new winner (either seed may be
    the one shipped: only a run the winner stage collected has its weights). With `shipped`
    (the shipped drafter's directory) also "shipped_run" (`shipped_run`) and
    "shipped_tau", and the text says when the best run is not the drafter that ships, so
    a reader does not take a result whose weights stayed on the device for the default."""
    setting = measured_setting(results, setting) or setting
    ref = results.references
    ref = ref[(ref["reference"] == reference) & (ref["setting"] == setting)]
    live = results.live
    finals = live[(live["setting"] == setting) & live["final"]
                  & live["run"].isin(results.done)] if len(live) else live
    out: dict[str, Any] = {"setting": setting, "reference_tau": None, "best_run": None,
                           "best_tau": None, "replaces": None, "best_arm": None,
                           "best_arm_tau": None, "best_arm_runs": None}
    if shipped is not None:
        out["shipped_run"] = shipped_run(results, shipped)
        tau = finals[finals["run"] == out["shipped_run"]]["tau"] if len(finals) else []
        out["shipped_tau"] = float(tau.iloc[0]) if len(tau) else None
    if not len(ref):
        out["text"] = (f"No reference drafter {reference!r} measured at {setting} "
                       f"(bench/study_gpu.py reference).")
        return out
    out["reference_tau"] = float(ref["tau"].iloc[0])
    if not len(finals):
        out["text"] = (f"The {reference} drafter: tau {out['reference_tau']:.3f} at "
                       f"{setting}; no run's final drafter is measured there yet.")
        return out
    best = finals.loc[finals["tau"].idxmax()]
    out.update(best_run=str(best["run"]), best_tau=float(best["tau"]),
               replaces=bool(best["tau"] > out["reference_tau"]))
    arms = finals["run"].map(arm_name)
    arm = str(finals["tau"].groupby(arms, sort=False).mean().idxmax())
    runs = finals[arms == arm].sort_values("run")
    out.update(best_arm=arm, best_arm_tau=float(runs["tau"].mean()),
               best_arm_runs={str(r): float(t) for r, t in zip(runs["run"], runs["tau"])})
    seeds = ""
    if arm != arm_name(out["best_run"]):
        seeds = (f" (the best arm by its seeds' mean is {arm}: {out['best_arm_tau']:.3f} "
                 f"over {len(runs)})")
    elif len(runs) > 1:
        seeds = (f" (its arm's {len(runs)} seeds: "
                 f"{', '.join(f'{t:.3f}' for t in runs['tau'])}; mean "
                 f"{out['best_arm_tau']:.3f})")
    out["text"] = (f"The {reference} drafter: tau {out['reference_tau']:.3f} at {setting} "
                   f"(the runs' prompts, engine and dtype); the best run's final drafter, "
                   f"{best['run']}: {best['tau']:.3f}{seeds}, so it "
                   + ("replaces it." if out["replaces"] else "does not replace it."))
    if shipped is not None and out["shipped_run"] != out["best_run"]:
        if out["shipped_run"] is None:
            out["text"] += (f" No run of this study is the drafter in {Path(shipped).name} "
                            f"(its curve is none of theirs).")
        else:
            out["text"] += (f" The drafter that ships ({Path(shipped).name}) is "
                            f"{out['shipped_run']}'s"
                            + (f" ({out['shipped_tau']:.3f})" if out["shipped_tau"] is not None
                               else "")
                            + f": {best['run']}'s weights did not come back (only a run "
                              f"collected as the winner has its weights).")
    return out


def open_results(study_dir: str | os.PathLike, **kw) -> tuple[AtScaleResults | None, str]:
    """(results, one line) for a notebook section: results None, and the line saying why,
    when the directory holds no study or no finished run yet."""
    path = resolve_study_dir(study_dir)
    if not (path / "study.json").is_file():
        return None, (f"No at-scale results in {path} (no study.json): this section renders "
                      f"the committed results of bench/study_gpu.py once they exist.")
    try:
        res = load_results(path, **kw)
    except UserError as e:
        return None, f"At-scale results in {path} not read: {e}"
    if not res.done:
        return None, res.describe() + " No finished run yet: nothing to compare."
    return res, res.describe()


# --- the equal-compute table --------------------------------------------------------------
def final_values(results: AtScaleResults):
    """One row per finished run: the last logged FINAL_METRICS and the final drafter's live
    tau at each shape (`tau@S,K,D`)."""
    return results._final.copy()


def _final_values(results: AtScaleResults):
    import pandas as pd

    rows = []
    done = results.arms[results.arms["status"] == "done"]
    curves = (dict(tuple(results.curves.groupby("run", sort=False)))
              if len(results.curves) else {})
    for _, a in done.iterrows():
        row = {c: a[c] for c in ARM_COLUMNS}
        row["tokens"] = a["tokens"]
        c = curves.get(a["run"])
        last = last_values(c) if c is not None and len(c) else {}
        row.update({m: last.get(m) for m in FINAL_METRICS})
        lv = results.live[(results.live["run"] == a["run"]) & results.live["final"]]
        for s in results.settings:
            t = lv[lv["setting"] == s]["tau"]
            row[f"tau@{s}"] = float(t.iloc[-1]) if len(t) else None
        rows.append(row)
    return pd.DataFrame(rows, columns=ARM_COLUMNS + ["tokens", *FINAL_METRICS] + [
        f"tau@{s}" for s in results.settings])


def _order(df):
    kinds = {"data": 0, "regen": 1, "recipe": 2, "long": 4}
    return df.assign(_k=df["kind"].map(kinds).fillna(3)).sort_values(
        ["_k", "recipe", "weight_decay", "unique_tokens", "source", "pair"],
        kind="stable").drop(columns="_k").reset_index(drop=True)


def equal_compute_table(results: AtScaleResults):
    """One row per arm (kind x data source x unique answer tokens x weight decay x recipe)
    with finished runs: seeds done of planned, and for each final teacher-forced metric and
    each live shape the mean over seeds, min, max and the seeds it has (`m`, `m_min`,
    `m_max`, `m_n`: a run whose final drafter is not measured live yet is not a seed of
    its tau).
    eval_loss_mean and eval_sim_accept_len are over each run's own TTT positions: between
    recipes of different depths only eval_full_acc_0 and live tau are the same quantity."""
    import pandas as pd

    fin = final_values(results)
    fin = fin[fin["kind"] != "long"]  # their own compute: long_runs
    metrics = [*FINAL_METRICS] + [f"tau@{s}" for s in results.settings]
    planned = results.arms.groupby("arm")["run"].count()
    rows = []
    for arm, g in fin.groupby("arm", sort=False):
        first = g.iloc[0]
        row = {"arm": arm, "kind": first["kind"], "source": first["source"],
               "pair": first["pair"], "planned_tokens": first["planned_tokens"],
               "unique_tokens": first["unique_tokens"],
               "weight_decay": first["weight_decay"], "recipe": first["recipe"],
               "seeds": len(g), "seeds_planned": int(planned.get(arm, len(g))),
               "tokens": g["tokens"].mean()}
        for m in metrics:
            v = pd.to_numeric(g[m], errors="coerce").dropna()
            row[m] = v.mean() if len(v) else None
            row[f"{m}_min"] = v.min() if len(v) else None
            row[f"{m}_max"] = v.max() if len(v) else None
            row[f"{m}_n"] = len(v)
        rows.append(row)
    cols = ["arm", "kind", "source", "pair", "planned_tokens", "unique_tokens",
            "weight_decay", "recipe",
            "seeds", "seeds_planned", "tokens"] + [
                c for m in metrics for c in (m, f"{m}_min", f"{m}_max", f"{m}_n")]
    return _order(pd.DataFrame(rows, columns=cols))


# --- far past the plateau ---------------------------------------------------------------------
def long_runs(results: AtScaleResults):
    """One row per finished long run (constant rate, its own token count): data size, weight
    decay, tokens, where eval loss first plateaued and how far past it the run went, the
    late-drop verdict, the final teacher-forced metrics and live tau. None when the study
    plans no long arms."""
    import pandas as pd

    if not (results.arms["kind"] == "long").any():
        return None
    fin = final_values(results)
    fin = fin[fin["kind"] == "long"]
    p = results.plateaus
    cols = ["run", "first_start", "first_level", "past_plateau", "late_drop",
            "drop_relative", "drop_fraction"]
    if len(fin) and len(p):
        fin = fin.merge(p[cols], on="run", how="left")
    else:
        fin = fin.assign(**{c: None for c in cols[1:]})
    sched = {a["name"]: (a.get("overrides") or {}).get("schedule", "cosine")
             for a in results.study.get("arms") or []}
    fin = fin.assign(schedule=[sched.get(r, "cosine") for r in fin["run"]])
    return fin.sort_values(["schedule", "weight_decay", "unique_tokens"],
                           ascending=[False, True, True]).reset_index(drop=True)


def long_sentence(long) -> str:
    """'Far past the plateau (constant rate): ...' from `long_runs`' rows."""
    judged = long[long["first_start"].notna()]
    parts = []
    for _, r in long.iterrows():
        head = (f"{_short(float(r['unique_tokens']))} wd {r['weight_decay']:g}"
                + ("" if r["recipe"] == "eagle3lab" else f", {r['recipe']} recipe")
                + ("" if r["schedule"] == "constant" else f" ({r['schedule']} rate)"))
        if _isna(r["first_start"]):
            parts.append(f"{head}: never plateaued in {_short(float(r['tokens']))} tokens")
            continue
        drop = (f"a late drop of {r['drop_relative']:.1%} at {r['drop_fraction']:.0%} of the "
                f"run" if r["late_drop"] else
                f"no late drop (best later {r['drop_relative']:.1%} past it)")
        parts.append(f"{head}: plateaued at {_short(float(r['first_start']))} tokens, trained "
                     f"to {r['past_plateau']:.1f}x that, {drop}")
    far = int((judged["past_plateau"] >= PAST_GOAL).sum()) if len(judged) else 0
    return (f"Far past the plateau ({far} of {len(long)} long run(s) at least "
            f"{PAST_GOAL:g}x past it; constant rate unless said): " + "; ".join(parts) + ".")


def _isna(v) -> bool:
    import pandas as pd

    return v is None or bool(pd.isna(v))


# --- the verdict --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Comparison:
    """Arm `a` against arm `b` on one metric (rows of `equal_compute_table`)."""

    metric: str
    a: float
    b: float
    gap: float  # a - b
    spread: float | None  # the larger of the two arms' min-max ranges (None: one seed)
    seeds: int  # the fewer seeds of the two with this metric
    #: where the spread was measured when one of the two arms has a single seed: the other
    #: data sizes' seeds (`with_borrowed_spread`); None: the two arms' own seeds
    spread_from: str | None = None

    @property
    def decisive(self) -> bool | None:
        return None if self.spread is None else abs(self.gap) > self.spread

    def uncertainty(self) -> str:
        if self.spread is None:
            return "one seed: spread unknown"
        side = "beyond" if self.decisive else "within"
        if self.spread_from is not None:
            return (f"gap {abs(self.gap):.3g} {side} the largest seed spread measured, "
                    f"{self.spread:.3g} ({self.spread_from})")
        return (f"gap {abs(self.gap):.3g} {side} the seed spread {self.spread:.3g} over "
                f"{self.seeds} seeds")


def with_borrowed_spread(c: Comparison, rows) -> Comparison:
    """`c` unchanged when its arms have their own seed spread; else the largest min-max
    range of `c.metric` over the `rows` (equal_compute_table rows) that have two or more
    seeds, named in `spread_from`: one arm's single seed does not leave the verdict without
    an uncertainty when other data sizes measured how far seeds go apart."""
    if c.spread is not None or f"{c.metric}_n" not in rows:
        return c
    seeded = rows[rows[f"{c.metric}_n"] >= 2]
    if not len(seeded):
        return c
    ranges = seeded[f"{c.metric}_max"] - seeded[f"{c.metric}_min"]
    seeds = int(seeded[f"{c.metric}_n"].min())
    sizes = ", ".join(_short(float(t)) for t in seeded["unique_tokens"])
    return dataclasses.replace(c, spread=float(ranges.max()), seeds=seeds,
                               spread_from=f"{seeds} seeds at {sizes}; one at the other sizes")


def compare(a, b, metric: str) -> Comparison | None:
    """`a` vs `b` (equal_compute_table rows) on `metric`; None when either lacks it."""
    va, vb = a.get(metric), b.get(metric)
    if va is None or vb is None or (isinstance(va, float) and math.isnan(va)) or (
            isinstance(vb, float) and math.isnan(vb)):
        return None
    seeds = int(min(a[f"{metric}_n"], b[f"{metric}_n"]))
    spread = (max(a[f"{metric}_max"] - a[f"{metric}_min"], b[f"{metric}_max"]
                  - b[f"{metric}_min"]) if seeds >= 2 else None)
    return Comparison(metric=metric, a=float(va), b=float(vb), gap=float(va - vb),
                      spread=None if spread is None else float(spread), seeds=seeds)


def _better(metric: str) -> int:
    """+1 when higher is better."""
    return -1 if "loss" in metric else 1


def _fmt(metric: str, v: float) -> str:
    """tau to two decimals, losses to four significant digits, the rest to three."""
    return f"{v:.2f}" if metric.startswith("tau@") else (f"{v:.4g}" if "loss" in metric
                                                         else f"{v:.3g}")


def _metric_name(metric: str) -> str:
    return f"live tau at {metric[4:]}" if metric.startswith("tau@") else metric


def measured_setting(results: AtScaleResults, setting: str = MAIN_SETTING) -> str | None:
    """`setting` when some finished run's final drafter was measured live at it, else the
    first shape one was (a study run with other shapes), else None."""
    lv = results.live
    done = lv[lv["final"] & lv["run"].isin(results.done)]["setting"].unique()
    return setting if setting in done else next(
        (s for s in results.settings if s in done), None)


def _primary(results: AtScaleResults, setting: str) -> str:
    """The verdict's metric: live tau at `measured_setting`, else eval loss."""
    s = measured_setting(results, setting)
    return f"tau@{s}" if s else "eval_loss_mean"


def _core(table, results: AtScaleResults, weight_decay: float | None = None):
    """Data arms of our recipe at one weight decay (default: the study's first)."""
    wd = weight_decay if weight_decay is not None else results.study["config"][
        "weight_decays"][0]
    t = table[(table["kind"] == "data") & (table["recipe"] == "eagle3lab")]
    return t[t["weight_decay"] == wd].sort_values("unique_tokens")


def _tok(n) -> str:
    return f"{_short(float(n))} unique answer tokens"


def _tau_across(results: AtScaleResults, run: str, at: float, setting: str):
    """Live tau at `setting` at the run's last checkpoint point at or before `at` tokens and
    at its final drafter: (before, its tokens, after), or None where the run has no such
    pair."""
    lv = results.live
    if not len(lv):
        return None
    rows = lv[(lv["run"] == run) & (lv["setting"] == setting)]
    end = rows[rows["final"]]
    early = rows[~rows["final"] & (rows["tokens"] <= at)].sort_values("tokens")
    if not len(early) or not len(end):
        return None
    return (float(early.iloc[-1]["tau"]), float(early.iloc[-1]["tokens"]),
            float(end.iloc[0]["tau"]))


def _grokking(results: AtScaleResults, setting: str = MAIN_SETTING) -> tuple[str, dict[str, Any]]:
    """Late drops in eval loss, each with the live tau across it (the last live point before
    the drop against the end): an eval-loss drop that live tau does not follow is not the
    grokking a drafter is trained for. Only a live point on the plateau (at or after its
    first start) measures the drop; one from before the plateau also holds what the run
    learned on its way there, so it is named but left out of the range (session 20: the 6M
    run's point at 31.1M, its plateau from 48.6M, would have read +0.107)."""
    p = results.plateaus
    p = p[p["status"] == "done"] if len(p) else p
    if not len(p):
        return "no finished curve to look for a late drop in", {"late_drops": None}
    judged = p[p["first_start"].notna()]
    late = judged[judged["late_drop"].astype(bool)]
    never = len(p) - len(judged)
    tail = f" ({never} never plateaued)" if never else ""
    numbers: dict[str, Any] = {"late_drops": len(late), "plateaued_runs": len(judged)}
    if len(late):
        where, gains, early = [], [], 0
        for _, r in late.iterrows():
            across = _tau_across(results, r["run"], float(r["drop_at"]), setting)
            live = ""
            if across is not None:
                before, at, end = across
                if at >= float(r["first_start"]):
                    gains.append(end - before)
                    live = f"; live tau {before:.3f} before it, {end:.3f} at the end"
                else:
                    early += 1
                    live = (f"; live tau {before:.3f} at {_short(at)} tokens, before its "
                            f"plateau began at {_short(float(r['first_start']))}, {end:.3f} "
                            "at the end")
            where.append(f"{r['run']} ({r['drop_relative']:.1%} below its plateau at "
                         f"{r['drop_fraction']:.0%} of the run{live})")
        text = f"a late drop in eval loss (grokking?) in {len(late)} of {len(judged)} " \
               f"plateaued runs: {', '.join(where)}{tail}"
        more = (f"; {early} more whose last live point before the drop predates the plateau"
                if early else "")
        if gains:
            text += (f"; across those drops live tau at {setting} moved {min(gains):+.3f} to "
                     f"{max(gains):+.3f} ({len(gains)} run(s) with a live point on the plateau "
                     f"before the drop{more})")
            numbers["late_drop_tau_gain_max"] = max(gains)
        elif early:
            text += (f"; no run has a live point on its plateau before the drop ({early} "
                     "whose last one predates the plateau)")
    else:
        text = (f"no late drop (grokking) in any of the {len(judged)} runs whose eval loss "
                f"plateaued{tail}") if len(judged) else f"no run's eval loss plateaued{tail}"
    return text, numbers


def _arms_sentence(title: str, rows: list[tuple[str, Any]], metric: str) -> str:
    """'TITLE: METRIC a X, b Y; best a (uncertainty to the next).'"""
    sign = _better(metric)
    vals = ", ".join(f"{label} {_fmt(metric, r[metric])}" for label, r in rows)
    ranked = sorted(rows, key=lambda lr: -sign * lr[1][metric])
    c = compare(ranked[0][1], ranked[1][1], metric)
    return (f"{title}: {_metric_name(metric)} {vals}; best {ranked[0][0]} "
            f"({c.uncertainty()} to {ranked[1][0]}).")


def verdict(results: AtScaleResults, *, setting: str = MAIN_SETTING,
            weight_decay: float | None = None) -> dict[str, Any]:
    """The study's answer computed from the numbers. `text`: one sentence: at equal compute,
    did the largest data arm beat the smallest (longer training on less data), on live tau
    at `setting` (else eval loss) and on eval loss, with the gap against the seed spread,
    and whether any finished run's eval loss dropped late, with live tau before each drop and
    at the end (`late_drop_tau_gain_max`: the largest move from a point on the plateau).
    `sentences`: the same, then weight decay, regeneration (greedy vs sampled vs both),
    recipe, and the 4x-past-plateau check, where those arms finished. Numbers beside them
    for the report."""
    table = equal_compute_table(results)
    primary = _primary(results, setting)
    grok, grok_numbers = _grokking(results, measured_setting(results, setting) or setting)
    core = _core(table, results, weight_decay)
    core = core[core[primary].notna()] if primary in core else core.iloc[0:0]
    out: dict[str, Any] = {"metric": _metric_name(primary), **grok_numbers}
    if len(core) < 2:
        have = ", ".join(_short(float(t)) for t in core["unique_tokens"]) or "none"
        out["text"] = (f"Not enough finished data arms to compare yet (finished data sizes "
                       f"with {_metric_name(primary)}: {have}); {grok}.")
        out["sentences"] = [out["text"]]
        return out
    less, more = core.iloc[0], core.iloc[-1]
    main = with_borrowed_spread(compare(more, less, primary), core)
    loss = compare(more, less, "eval_loss_mean")
    loss = loss if loss is None else with_borrowed_spread(loss, core)
    more_wins = _better(primary) * main.gap > 0
    # "beat" only beyond the seed spread; with one seed the leader "came out ahead"
    verb = "beat" if main.decisive else "came out ahead of"
    if main.decisive is False or main.gap == 0:
        head = (f"more data ({_tok(more['unique_tokens'])}) and longer training on less "
                f"({_short(float(less['unique_tokens']))}) tie "
                + ("within seed noise" if main.gap else "exactly"))
    elif more_wins:
        head = (f"more data ({_tok(more['unique_tokens'])}) {verb} longer training on less "
                f"({_short(float(less['unique_tokens']))})")
    else:
        head = (f"longer training on less data ({_tok(less['unique_tokens'])}) {verb} more "
                f"data ({_short(float(more['unique_tokens']))})")
    parts = [f"{_metric_name(primary)} {_fmt(primary, main.a)} vs {_fmt(primary, main.b)} "
             f"({main.uncertainty()})"]
    if loss is not None and primary != "eval_loss_mean":
        agree = (loss.gap < 0) == more_wins
        parts.append(f"eval loss {_fmt('loss', loss.a)} vs {_fmt('loss', loss.b)} "
                     f"({loss.uncertainty()}"
                     + ("" if agree or loss.gap == 0 else "; it favours the other arm") + ")")
    text = (f"At equal compute ({results.tokens_per_run:,} tokens per run), {head}: "
            f"{'; '.join(parts)}; {grok}.")
    sentences = [text]
    # weight decay: each data size run at two or more weight decays
    data = table[(table["kind"] == "data") & (table["recipe"] == "eagle3lab")]
    data = data[data[primary].notna()]
    wds = sorted(data["weight_decay"].unique())
    if len(wds) >= 2:
        wins, gaps, decisive = 0, [], []
        sizes = 0
        for _, g in data.groupby("planned_tokens"):
            if g["weight_decay"].nunique() < 2:
                continue
            sizes += 1
            lo, hi = (g[g["weight_decay"] == w].iloc[0] for w in (g["weight_decay"].min(),
                                                                  g["weight_decay"].max()))
            c = compare(hi, lo, primary)
            wins += _better(primary) * c.gap > 0
            gaps.append(abs(c.gap))
            decisive.append(c.decisive)
        if sizes:
            spread = ("beyond the seed spread at " + str(sum(d is True for d in decisive))
                      + f" of {sizes}" if any(d is not None for d in decisive)
                      else "one seed: spread unknown")
            sentences.append(f"Weight decay {max(wds):g} vs {min(wds):g}: better "
                             f"{_metric_name(primary)} at {wins} of {sizes} data sizes "
                             f"(largest gap {max(gaps):.3g}; {spread}).")
    # regeneration: greedy vs sampled vs both at the regeneration size; the greedy side is
    # the greedy answers to the sampled arm's prompts where that arm ran, else the data arm
    regen = table[table["kind"] == "regen"]
    regen = regen[regen[primary].notna()]
    if len(regen):
        same = regen[regen["pair"] == "same-prompts"]
        greedy = same if len(same) else core[
            core["planned_tokens"] == regen["planned_tokens"].iloc[0]]
        rows = [("greedy", greedy.iloc[0])] if len(greedy) else []
        rows += [("both" if r["pair"] == "both" else "sampled", r)
                 for _, r in regen.iterrows() if r["pair"] != "same-prompts"]
        if len(rows) >= 2:
            sentences.append(_arms_sentence(
                f"Regeneration at {_tok(rows[0][1]['unique_tokens'])}", rows, primary))
    # recipes may train another TTT depth, over which eval_loss_mean averages: compare them
    # on live tau, else on the first position's accuracy (the same quantity at any depth)
    rmetric = primary if primary.startswith("tau@") else "eval_full_acc_0"
    recipe = table[(table["kind"] == "recipe")]
    for size, g in recipe[recipe[rmetric].notna()].groupby("planned_tokens"):
        ours = _core(table, results, weight_decay)
        ours = ours[(ours["planned_tokens"] == size) & ours[rmetric].notna()]
        if len(ours):
            sentences.append(_arms_sentence(
                f"Recipe at {_tok(g['unique_tokens'].iloc[0])}", [("eagle3lab", ours.iloc[0])]
                + [(r["recipe"], r) for _, r in g.iterrows()], rmetric))
    if (long := long_runs(results)) is not None and len(long):
        sentences.append(long_sentence(long))
    p = results.plateaus
    if len(p):
        p = p[(p["status"] == "done") & p["past_plateau"].notna()]
        if len(p):
            short = p[p["past_plateau"] < PAST_GOAL]
            decays = [a["name"] for a in results.study.get("arms") or []
                      if (a.get("overrides") or {}).get("schedule", "cosine") != "constant"]
            sentences.append(
                f"{len(p) - len(short)} of {len(p)} plateaued runs trained to at least "
                f"{PAST_GOAL:g}x the tokens where their eval loss first plateaued"
                + (f" (not: {', '.join(short['run'])})." if len(short) else ".")
                + (" A run whose learning rate decays to zero flattens at its end whatever "
                   "its data, so a plateau called in its last stretch is partly the "
                   "schedule's." if set(short["run"]) & set(decays) else ""))
    out.update(text=text, sentences=sentences, more_data=float(more["unique_tokens"]),
               less_data=float(less["unique_tokens"]), more=main.a, less=main.b,
               gap=main.gap, seed_spread=main.spread, seeds=main.seeds,
               seed_spread_from=main.spread_from,
               decisive=main.decisive, more_data_wins=bool(more_wins))
    return out


# --- weak spots vs random -------------------------------------------------------------------
def _seed_stats(g, metrics: Sequence[str]) -> dict[str, Any]:
    """Runs, seeds, mean unique answer tokens, and per metric the mean over seeds, min, max
    and the seeds it has (`m`, `m_min`, `m_max`, `m_n`: `compare`'s form)."""
    import pandas as pd

    row: dict[str, Any] = {"runs": len(g), "seeds": sorted(int(s) for s in g["seed"]),
                           "unique_tokens": float(g["unique_tokens"].mean()) if len(g)
                           else None}
    for m in metrics:
        v = pd.to_numeric(g[m], errors="coerce").dropna() if m in g else pd.Series([])
        row[m] = float(v.mean()) if len(v) else None
        row[f"{m}_min"] = float(v.min()) if len(v) else None
        row[f"{m}_max"] = float(v.max()) if len(v) else None
        row[f"{m}_n"] = len(v)
    return row


def weak_vs_random(results: AtScaleResults, *, setting: str = MAIN_SETTING) -> dict[str, Any]:
    """The weak-spots experiment (issue 29) read from the study's weak arms: the base prefix
    plus the N candidates the ranker accepted least on, against the base plus N drawn at
    random, at equal compute. `table`: one row per pick (weak, random) and the base alone
    (the data arm of the base size at the first weight decay, the weak arms' seeds where it
    has them): runs, seeds, unique answer tokens, and for live tau at each shape, eval
    acc (position 0) and eval loss the mean over seeds with min, max and seeds measured.
    `text`: one sentence, on live tau at `measured_setting` (else eval loss), the gap
    against the seed spread (`compare`), the base beside, and eval loss; or one line saying
    why there is nothing to compare. `selection`: the ranker's own tau on the candidates,
    the weak and the random pick (weak-selection.json), when the study directory holds it."""
    import pandas as pd

    out: dict[str, Any] = {"table": None, "metric": None, "comparison": None, "loss": None,
                           "decisive": None, "weak_better": None, "selection": None}
    plan = [a for a in results.study.get("arms") or [] if a.get("kind") == "weak"]
    if not plan:
        out["text"] = ("No weak-spots arms in this study's plan (its config has no `weak` "
                       "block): nothing to compare.")
        return out
    sel_file = results.study_dir / "weak-selection.json"
    if sel_file.is_file():
        try:
            out["selection"] = json.loads(sel_file.read_text()).get("tau")
        except (OSError, ValueError):
            results.notes.append(f"{sel_file} is not readable JSON; its tau left out.")
    cfg = results.study["config"]
    weak_cfg = cfg.get("weak") or {}
    pick = {a["name"]: a.get("selection") for a in plan}
    base_tokens = weak_cfg.get("base_tokens") or plan[0].get("unique_tokens")
    added = weak_cfg.get("n") or plan[0].get("added")
    seeds = sorted({int(a["seed"]) for a in plan})
    fin = final_values(results)
    metrics = [f"tau@{s}" for s in results.settings] + ["eval_full_acc_0", "eval_loss_mean"]
    groups = {p: fin[fin["run"].map(pick) == p] for p in ("weak", "random")}
    base = fin[(fin["kind"] == "data") & (fin["recipe"] == "eagle3lab")
               & (fin["weight_decay"] == cfg["weight_decays"][0])
               & (fin["planned_tokens"] == base_tokens) & fin["seed"].isin(seeds)]
    rows = [{"arm": "weak", **_seed_stats(groups["weak"], metrics)},
            {"arm": "random", **_seed_stats(groups["random"], metrics)},
            {"arm": f"base alone ({_short(float(base_tokens))})", **_seed_stats(base, metrics)}]
    out["table"] = pd.DataFrame(rows)
    title = (f"Weak spots vs random at equal compute ({_short(float(base_tokens))} unique "
             f"answer tokens + {added:,} conversations each)")
    planned = {p: sum(v == p for v in pick.values()) for p in ("weak", "random")}
    if not len(groups["weak"]) or not len(groups["random"]):
        out["text"] = (f"{title}: {len(groups['weak'])} of {planned['weak']} weak and "
                       f"{len(groups['random'])} of {planned['random']} random runs finished; "
                       f"nothing to compare yet.")
        return out
    w, r, b = rows
    primary = _primary(results, setting)
    c = compare(w, r, primary)
    if c is None:  # a pick not decoded live yet: the teacher-forced loss
        primary = "eval_loss_mean"
        c = compare(w, r, primary)
    if c is None:
        out["text"] = f"{title}: no finished run of both picks has {primary} yet."
        return out
    better = _better(primary) * c.gap > 0
    verb = "beat" if c.decisive else "came out ahead of"
    if c.decisive is False or c.gap == 0:
        head = "weak-spot and random prompts tie " + ("within seed noise" if c.gap
                                                      else "exactly")
    elif better:
        head = f"the weak-spot prompts {verb} random ones"
    else:
        head = f"random prompts {verb} the weak-spot ones"
    parts = [f"{_metric_name(primary)} weak {_fmt(primary, c.a)} vs random "
             f"{_fmt(primary, c.b)} ({c.uncertainty()})"]
    if b.get(primary) is not None:
        parts.append(f"the base alone {_fmt(primary, b[primary])} over seed(s) "
                     f"{', '.join(map(str, b['seeds']))} (weak {c.a - b[primary]:+.3g}, "
                     f"random {c.b - b[primary]:+.3g})")
    loss = compare(w, r, "eval_loss_mean") if primary != "eval_loss_mean" else None
    if loss is not None:
        parts.append(f"eval loss {_fmt('loss', loss.a)} vs {_fmt('loss', loss.b)} "
                     f"({loss.uncertainty()})")
    parts.append(f"unique answer tokens {_short(w['unique_tokens'])} vs "
                 f"{_short(r['unique_tokens'])}")
    out.update(text=f"{title}: {head}: {'; '.join(parts)}.", metric=_metric_name(primary),
               comparison=c, loss=loss, decisive=c.decisive, weak_better=bool(better),
               weak=c.a, random=c.b, gap=c.gap, seed_spread=c.spread, seeds=c.seeds)
    return out


# --- the planner ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TauFit:
    """Live tau against unique answer tokens.

    model "saturating": tau = c - a * (tokens / t0) ** -b (a >= 0, 0.02 <= b <= 3; c is the
    ceiling as tokens grow; t0 the points' geometric mean, for conditioning), fitted by
    least squares: for each b the best (c, a) is linear, b is searched on a log grid and
    refined. Used with 4 or more distinct data sizes (3 parameters and a degree of freedom).
    model "log-linear": tau = c + a * log10(tokens) (2 or 3 data sizes): no ceiling, so
    extrapolating it is optimistic; its sentences say so.

    `boot`: the same model refitted `n_boot` times to the fitted values plus residuals
    drawn with replacement (a residual bootstrap over the seeds and sizes measured; the
    residuals scaled by sqrt(n / (n - parameters)) so that a fit with few points is not
    judged by residuals it shrank): the ranges are the refits' 5th-95th percentiles, a
    90% range (on curves like the study's with seed noise, it held the truth in ~85% of
    draws; a pairs bootstrap in ~70%). No range when there are no more points than
    parameters."""

    model: str
    params: dict[str, float]
    points: list[tuple[float, float]]
    boot: list[dict[str, float]]
    rmse: float

    @property
    def ceiling(self) -> float | None:
        return self.params["c"] if self.model == "saturating" else None

    def ceiling_range(self) -> tuple[float, float] | None:
        if self.model != "saturating" or not self.boot:
            return None
        import numpy as np

        cs = np.array([p["c"] for p in self.boot])
        return float(np.quantile(cs, 0.05)), float(np.quantile(cs, 0.95))

    def predict(self, tokens):
        return _predict(self.model, self.params, tokens)

    def band(self, tokens, *, low: float = 0.05, high: float = 0.95):
        """The bootstrap fits' `low` and `high` quantiles of tau at each of `tokens`."""
        import numpy as np

        curves = np.array([_predict(self.model, p, tokens) for p in self.boot or [self.params]])
        return np.quantile(curves, low, axis=0), np.quantile(curves, high, axis=0)

    def describe(self, *, levels_word: str = "data sizes") -> str:
        """The fit in one sentence; `levels_word` names the x levels (the compute planner's
        are "training lengths")."""
        n, levels = len(self.points), len({t for t, _ in self.points})
        if self.model == "saturating":
            p, r = self.params, self.ceiling_range()
            rng = f" (90% range {r[0]:.3g}-{r[1]:.3g})" if r else ""
            return (f"tau = {p['c']:.3g} - {p['a']:.3g} x (tokens / {_short(p['t0'])})^-"
                    f"{p['b']:.3g}: ceiling {p['c']:.3g}{rng}; {n} points at {levels} "
                    f"{levels_word}, rmse {self.rmse:.3g}.")
        a = self.params["a"]
        return (f"tau = {self.params['c']:.3g} {'-' if a < 0 else '+'} {abs(a):.3g} x "
                f"log10(tokens) "
                f"(log-linear: {levels} {levels_word} are too few for a ceiling, so "
                f"extrapolation is optimistic); {n} points, rmse {self.rmse:.3g}.")


def _predict(model: str, p: dict[str, float], tokens):
    import numpy as np

    t = np.asarray(tokens, dtype=float)
    if model == "saturating":
        return p["c"] - p["a"] * (t / p["t0"]) ** -p["b"]
    return p["c"] + p["a"] * np.log10(t)


def _fit(model: str, xs, ys) -> dict[str, float]:
    import numpy as np

    if model == "log-linear":
        a, c = np.polyfit(np.log10(xs), ys, 1)
        return {"c": float(c), "a": float(a)}
    t0 = float(np.exp(np.mean(np.log(xs))))
    u = np.log(xs / t0)

    def solve(bs):
        """(sse, c, a) for each b: the least-squares line of tau on z = (tokens/t0)^-b,
        in closed form; a rising-then-falling fit (a < 0) is replaced by the flat one."""
        z = np.exp(-np.outer(np.atleast_1d(bs), u))
        zm = z.mean(axis=1, keepdims=True)
        var = ((z - zm) ** 2).sum(axis=1)
        cov = ((z - zm) * (ys - ys.mean())).sum(axis=1)
        a = np.where(var > 0, -cov / np.where(var > 0, var, 1.0), 0.0)
        a = np.maximum(a, 0.0)
        c = ys.mean() + a * zm[:, 0]
        sse = ((c[:, None] - a[:, None] * z - ys) ** 2).sum(axis=1)
        return sse, c, a

    grid = np.geomspace(0.02, 3.0, 200)
    k = int(np.argmin(solve(grid)[0]))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    for _ in range(40):  # golden section between the grid's neighbours
        m1, m2 = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
        s1, s2 = solve([m1, m2])[0]
        lo, hi = (lo, m2) if s1 <= s2 else (m1, hi)
    best = float(min((grid[k], (lo + hi) / 2), key=lambda b: solve(b)[0][0]))
    _, c, a = solve(best)
    return {"c": float(c[0]), "a": float(a[0]), "b": best, "t0": t0}


def fit_tau_curve(points: Sequence[Sequence[float]], *, n_boot: int = 400,
                  seed: int = 0) -> TauFit:
    """Fit live tau against unique answer tokens: `points` are (tokens, tau) or (tokens, tau,
    seed) from any run (another target's too). See TauFit for the models and the ranges."""
    import numpy as np

    pts = [(float(p[0]), float(p[1])) for p in points]
    if any(t <= 0 or not math.isfinite(t) or not math.isfinite(v) for t, v in pts):
        raise UserError("fit_tau_curve: every point needs tokens > 0 and a finite tau "
                        "(give (unique answer tokens, tau) pairs).")
    levels = len({t for t, _ in pts})
    if levels < 2:
        raise UserError(f"fit_tau_curve: {levels} data size(s) among the points; a curve "
                        f"of tau against tokens needs at least two.")
    model = "saturating" if levels >= 4 else "log-linear"
    n_params = 3 if model == "saturating" else 2
    xs, ys = np.array([t for t, _ in pts]), np.array([v for _, v in pts])
    params = _fit(model, xs, ys)
    fitted = _predict(model, params, xs)
    resid = ys - fitted
    rmse = float(np.sqrt(np.mean(resid ** 2)))
    boot = []
    if len(pts) > n_params:
        resid = resid * math.sqrt(len(pts) / (len(pts) - n_params))
        resid = resid - resid.mean()
        rng = np.random.default_rng(seed)
        boot = [_fit(model, xs, fitted + rng.choice(resid, len(resid), replace=True))
                for _ in range(n_boot)]
    return TauFit(model=model, params=params, points=pts, boot=boot, rmse=rmse)


def _tokens_at(model: str, p: dict[str, float], goal: float) -> float:
    """Tokens where the curve reaches `goal` (inf: never)."""
    if model == "saturating":
        if p["a"] <= 0 or p["c"] <= goal:
            return math.inf
        return p["t0"] * (p["a"] / (p["c"] - goal)) ** (1 / p["b"])
    if p["a"] <= 0:
        return math.inf
    return 10 ** ((goal - p["c"]) / p["a"])


@dataclasses.dataclass(frozen=True)
class TokensNeeded:
    """Unique answer tokens for a tau goal: `estimate` from the fit, `low` / `high` the
    bootstrap's 5th-95th percentiles (None: out of reach, `high` beyond reach in more than
    5% of the refits; both None without a bootstrap); `reachable` False when the fitted
    curve never gets there."""

    goal: float
    estimate: float | None
    low: float | None
    high: float | None
    reachable: bool
    largest_measured: float
    model: str
    ceiling: float | None
    ranged: bool = True  # False: no more points than parameters, so no range
    reach_share: float | None = None  # the share of bootstrap refits that reach the goal
    #: what the tokens are (the compute planner's: "tokens of training")
    unit: str = "unique answer tokens"
    #: what `largest_measured` was (the compute planner's: "the longest run measured")
    measured: str = "the largest arm measured"

    def as_tuple(self) -> tuple[float | None, float | None, float | None] | str:
        """(estimate, low, high), or "out of reach"."""
        return (self.estimate, self.low, self.high) if self.reachable else "out of reach"

    @property
    def text(self) -> str:
        if not self.reachable:
            why = (f"the fitted ceiling {self.ceiling:.3g} is below it" if self.ceiling
                   is not None else "tau does not rise with data in this fit")
            some = (f"; {self.reach_share:.0%} of the bootstrap refits reach it"
                    if self.reach_share else "")
            return f"tau {self.goal:g} is out of reach: {why}{some}."
        lo = _short(self.low) if self.low is not None else "?"
        hi = _short(self.high) if self.high is not None else "out of reach"
        rng = (f"90% range {lo}-{hi}" if self.ranged else
               "no range: no more points than the fit's parameters")
        far = self.estimate / self.largest_measured
        where = (f"{far:,.{1 if far < 10 else 0}f}x {self.measured}" if far > 1
                 else "within the sizes measured")
        caveat = "; log-linear fit: no ceiling, optimistic" if self.model == "log-linear" else ""
        return (f"tau {self.goal:g} needs ~{_short(self.estimate)} {self.unit} "
                f"({rng}; {where}{caveat}).")


def tokens_for(fit: TauFit, tau: float = 3.0, *, unit: str = "unique answer tokens",
               measured: str = "the largest arm measured") -> TokensNeeded:
    """The unique answer tokens (or whatever x `fit` has: `unit`, `measured` name it in the
    text) at which `fit` reaches tau, with the bootstrap's range; out of reach when the
    fitted ceiling is below the goal (or tau does not rise)."""
    import numpy as np

    est = float(_tokens_at(fit.model, fit.params, tau))
    low = high = math.nan
    share = None
    if fit.boot:
        ts = np.array([_tokens_at(fit.model, p, tau) for p in fit.boot])
        share = float(np.isfinite(ts).mean())
        low = float(np.quantile(ts, 0.05, method="nearest"))
        high = float(np.quantile(ts, 0.95, method="nearest"))
    return TokensNeeded(goal=tau, estimate=est if math.isfinite(est) else None,
                        low=low if math.isfinite(low) else None,
                        high=high if math.isfinite(high) else None,
                        reachable=math.isfinite(est),
                        largest_measured=max(t for t, _ in fit.points), model=fit.model,
                        ceiling=fit.ceiling, ranged=bool(fit.boot), reach_share=share,
                        unit=unit, measured=measured)


def planner_points(results: AtScaleResults, *, setting: str = MAIN_SETTING,
                   weight_decay: float | None = None,
                   recipe: str = "eagle3lab") -> list[tuple[float, float, int]]:
    """(unique answer tokens, live tau at `setting`, seed) of every finished final drafter of
    one recipe at the study's equal compute, greedy answers, one weight decay (default the
    study's first): our recipe's data arms, or another recipe's arms at its data sizes
    (config `recipe_tokens_by`)."""
    return _points(final_values(results), results, setting, weight_decay, recipe)


def _points(fin, results: AtScaleResults, setting: str, weight_decay: float | None,
            recipe: str = "eagle3lab") -> list[tuple[float, float, int]]:
    """`planner_points` from `final_values`' rows."""
    wd = weight_decay if weight_decay is not None else results.study["config"][
        "weight_decays"][0]
    col = f"tau@{setting}"
    if col not in fin:
        return []
    kind = "data" if recipe == "eagle3lab" else "recipe"
    f = fin[(fin["kind"] == kind) & (fin["recipe"] == recipe)
            & (fin["weight_decay"] == wd) & fin[col].notna()]
    return [(float(r["unique_tokens"]), float(r[col]), int(r["seed"])) for _, r in f.iterrows()]


def _recipe_words(recipe: str) -> str:
    return "our recipe" if recipe == "eagle3lab" else f"the {recipe} recipe"


def plan_budget(results: AtScaleResults, *, goals: Sequence[float] = (3.0, 3.5),
                setting: str = MAIN_SETTING, recipe: str = "eagle3lab") -> dict[str, Any]:
    """The planner on one recipe's final drafters (`planner_points`) at `measured_setting`:
    {"fit", "needs" (one TokensNeeded per goal), "setting", "recipe", "text", "numbers"
    (for the report; keys prefixed with the recipe's name unless it is ours)}; without two
    data sizes, fit None and the text says why."""
    setting = measured_setting(results, setting) or setting
    fin = final_values(results)
    pts = _points(fin, results, setting, None, recipe)
    who = _recipe_words(recipe)
    if len({p[0] for p in pts}) < 2:
        text = (f"Planner ({who}): {len({p[0] for p in pts})} finished data size(s) with "
                f"live tau at {setting}; it needs at least two.")
        return {"fit": None, "needs": [], "setting": setting, "recipe": recipe, "text": text,
                "numbers": {}}
    fit = fit_tau_curve(pts)
    needs = [tokens_for(fit, g) for g in goals]
    pre = "" if recipe == "eagle3lab" else f"{recipe}_"
    numbers: dict[str, Any] = {f"{pre}planner_setting": setting,
                               f"{pre}planner_model": fit.model,
                               f"{pre}planner_ceiling": fit.ceiling}
    for n in needs:
        key = f"{pre}tokens_for_tau_{n.goal:g}".replace(".", "_")
        numbers[key] = n.estimate if n.reachable else "out of reach"
        numbers[key + "_range"] = [n.low, n.high]
    head = "Planner" if recipe == "eagle3lab" else f"Planner, {who}"
    text = (f"{head} (live tau at {setting}): {fit.describe()} "
            + " ".join(n.text for n in needs)
            + f" Every point is {who} trained on {results.tokens_per_run:,} tokens: a "
              f"ceiling of this compute and recipe, not of the data."
            + _above_ceiling(fin, results, setting, fit.ceiling, recipe))
    return {"fit": fit, "needs": needs, "setting": setting, "recipe": recipe, "text": text,
            "numbers": numbers}


def planned_recipes(results: AtScaleResults) -> list[str]:
    """Recipes the planner fits: ours, then each recipe the config gives its own data sizes
    (`recipe_tokens_by`) with at least two of them."""
    by = results.study["config"].get("recipe_tokens_by") or {}
    return ["eagle3lab", *[r for r, sizes in by.items() if len(set(sizes)) >= 2]]


def _above_ceiling(fin, results: AtScaleResults, setting: str, ceiling: float | None,
                   recipe: str = "eagle3lab") -> str:
    """' Past that ceiling: ...' naming, among `final_values`' rows, the final drafters of
    other recipes, or of more compute, whose live tau at `setting` is above `recipe`'s
    fitted ceiling, best first, one per arm (its best seed, with how many it has) and at
    most four ('' when none is): what the ceiling is not a ceiling of. Without the one per
    arm, an arm's two seeds would take two of the four places."""
    col = f"tau@{setting}"
    if ceiling is None or col not in fin:
        return ""
    fin = fin.assign(_arm=fin["run"].map(arm_name))
    seeds = fin.loc[fin[col].notna(), "_arm"].value_counts()
    past = fin[((fin["recipe"] != recipe) | (fin["tokens"] > results.tokens_per_run))
               & (fin[col] > ceiling)].sort_values(col, ascending=False, kind="stable")
    past = past[~past["_arm"].duplicated()].head(4)
    parts = []
    for _, r in past.iterrows():
        n = int(seeds[r["_arm"]])
        parts.append(f"{r['run']} {r[col]:.2f} ({r['recipe']} recipe, "
                     f"{_short(float(r['unique_tokens']))} unique answer tokens, "
                     f"{_short(float(r['tokens']))} tokens of training"
                     + (f"; best of {n} seeds" if n > 1 else "") + ")")
    return f" Past that ceiling: {'; '.join(parts)}." if parts else ""


# --- the compute planner ("train longer?") -------------------------------------------------
def _schedules(results: AtScaleResults, recipe: str) -> tuple[str, dict[str, str]]:
    """(the recipe's own learning-rate schedule, {run: its schedule}): a long block's
    override, else its recipe's (config `recipes`), else ours (OUR_RECIPE)."""
    recipes = results.study["config"].get("recipes") or {}

    def of(r: str) -> str:
        return (recipes.get(r) or {}).get("schedule", OUR_RECIPE["schedule"])

    runs = {a["name"]: (a.get("overrides") or {}).get("schedule") or of(
        a.get("recipe", "eagle3lab")) for a in results.study.get("arms") or []}
    return of(recipe), runs


def _compute_rows(fin, results: AtScaleResults, setting: str, recipe: str,
                  weight_decay: float | None):
    """`final_values`' rows of `recipe`'s finished final drafters with live tau at `setting`,
    at equal compute and long, at one weight decay (default the study's first), on the
    recipe's own schedule, with their planned tokens of training (`training`, the study's
    `tokens_per_run` or the long block's); and the runs left out for another schedule."""
    wd = weight_decay if weight_decay is not None else results.study["config"][
        "weight_decays"][0]
    col = f"tau@{setting}"
    if col not in fin:
        return fin.iloc[0:0].assign(training=[]), wd, []
    base = "data" if recipe == "eagle3lab" else "recipe"
    f = fin[fin["kind"].isin([base, "long"]) & (fin["recipe"] == recipe)
            & (fin["weight_decay"] == wd) & fin[col].notna()]
    own, sched = _schedules(results, recipe)
    other = sorted(r for r in f["run"] if sched.get(r, own) != own)
    f = f[~f["run"].isin(other)]
    planned = {a["name"]: a.get("tokens_per_run") or results.tokens_per_run
               for a in results.study.get("arms") or []}
    return f.assign(training=[float(planned.get(r, results.tokens_per_run))
                              for r in f["run"]]), wd, other


def compute_recipes(results: AtScaleResults, *, setting: str = MAIN_SETTING) -> list[str]:
    """Recipes `plan_compute` can fit: those with finished final drafters at two or more
    training lengths at one data size (the study's first weight decay); ours first."""
    setting = measured_setting(results, setting) or setting
    fin = final_values(results)
    out = []
    for recipe in sorted(set(fin["recipe"]), key=lambda r: (r != "eagle3lab", r)):
        rows, _, _ = _compute_rows(fin, results, setting, recipe, None)
        if len(rows) and rows.groupby("unique_tokens")["training"].nunique().max() >= 2:
            out.append(recipe)
    return out


def three_point_ceiling(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float] | None:
    """The ceiling implied by three (x, tau) levels whose gains shrink: the saturating curve
    tau = c - a x^-b through the three points. For equal ratios of x (16M, 32M, 64M) the
    increments d1, d2 decay geometrically by r = d2 / d1 per step and the gains left sum to
    d2 r / (1 - r); for unequal ratios b solves (x2^-b - x3^-b) / (x1^-b - x2^-b) = r.
    {"ceiling", "ratio" (r), "remaining", "b"}; None when a gain is not positive or the
    gain per log-x does not shrink (no ceiling implied). Three points, no range: an
    extrapolation."""
    (x1, x2, x3), (y1, y2, y3) = sorted(xs), [y for _, y in sorted(zip(xs, ys))]
    d1, d2 = y2 - y1, y3 - y2
    if not (x1 < x2 < x3) or d1 <= 0 or d2 <= 0:
        return None
    r = d2 / d1
    u2, u3 = x2 / x1, x3 / x1
    if r >= math.log(x3 / x2) / math.log(x2 / x1) * (1 - 1e-9):  # g's limit as b -> 0
        return None

    def g(b: float) -> float:  # decreasing in b, from log(x3/x2)/log(x2/x1) to 0
        return (u2 ** -b - u3 ** -b) / (1 - u2 ** -b)

    lo, hi = 0.0, 1.0
    while g(hi) > r:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if g(mid) > r else (lo, mid)
    b = (lo + hi) / 2
    remaining = d2 * u3 ** -b / (u2 ** -b - u3 ** -b)
    return {"ceiling": y3 + remaining, "ratio": r, "remaining": remaining, "b": b}


def _increments(xs: list[float], ys: list[float]) -> str:
    """'+0.145 from 16M to 32M, +0.102 from 32M to 64M: each doubling adds less' (the gains
    per doubling where the steps are not doublings)."""
    steps = list(zip(xs, xs[1:], ys, ys[1:]))
    parts = ", ".join(f"{y1 - y0:+.3f} from {_short(x0)} to {_short(x1)}"
                      for x0, x1, y0, y1 in steps)
    per = [(y1 - y0) / math.log2(x1 / x0) for x0, x1, y0, y1 in steps]
    doublings = all(abs(math.log2(x1 / x0) - 1) < 0.01 for x0, x1, _, _ in steps)
    if not doublings:
        parts += " (per doubling: " + ", ".join(f"{p:+.3f}" for p in per) + ")"
    if len(per) < 2:
        return parts + ": one step, no bend to see"
    if all(b < a for a, b in zip(per, per[1:])):
        return parts + ": each doubling adds less"
    if all(b >= a for a, b in zip(per, per[1:])):
        return parts + ": no doubling adds less than the one before"
    return parts + ": the gains per doubling do not shrink steadily"


def plan_compute(results: AtScaleResults, *, recipe: str = "speculators",
                 goals: Sequence[float] = (3.0, 3.5), setting: str = MAIN_SETTING,
                 unique_tokens: float | None = None,
                 weight_decay: float | None = None) -> dict[str, Any]:
    """The compute planner, "train longer?": live tau at `setting` against TOKENS OF TRAINING
    for one recipe at one data size. Prevents reading the data planner's (`plan_budget`)
    ceiling as the answer to "train longer?": that ceiling is of the study's equal compute
    (16M tokens of training per run), and runs trained longer on the same data go past it.

    Points: (tokens of training, tau, seed) of `recipe`'s finished final drafters, at equal
    compute (kind "data" for ours, "recipe" for another) and long runs (kind "long": their
    planned `tokens_per_run`), on the recipe's own schedule (a long run on another is left
    out and named), at one weight decay (default the study's first) and one data size
    (`unique_tokens`, default the largest with two or more training lengths). Fitted with
    `fit_tau_curve` (log-linear below four lengths: optimistic), so the text also gives the
    measured gains between successive lengths, and with exactly three lengths the ceiling
    their geometric decay implies (`three_point_ceiling`: an extrapolation, no range).

    Returns plan_budget's shape: {"fit", "needs" (TokensNeeded in tokens of training),
    "setting", "recipe", "text", "numbers" (keys prefixed compute_RECIPE_)}; fewer than two
    training lengths: fit None and the text says why."""
    setting = measured_setting(results, setting) or setting
    fin = final_values(results)
    rows, wd, other = _compute_rows(fin, results, setting, recipe, weight_decay)
    who = _recipe_words(recipe)
    lengths = rows.groupby("unique_tokens")["training"].nunique() if len(rows) else None
    if unique_tokens is None and lengths is not None:
        several = lengths[lengths >= 2]
        unique_tokens = float((several if len(several) else lengths).index.max())
    if unique_tokens is not None:
        rows = rows[rows["unique_tokens"] == unique_tokens]
    n = rows["training"].nunique()
    if n < 2:
        at = (f"{_short(float(unique_tokens))} unique answer tokens" if unique_tokens
              is not None else "any data size")
        return {"fit": None, "needs": [], "setting": setting, "recipe": recipe,
                "numbers": {},
                "text": f"Compute planner ({who}): {n} finished training length(s) with live "
                        f"tau at {setting} at {at}, weight decay {wd:g}; it needs at least "
                        f"two."}
    col = f"tau@{setting}"
    pts = [(float(r["training"]), float(r[col]), int(r["seed"])) for _, r in rows.iterrows()]
    fit = fit_tau_curve(pts)
    unit, measured = "tokens of training", "the longest run measured"
    needs = [tokens_for(fit, g, unit=unit, measured=measured) for g in goals]
    level = rows.assign(_tau=rows[col].astype(float)).groupby("training")["_tau"].mean(
        ).sort_index()
    xs, ys = [float(x) for x in level.index], [float(y) for y in level]
    three = three_point_ceiling(xs, ys) if len(xs) == 3 else None
    own = _schedules(results, recipe)[0]
    head = (f"Compute planner, {who} (live tau at {setting} against tokens of training; "
            f"{_short(float(unique_tokens))} unique answer tokens, weight decay {wd:g}, "
            f"{own} schedule): tau "
            + ", ".join(f"{y:.3f} at {_short(x)}" for x, y in zip(xs, ys))
            + f" tokens of training (mean over seeds): {_increments(xs, ys)}.")
    if len(xs) != 3:
        tail = ""
    elif three is None:
        tail = " The three lengths' gains do not shrink: no ceiling implied by them."
    else:
        below = [g for g in goals if three["ceiling"] < g]
        tail = (f" The three points' gains decay geometrically (r = {three['ratio']:.3f}"
                + ("" if abs(math.log2(xs[1] / xs[0]) - math.log2(xs[2] / xs[1])) < 0.01
                   else f"; the saturating curve through them, x^-{three['b']:.3g}")
                + f"), so the gains left sum to ~{three['remaining']:.3f}: a ceiling of "
                  f"~{three['ceiling']:.3g} (an extrapolation from three points, no range)"
                + (f", below tau {' and '.join(f'{g:g}' for g in below)}" if below else "")
                + ".")
    text = (f"{head} {fit.describe(levels_word='training lengths')} "
            + " ".join(n.text for n in needs) + tail
            + f" Every point is {who} on the same {_short(float(unique_tokens))} unique answer "
              f"tokens: a curve of training length at this data size, not of data (the data "
              f"planner's ceiling is one of {results.tokens_per_run:,} tokens of training)."
            + (f" Left out, on another schedule: {', '.join(other)}." if other else ""))
    pre = f"compute_{recipe}_"
    numbers: dict[str, Any] = {
        f"{pre}setting": setting, f"{pre}model": fit.model,
        f"{pre}unique_tokens": float(unique_tokens), f"{pre}weight_decay": wd,
        f"{pre}training_tokens": xs, f"{pre}tau": ys,
        f"{pre}increments": [b - a for a, b in zip(ys, ys[1:])],
        f"{pre}ceiling_3pt": three["ceiling"] if three else None,
        f"{pre}ceiling": fit.ceiling,
        f"{pre}ceiling_range": list(r) if (r := fit.ceiling_range()) else None}
    for nd in needs:
        key = f"{pre}tokens_for_tau_{nd.goal:g}".replace(".", "_")
        numbers[key] = nd.estimate if nd.reachable else "out of reach"
        numbers[key + "_range"] = [nd.low, nd.high]
    return {"fit": fit, "needs": needs, "setting": setting, "recipe": recipe, "text": text,
            "numbers": numbers}


def data_by_training(results: AtScaleResults, *, recipe: str = "speculators",
                     setting: str = MAIN_SETTING,
                     weight_decay: float | None = None) -> dict[str, Any]:
    """"Does data matter more when training is longer?": the gain of the largest data size
    over the smallest at each training length where both were trained. Prevents reading the
    data effect measured at the study's equal compute (16M tokens of training: small) as the
    data effect at the lengths a drafter is actually trained to.

    Only data sizes measured at two or more training lengths take part (the same pair at
    each length); cells are means over seeds, with the seed count, and the text names the
    largest seed spread (max - min) of any cell, or says every cell has one seed.

    Returns {"rows": [{training, more, less, tau_more, tau_less, gain, seeds_more,
    seeds_less}], "setting", "recipe", "text", "numbers" (keys prefixed datagain_RECIPE_)};
    every gain within the largest seed spread: the text says there is no data gain beyond it;
    fewer than two such lengths: no rows, and the text says why."""
    setting = measured_setting(results, setting) or setting
    fin = final_values(results)
    rows, wd, _ = _compute_rows(fin, results, setting, recipe, weight_decay)
    who = _recipe_words(recipe)
    col = f"tau@{setting}"
    out: list[dict[str, Any]] = []
    spread = None
    if len(rows):
        lengths = rows.groupby("unique_tokens")["training"].nunique()
        sizes = sorted(float(u) for u in lengths[lengths >= 2].index)
        if len(sizes) >= 2:
            less, more = sizes[0], sizes[-1]
            cells = rows[rows["unique_tokens"].isin([less, more])].assign(
                _tau=lambda f: f[col].astype(float)).groupby(["training", "unique_tokens"])[
                "_tau"].agg(["mean", "count", "min", "max"])
            multi = cells[cells["count"] >= 2]
            spread = float((multi["max"] - multi["min"]).max()) if len(multi) else None
            for t in sorted({float(t) for t, _ in cells.index}):
                if (t, more) in cells.index and (t, less) in cells.index:
                    a, b = cells.loc[(t, more)], cells.loc[(t, less)]
                    out.append({"training": t, "more": more, "less": less,
                                "tau_more": float(a["mean"]), "tau_less": float(b["mean"]),
                                "gain": float(a["mean"] - b["mean"]),
                                "seeds_more": int(a["count"]), "seeds_less": int(b["count"])})
    if len(out) < 2:
        return {"rows": out, "setting": setting, "recipe": recipe, "numbers": {},
                "text": f"Data at each training length ({who}): {len(out)} training "
                        f"length(s) with two data sizes measured at both, live tau at "
                        f"{setting}, weight decay {wd:g}; it needs at least two."}
    more, less = out[0]["more"], out[0]["less"]
    cells_text = "; ".join(
        f"at {_short(r['training'])} tokens of training {r['tau_more']:.3f} vs "
        f"{r['tau_less']:.3f} ({r['gain']:+.3f}; seeds {r['seeds_more']} / {r['seeds_less']})"
        for r in out)
    first, last = out[0]["gain"], out[-1]["gain"]
    if spread is not None and all(abs(r["gain"]) <= spread for r in out):
        trend = "No data gain beyond the seed spread at any training length"
    elif first > 0 and last > first:
        trend = (f"The data gain grows with training: x{last / first:.1f} from "
                 f"{_short(out[0]['training'])} to {_short(out[-1]['training'])}")
    elif last < first:
        trend = "The data gain shrinks with training"
    else:
        trend = "The data gain does not grow with training"
    noise = (f"the largest seed spread of any cell: {spread:.3f}" if spread is not None
             else "every cell has one seed: spread unknown")
    text = (f"Data at each training length, {who} (live tau at {setting}, weight decay "
            f"{wd:g}), {_short(more)} vs {_short(less)} unique answer tokens: {cells_text}. "
            f"{trend} ({noise}).")
    pre = f"datagain_{recipe}_"
    numbers = {f"{pre}setting": setting, f"{pre}more": more, f"{pre}less": less,
               f"{pre}training_tokens": [r["training"] for r in out],
               f"{pre}gain": [r["gain"] for r in out], f"{pre}seed_spread": spread}
    return {"rows": out, "setting": setting, "recipe": recipe, "text": text,
            "numbers": numbers}


def summary_numbers(results: AtScaleResults, *, setting: str = MAIN_SETTING,
                    goals: Sequence[float] = (3.0, 3.5)) -> dict[str, Any]:
    """The at-scale section's key numbers for the batch report (record_summary)."""
    v = verdict(results, setting=setting)
    plans = [plan_budget(results, setting=setting, goals=goals, recipe=r)
             for r in planned_recipes(results)]
    fitted = compute_recipes(results, setting=setting)
    plans += [plan_compute(results, setting=setting, goals=goals, recipe=r) for r in fitted]
    plans += [d for r in fitted
              if (d := data_by_training(results, setting=setting, recipe=r))["rows"]]
    counts = results.arms["status"].value_counts()
    return {"atscale_runs_done": int(counts.get("done", 0)),
            "atscale_runs_planned": len(results.arms),
            "atscale_verdict": v["text"], "atscale_decisive": v.get("decisive"),
            "atscale_late_drops": v.get("late_drops"),
            "atscale_late_drop_tau_gain_max": v.get("late_drop_tau_gain_max"),
            "atscale_reference_tau": against_reference(results, setting=setting)[
                "reference_tau"],
            **{f"atscale_{k}": val for plan in plans for k, val in plan["numbers"].items()}}
