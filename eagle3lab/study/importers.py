"""Importers for the training logs other trainers write, as eagle3lab's metrics DataFrame.

Prevents comparing numbers that are not the same quantity across trainers: speculators'
decay-weighted per-position losses are un-weighted, each trainer's tag names are mapped to
one column set, and every imported frame says in `df.attrs["loss_kind"]` what its loss is
(speculators: KL; SpecForge `ploss`: soft cross-entropy = KL + target entropy, so loss
LEVELS are only comparable within one trainer; accuracies compare across trainers). The
columns are those of `eagle3lab.train.counts.read_metrics` (see its module docstring).

Log sources read by `load_metrics`:
- eagle3lab run dirs (metrics.jsonl, read by eagle3lab.train.counts);
- TensorBoard event files (events.out.tfevents.*), read with tensorboard's own event
  reader, from `speculators train --logger tensorboard` (tags train/loss_i,
  train/full_acc_i, train/cond_acc_i, train/loss, val/*_epoch, lr, epoch, profile/*) or
  SpecForge `--report-to tensorboard` (OUTPUT/runs: train/ploss_i, train/acc_i, train/lr,
  and per release eval/ploss_i + eval/acc_i, eval/epoch_ploss_i + eval/epoch_acc_i, or
  eval/ploss_i + eval/per_position_acc/i + eval/simulated_acc_len);
- MLflow run dirs (metrics/<tag> files, both trainers' `mlflow` logger);
- trackio project databases (`speculators train --logger trackio`: TRACKIO_DIR/PROJECT.db,
  default ~/.cache/huggingface/trackio/speculators.db), read with the standard library's
  sqlite3, read-only;
- JSONL files of {"step": ..., tag: value} (e.g. a wandb history export).

SpecForge's `eval/simulated_acc_len` (specforge/eval/evaluator.py `_simulated_acc_len`,
SpecForge 0.2.0 at a6b6b02) is a0 + a0*a1 + ... over its per-position accuracies: the
accepted DRAFT tokens, without the bonus token that our `sim_accept_len` counts, so it is
imported as `eval_sim_accept_len` = 1 + value. Where the evaluator had no per-position
counts it logs its average accuracy under that tag instead (not a length): such rows (no
`eval/per_position_acc/i` at the step) are left out.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from eagle3lab.errors import UserError
from eagle3lab.train.counts import finish_frame, read_metrics

#: tag regex -> column template, per trainer (read from their logging code).
TAG_MAPS: dict[str, list[tuple[str, str]]] = {
    "speculators": [  # speculators/train/trainer.py + logger.py (dicts flattened with "/")
        (r"train/loss_(\d+)", "train_loss_{0}"), (r"train/full_acc_(\d+)", "train_full_acc_{0}"),
        (r"train/cond_acc_(\d+)", "train_cond_acc_{0}"), (r"train/loss", "train_objective"),
        (r"val/loss_(\d+)_epoch", "eval_loss_{0}"),
        (r"val/full_acc_(\d+)_epoch", "eval_full_acc_{0}"),
        (r"val/cond_acc_(\d+)_epoch", "eval_cond_acc_{0}"), (r"val/loss_epoch", "eval_objective"),
        (r"lr(?:/AdamW)?", "lr"), (r"epoch", "epoch"),
        (r"profile/tokens_per_s", "_tok_s"), (r"profile/step_ms", "_step_ms")],
    "specforge": [  # SpecForge scripts/train_eagle3*.py, specforge/training/ + tracker.py
        (r"train/ploss_(\d+)", "train_loss_{0}"), (r"train/acc_(\d+)", "train_full_acc_{0}"),
        (r"train/loss", "train_objective"),
        (r"eval/(?:epoch_?)?ploss_(\d+)", "eval_loss_{0}"),
        (r"eval/(?:epoch_?)?acc_(\d+)", "eval_full_acc_{0}"),
        (r"eval/per_position_acc/(\d+)", "eval_full_acc_{0}"), (r"train/lr", "lr"),
        (r"train/epoch", "epoch"), (r"eval/simulated_acc_len", "_sf_sim_len")],
}


def detect_trainer(tags) -> str:
    tags = set(tags)
    if any(re.fullmatch(r"train/ploss_\d+", t) for t in tags):
        return "specforge"
    if any(re.fullmatch(r"(train/loss|val/loss)_\d+(_epoch)?", t) for t in tags):
        return "speculators"
    raise UserError(f"Cannot tell which trainer wrote these metrics (tags: "
                    f"{sorted(tags)[:8]}...); expected speculators' train/loss_i or "
                    f"SpecForge's train/ploss_i.")


def frame_from_scalars(records, *, trainer: str | None = None, decay: float = 1.0,
                       tokens_per_step: float | None = None):
    """(step, tag, value) records -> the common DataFrame. decay: the run's TTT loss
    decay (speculators logs loss_i * decay**i; this undoes it). tokens_per_step: tokens
    per optimizer step (all GPUs) when the log has no token counts."""
    import pandas as pd

    records = list(records)
    trainer = trainer or detect_trainer(t for _, t, _ in records)
    table = [(re.compile(p), c) for p, c in TAG_MAPS[trainer]]
    rows: dict[int, dict[str, Any]] = {}
    for step, tag, value in records:
        for rx, col in table:
            m = rx.fullmatch(tag)
            if m:
                rows.setdefault(int(step), {"step": int(step)})[col.format(*m.groups())] = value
                break
    df = pd.DataFrame(sorted(rows.values(), key=lambda r: r["step"]))
    if trainer == "speculators" and decay != 1.0:
        for c in df.columns:
            if m := re.fullmatch(r"(?:train|eval)_loss_(\d+)", c):
                df[c] = df[c] / decay ** int(m.group(1))
    if "_sf_sim_len" in df.columns:  # SpecForge: draft tokens only; ours counts the bonus
        has_pp = (df["eval_full_acc_0"].notna() if "eval_full_acc_0" in df.columns
                  else pd.Series(False, index=df.index))
        df["eval_sim_accept_len"] = (1.0 + df["_sf_sim_len"]).where(has_pp)
    if {"_tok_s", "_step_ms"} <= set(df.columns):  # speculators' profile: tokens per step
        per = (df["_tok_s"] * df["_step_ms"] / 1000).ffill()
        df["tokens"] = (per * df["step"].diff().fillna(df["step"] + 1)).cumsum()
    elif tokens_per_step:
        df["tokens"] = (df["step"] + 1) * tokens_per_step
    df = df.drop(columns=[c for c in df.columns if c.startswith("_")])
    return finish_frame(df, source=trainer,
                        loss_kind="soft_ce" if trainer == "specforge" else "kl")


def read_tfevents(path: str | os.PathLike) -> list[tuple[int, str, float]]:
    """Scalars (step, tag, value) from TensorBoard event files: a file, or a directory
    searched recursively (files in name order, i.e. in the order they were started).

    Read with tensorboard's own EventAccumulator, every value kept (no reservoir sampling,
    no purge of steps a restarted run logged again): both `add_scalar` encodings count,
    simple_value and the scalars plugin's tensor (TF2, `new_style=True`). A torn last
    record (a run killed mid-write) is skipped."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    p = Path(path)
    files = sorted(p.rglob("events.out.tfevents.*")) if p.is_dir() else [p]
    if not files:
        raise UserError(f"No TensorBoard event files (events.out.tfevents.*) under {p}.")
    out = []
    for f in files:
        acc = ea.EventAccumulator(str(f), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0},
                                  purge_orphaned_data=False)
        acc.Reload()
        tags = acc.Tags()
        for tag in tags[ea.SCALARS]:
            out.extend((int(e.step), tag, float(e.value)) for e in acc.Scalars(tag))
        for tag in tags[ea.TENSORS]:
            meta = acc.summary_metadata.get(tag)
            if meta is None or meta.plugin_data.plugin_name != "scalars":
                continue  # text, hparams, histograms: not curves
            out.extend((int(e.step), tag,
                        float(tensor_util.make_ndarray(e.tensor_proto).item()))
                       for e in acc.Tensors(tag))
    if not out:
        raise UserError(f"No scalars in the TensorBoard event files under {p} "
                        f"({len(files)} file(s)); was the run logged with add_scalar?")
    return out


