"""Training metrics: per-position counts and the run's metrics.jsonl as a pandas DataFrame.

Prevents comparing numbers that are not the same quantity: counts are kept raw (sums and
totals; ratios are taken last), speculators' decay-weighted per-position losses are
un-weighted, and every frame says in `df.attrs["loss_kind"]` what its loss is (here: KL).
The importers of other trainers' logs (eagle3lab.study.importers) build the same frame.

Columns (one row per logged step): step, epoch, tokens, wall_s, lr, and for split in
{train, eval}: {split}_loss_{i}, {split}_full_acc_{i}, {split}_cond_acc_{i},
{split}_objective, {split}_loss_mean, {split}_sim_accept_len. full_acc_i is cumulative
(positions 0..i all correct, speculators' definition), so 1 + sum_i full_acc_i is the
teacher-forced chain accept length estimate (including the bonus token).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

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


def count_keys(ttt_steps: int) -> list[str]:
    """The names of one batch's raw counts, in `step_count_tensor`'s order."""
    return [k for i in range(ttt_steps) for k in (
        f"loss_{i}_sum", f"loss_{i}_n", f"full_acc_{i}_sum", f"full_acc_{i}_total",
        f"cond_acc_{i}_sum", f"cond_acc_{i}_total")]


def step_count_tensor(metrics: dict, loss_mask, ttt_steps: int, decay: float):
    """Raw counts for one batch as one float64 tensor on the batch's device (in
    `count_keys` order), without a host sync: the training loop sums these over a step's
    micro-batches and all ranks, and reads them once per step. speculators reports each
    position's loss already multiplied by decay**i and averaged over the batch's loss
    tokens; we undo the decay and weight by the token count, so losses can be summed over
    batches."""
    import torch

    dev = loss_mask.device

    def value(key: str):
        return torch.as_tensor(metrics[key], device=dev).detach().to(torch.float64)

    out = []
    for i in range(ttt_steps):
        n = loss_mask[:, i:].sum().to(torch.float64)
        w = decay ** i
        out += [value(f"loss_{i}_sum") / w * n if w else torch.zeros((), dtype=torch.float64,
                                                                      device=dev), n]
        for kind in ("full_acc", "cond_acc"):
            out += [value(f"{kind}_{i}_sum"), value(f"{kind}_{i}_total")]
    return torch.stack(out)


def step_counts(metrics: dict, loss_mask, ttt_steps: int, decay: float) -> dict[str, float]:
    """Raw counts for one batch, by name (`step_count_tensor` read on the host)."""
    return dict(zip(count_keys(ttt_steps),
                    step_count_tensor(metrics, loss_mask, ttt_steps, decay).tolist()))


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
    return finish_frame(pd.DataFrame(rows), source="eagle3lab", loss_kind="kl")


def finish_frame(df, *, source: str, loss_kind: str):
    """Sort, add derived columns (loss_mean, sim_accept_len), record provenance (attrs
    source, loss_kind). Shared by read_metrics and the importers of other trainers' logs."""
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
