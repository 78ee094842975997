"""Training metrics: per-position counts, the run's metrics.jsonl, and importers for the
logs other trainers write, all as one pandas DataFrame shape.

Prevents comparing numbers that are not the same quantity: counts are kept raw (sums and
totals; ratios are taken last), speculators' decay-weighted per-position losses are
un-weighted, and every imported frame says in `df.attrs["loss_kind"]` what its loss is
(speculators: KL; SpecForge `ploss`: soft cross-entropy = KL + target entropy, so loss
LEVELS are only comparable within one trainer; accuracies compare across trainers).

Columns (one row per logged step): step, epoch, tokens, wall_s, lr, and for split in
{train, eval}: {split}_loss_{i}, {split}_full_acc_{i}, {split}_cond_acc_{i},
{split}_objective, {split}_loss_mean, {split}_sim_accept_len. full_acc_i is cumulative
(positions 0..i all correct, speculators' definition), so 1 + sum_i full_acc_i is the
teacher-forced chain accept length estimate (including the bonus token).
Log sources read by `load_metrics`:
- eagle3lab run dirs (metrics.jsonl);
- TensorBoard event files (events.out.tfevents.*) from `speculators train --logger
  tensorboard` (tags train/loss_i, train/full_acc_i, train/cond_acc_i, val/*_epoch, lr)
  or SpecForge `--report-to tensorboard` (OUTPUT/runs: train/ploss_i, train/acc_i,
  train/lr, eval/epochploss_i, eval/epochacc_i); parsed without tensorboard installed;
- MLflow run dirs (metrics/<tag> files, both trainers' `mlflow` logger);
- JSONL files of {"step": ..., tag: value} (e.g. a wandb history export).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any

from eagle3lab.errors import UserError

# --------------------------------------------------------------------------------------
# Counts from speculators' forward (raw sums kept; ratios taken last)
# --------------------------------------------------------------------------------------
METRIC_DEFINITIONS = {
    "loss[i]": "KL(target || drafter) at TTT position i over loss-masked tokens, token-"
               "weighted, decay NOT applied (speculators' loss_i divided by decay**i)",
    "full_acc[i]": "speculators full_acc_i: positions 0..i all match the target argmax "
                   "(cumulative), over the loss-masked tokens of position i",
    "cond_acc[i]": "speculators cond_acc_i: position i correct given 0..i-1 correct",
    "objective": "sum_i decay**i * loss[i], what the optimizer minimises",
    "sim_accept_len": "1 + sum_i full_acc[i]: teacher-forced chain accept length estimate, "
                      "bonus token included (an offline proxy, not measured decoding)",
    "tokens": "positions processed (non-padding, after the input shift), cumulative",
    "wall_s": "training wall time in seconds, cumulative across resumes",
}


def step_counts(metrics: dict, loss_mask, ttt_steps: int, decay: float) -> dict[str, float]:
    """Raw counts for one batch. speculators reports each position's loss already
    multiplied by decay**i and averaged over the batch's loss tokens; we undo the decay
    and weight by the token count, so losses can be summed over batches."""
    out: dict[str, float] = {}
    for i in range(ttt_steps):
        n = float(loss_mask[:, i:].sum())
        w = decay ** i
        out[f"loss_{i}_sum"] = float(metrics[f"loss_{i}_sum"]) / w * n if w else 0.0
        out[f"loss_{i}_n"] = n
        for kind in ("full_acc", "cond_acc"):
            out[f"{kind}_{i}_sum"] = float(metrics[f"{kind}_{i}_sum"])
            out[f"{kind}_{i}_total"] = float(metrics[f"{kind}_{i}_total"])
    return out


def summarize_counts(counts: dict[str, float], ttt_steps: int, decay: float) -> dict:
    """Ratios from raw counts; the counts travel along in the metrics line."""
    def ratio(a, b):
        return a / b if b else None

    loss = [ratio(counts[f"loss_{i}_sum"], counts[f"loss_{i}_n"]) for i in range(ttt_steps)]
    return {
        "loss": loss,
        "full_acc": [ratio(counts[f"full_acc_{i}_sum"], counts[f"full_acc_{i}_total"])
                     for i in range(ttt_steps)],
        "cond_acc": [ratio(counts[f"cond_acc_{i}_sum"], counts[f"cond_acc_{i}_total"])
                     for i in range(ttt_steps)],
        "objective": sum(decay ** i * v for i, v in enumerate(loss) if v is not None),
        "counts": counts,
    }


# --------------------------------------------------------------------------------------
# eagle3lab metrics.jsonl
# --------------------------------------------------------------------------------------
def read_metrics(run: str | os.PathLike):
    """An eagle3lab run (dir or metrics.jsonl) as a DataFrame (see module docstring).
    A torn last line (a run killed mid-write) is skipped."""
    path = Path(run)
    path = path / "metrics.jsonl" if path.is_dir() else path
    if not path.exists():
        raise UserError(f"{path} does not exist: not an eagle3lab training run.")
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    df = frame_from_lines(records)
    df.attrs["run"] = path.parent.name
    return df


def frame_from_lines(records: list[dict]):
    """metrics.jsonl lines (dicts) as read_metrics' DataFrame: one row per line, the train
    and eval dicts flattened to {split}_{kind}_{i} columns, derived columns added."""
    import pandas as pd

    rows = []
    for rec in records:
        row = {k: rec.get(k) for k in ("step", "epoch", "tokens", "loss_tokens", "wall_s", "lr")}
        for split in ("train", "eval"):
            m = rec.get(split) or {}
            for kind in ("loss", "full_acc", "cond_acc"):
                for i, v in enumerate(m.get(kind) or []):
                    row[f"{split}_{kind}_{i}"] = v
            for k in ("objective", "grad_norm"):
                if m.get(k) is not None:
                    row[f"{split}_{k}"] = m[k]
        rows.append(row)
    return _finish(pd.DataFrame(rows), source="eagle3lab", loss_kind="kl")


def _finish(df, *, source: str, loss_kind: str):
    """Sort, add derived columns (loss_mean, sim_accept_len), record provenance."""
    import pandas as pd

    df = df.sort_values("step", kind="stable").reset_index(drop=True) if len(df) else df
    for split in ("train", "eval"):
        loss_cols = sorted((c for c in df.columns if re.fullmatch(fr"{split}_loss_\d+", c)),
                           key=lambda c: int(c.rsplit("_", 1)[1]))
        acc_cols = sorted((c for c in df.columns if re.fullmatch(fr"{split}_full_acc_\d+", c)),
                          key=lambda c: int(c.rsplit("_", 1)[1]))
        if loss_cols:
            df[f"{split}_loss_mean"] = df[loss_cols].mean(axis=1, skipna=False)
        if acc_cols and source != "specforge":  # SpecForge acc_i is not cumulative
            df[f"{split}_sim_accept_len"] = 1 + df[acc_cols].sum(axis=1, skipna=False)
    for c in ("step", "epoch", "tokens", "wall_s", "lr"):
        if c not in df.columns:
            df[c] = pd.NA if c != "step" else range(len(df))
    df.attrs.update(source=source, loss_kind=loss_kind)
    return df


# --------------------------------------------------------------------------------------
# Other trainers' logs
# --------------------------------------------------------------------------------------
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
    "specforge": [  # SpecForge scripts/train_eagle3.py + specforge/tracker.py
        (r"train/ploss_(\d+)", "train_loss_{0}"), (r"train/acc_(\d+)", "train_full_acc_{0}"),
        (r"eval/(?:epoch)?ploss_(\d+)", "eval_loss_{0}"),
        (r"eval/(?:epoch)?acc_(\d+)", "eval_full_acc_{0}"), (r"train/lr", "lr"),
        (r"train/epoch", "epoch")],
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
    if {"_tok_s", "_step_ms"} <= set(df.columns):  # speculators' profile: tokens per step
        per = (df["_tok_s"] * df["_step_ms"] / 1000).ffill()
        df["tokens"] = (per * df["step"].diff().fillna(df["step"] + 1)).cumsum()
    elif tokens_per_step:
        df["tokens"] = (df["step"] + 1) * tokens_per_step
    df = df.drop(columns=[c for c in df.columns if c.startswith("_")])
    return _finish(df, source=trainer,
                   loss_kind="soft_ce" if trainer == "specforge" else "kl")


def read_tfevents(path: str | os.PathLike) -> list[tuple[int, str, float]]:
    """Scalars from TensorBoard event files (a file or a directory searched recursively),
    parsed directly (TFRecord framing + the few Event/Summary protobuf fields used by
    scalars: simple_value and float/double tensors). A torn last record is ignored."""
    p = Path(path)
    files = sorted(p.rglob("events.out.tfevents.*")) if p.is_dir() else [p]
    if not files:
        raise UserError(f"No TensorBoard event files (events.out.tfevents.*) under {p}.")
    out = []
    for f in files:
        data = f.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (n,) = struct.unpack_from("<Q", data, pos)
            if pos + 12 + n + 4 > len(data):
                break
            out.extend(_parse_event(data[pos + 12:pos + 12 + n]))
            pos += 12 + n + 4
    return out


def _fields(buf: bytes):
    """Yield (field number, wire type, value) of a protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _varint(buf, pos)
        elif wt == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wt == 2:
            n, pos = _varint(buf, pos)
            val, pos = buf[pos:pos + n], pos + n
        elif wt == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            return
        yield num, wt, val


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _parse_event(buf: bytes):
    step, values = 0, []
    for num, wt, val in _fields(buf):
        if num == 2 and wt == 0:
            step = val - (1 << 64) if val >= 1 << 63 else val
        elif num == 5 and wt == 2:  # Summary
            for vnum, vwt, v in _fields(val):
                if vnum != 1 or vwt != 2:
                    continue
                tag, x = None, None
                for fnum, fwt, fv in _fields(v):
                    if fnum == 1:
                        tag = fv.decode("utf-8", "replace")
                    elif fnum == 2 and fwt == 5:
                        (x,) = struct.unpack("<f", fv)
                    elif fnum == 8 and fwt == 2:
                        x = _tensor_scalar(fv)
                if tag is not None and x is not None:
                    values.append((step, tag, float(x)))
    return values


def _tensor_scalar(buf: bytes) -> float | None:
    dtype = 1
    for num, wt, val in _fields(buf):
        if num == 1 and wt == 0:
            dtype = val
        elif num == 4 and wt == 2 and val:  # tensor_content
            return struct.unpack_from("<d" if dtype == 2 else "<f", val)[0]
        elif num == 5:  # float_val (packed or not)
            return struct.unpack_from("<f", val)[0]
        elif num == 6:  # double_val
            return struct.unpack_from("<d", val)[0]
    return None


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
                 tokens_per_step: float | None = None):
    """Any supported log (see module docstring) as the common DataFrame, with
    attrs run/source/loss_kind. The format is detected from what `source` contains."""
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
    else:
        raise UserError(f"{p} holds no metrics this reader knows: an eagle3lab run dir "
                        f"(metrics.jsonl), TensorBoard event files, an MLflow run dir "
                        f"(metrics/), or a JSONL of {{step, tag: value}} lines.")
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