def read_mlflow(run_dir: str | os.PathLike) -> list[tuple[int, str, float]]:
    """Scalars of an MLflow run dir (metrics/<tag> files: 'timestamp value step' lines)."""
    root = Path(run_dir) / "metrics"
    out = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        tag = f.relative_to(root).as_posix()
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                out.append((int(parts[2]), tag, float(parts[1])))
    return out


def read_trackio(db: str | os.PathLike, *, run: str | None = None
                 ) -> list[tuple[int, str, float]]:
    """Scalars of one run in a trackio project database (TRACKIO_DIR/PROJECT.db).

    trackio writes one row per `log` call into its `metrics` table (run_name, step, and the
    logged dict as JSON, with inf/NaN spelled "Infinity"/"NaN"; trackio/sqlite_storage.py
    `SQLiteStorage.log` and utils.serialize_values, trackio 0.36 at 2a02752); speculators'
    TrackioHandler logs the same flattened dicts as its TensorBoard handler. The file is
    opened read-only. `run`: the run_name (needed when the project holds several runs)."""
    import sqlite3

    p = Path(db)
    try:
        con = sqlite3.connect(f"file:{p.resolve()}?mode=ro", uri=True)
        try:
            names = [r[0] for r in con.execute(
                "SELECT DISTINCT run_name FROM metrics ORDER BY run_name")]
            if run is None and len(names) > 1:
                raise UserError(f"{p} holds {len(names)} trackio runs ({', '.join(names[:8])}); "
                                f"name one (run=...).")
            run = run if run is not None else (names[0] if names else None)
            if run not in names:
                raise UserError(f"{p} has no trackio run {run!r}; its runs: {names}.")
            rows = con.execute("SELECT step, metrics FROM metrics WHERE run_name = ? "
                               "ORDER BY id", (run,)).fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise UserError(f"{p} is not a trackio project database ({e}); trackio keeps one "
                        f"PROJECT.db per project under TRACKIO_DIR.") from None
    special = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
    out = []
    for step, text in rows:
        try:
            rec = json.loads(text)
        except json.JSONDecodeError:
            continue
        for k, v in rec.items():
            v = special.get(v, v) if isinstance(v, str) else v
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((int(step), k, float(v)))
    return out


def read_tag_jsonl(path: str | os.PathLike) -> list[tuple[int, str, float]]:
    """Scalars from JSONL lines {"step"|"_step"|"global_step": n, tag: value, ...}."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = next((rec[k] for k in ("step", "_step", "global_step") if k in rec), None)
        if step is None:
            continue
        for k, v in rec.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append((int(step), k, float(v)))
    return out


def load_metrics(source: str | os.PathLike, *, name: str | None = None,
                 trainer: str | None = None, decay: float = 1.0,
                 tokens_per_step: float | None = None, run: str | None = None):
    """Any supported log (see module docstring) as the common DataFrame, with
    attrs run/source/loss_kind. The format is detected from what `source` contains.
    `run`: the run inside a trackio database (its run_name)."""
    p = Path(source)
    if not p.exists():
        raise UserError(f"Metrics source {str(p)!r} does not exist.")
    kw = {"trainer": trainer, "decay": decay, "tokens_per_step": tokens_per_step}
    if (p / "metrics.jsonl").exists() or (p.suffix == ".jsonl" and _is_eagle3lab(p)):
        df = read_metrics(p)
    elif p.is_dir() and (p / "metrics").is_dir():
        df = frame_from_scalars(read_mlflow(p), **kw)
    elif p.name.startswith("events.out.tfevents") or (
            p.is_dir() and next(p.rglob("events.out.tfevents.*"), None)):
        df = frame_from_scalars(read_tfevents(p), **kw)
    elif p.suffix == ".jsonl":
        df = frame_from_scalars(read_tag_jsonl(p), **kw)
    elif p.suffix == ".db" and p.is_file():
        df = frame_from_scalars(read_trackio(p, run=run), **kw)
        name = name or run
    else:
        raise UserError(f"{p} holds no metrics this reader knows: an eagle3lab run dir "
                        f"(metrics.jsonl), TensorBoard event files, an MLflow run dir "
                        f"(metrics/), a trackio PROJECT.db, or a JSONL of {{step, tag: value}} lines.")
    df.attrs["run"] = name or (p.name if p.is_dir() else p.parent.name if (
        p.name == "metrics.jsonl" or p.name.startswith("events.out")) else p.stem)
    return df


def _is_eagle3lab(p: Path) -> bool:
    with open(p) as f:
        first = f.readline()
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        return False
    return "step" in rec and ("train" in rec or "eval" in rec)


def combine(frames) -> Any:
    """Long DataFrame of several runs (column `run`, `source`, `loss_kind` per row)."""
    import pandas as pd

    parts = []
    for df in frames:
        d = df.copy()
        d["run"], d["source"], d["loss_kind"] = (df.attrs.get("run"), df.attrs.get("source"),
                                                 df.attrs.get("loss_kind"))
        parts.append(d)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
