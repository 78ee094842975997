"""Numbers behind the inspect notebook: per-tensor statistics, checkpoint diffs, vocab coverage.

Prevents judging a checkpoint by its file names: a tensor that is all ones (a norm never
trained), a head whose norm is 0 or NaN, two "identical" exports that differ in one tensor,
or a draft vocabulary that covers little of what the target actually emits are visible
only in values. Everything here streams tensors through `Checkpoint.chunks` and returns
plain rows (list of dicts) that the notebook turns into tables and plots.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from eagle3lab.data.foreign import open_shards
from eagle3lab.data.vocab import token_counts
from eagle3lab.formats.detect import canonical_key
from eagle3lab.formats.findings import CODES, Report
from eagle3lab.formats.reader import Checkpoint


def findings_rows(report: Report) -> list[dict[str, Any]]:
    """One row per finding, with what the code means and the usual fix."""
    rows = []
    for f in report.findings:
        meaning, fix = CODES[f.code]
        rows.append({"severity": f.severity, "code": f.code, "message": f.message,
                     "tensor": f.tensor, "expected": f.expected, "found": f.found,
                     "meaning": meaning, "fix": fix})
    return rows


def tensor_stats(checkpoint: str | os.PathLike) -> list[dict[str, Any]]:
    """Per tensor: shape, dtype, L2 norm, mean, std, max |x|, NaN and Inf counts."""
    import torch

    ck = Checkpoint(checkpoint)
    rows = []
    try:
        for name, info in sorted(ck.tensors.items()):
            row: dict[str, Any] = {"name": name, "shape": list(info.shape), "dtype": info.dtype,
                                   "numel": info.numel}
            if info.is_float and info.numel:
                sq = s = 0.0
                amax = 0.0
                nan = inf = 0
                for block in ck.chunks(name):
                    x = block.double()
                    finite = torch.isfinite(x)
                    nan += int(torch.isnan(x).sum())
                    inf += int(torch.isinf(x).sum())
                    x = x[finite]
                    if x.numel():
                        s += float(x.sum())
                        sq += float((x * x).sum())
                        amax = max(amax, float(x.abs().max()))
                n = info.numel - nan - inf
                mean = s / n if n else float("nan")
                row.update(norm=sq ** 0.5, mean=mean,
                           std=max(sq / n - mean * mean, 0.0) ** 0.5 if n else float("nan"),
                           absmax=amax, nan=nan, inf=inf)
            rows.append(row)
    finally:
        ck.close()
    return rows


def diff_checkpoints(a: str | os.PathLike, b: str | os.PathLike) -> list[dict[str, Any]]:
    """Tensor-by-tensor comparison, matching midlayer.* with layers.0.* across formats."""
    import torch

    ca, cb = Checkpoint(a), Checkpoint(b)
    try:
        na = {canonical_key(k): k for k in ca.tensors}
        nb = {canonical_key(k): k for k in cb.tensors}
        rows = []
        for canon in sorted(set(na) | set(nb)):
            ka, kb = na.get(canon), nb.get(canon)
            row: dict[str, Any] = {"tensor": canon, "in_a": ka is not None,
                                   "in_b": kb is not None}
            if ka and kb:
                ia, ib = ca.tensors[ka], cb.tensors[kb]
                row.update(shape_a=list(ia.shape), shape_b=list(ib.shape), dtype_a=ia.dtype,
                           dtype_b=ib.dtype)
                if ia.shape == ib.shape:
                    ta, tb = ca.tensor(ka), cb.tensor(kb)
                    row["bit_equal"] = ia.dtype == ib.dtype and bool(torch.equal(ta, tb))
                    if ia.is_float or ib.is_float:
                        d = ta.double() - tb.double()
                        finite = torch.isfinite(d)
                        row["nonfinite_diff"] = int((~finite).sum())  # NaN/Inf in either
                        d = d[finite]
                        row["max_abs_diff"] = float(d.abs().max()) if d.numel() else 0.0
                        ref = float(ta.double()[torch.isfinite(ta.double())].norm()) or 1.0
                        row["rel_diff"] = float(d.norm()) / ref
                    else:
                        row["n_differ"] = int((ta != tb).sum())
            rows.append(row)
        return rows
    finally:
        ca.close()
        cb.close()


def _rows(diff) -> list[dict[str, Any]]:
    return diff.to_dict("records") if hasattr(diff, "to_dict") else list(diff)


def differing_tensors(diff) -> list[str]:
    """Tensors of both checkpoints whose values differ (`bit_equal` False), from
    `diff_checkpoints` rows or a DataFrame of them; tensors of other shapes or in one
    checkpoint only are not compared, so not listed."""
    return [r["tensor"] for r in _rows(diff) if r.get("bit_equal") is not None
            and not isinstance(r["bit_equal"], float) and not r["bit_equal"]]  # NaN: absent


def tensors_in_one_only(diff) -> list[str]:
    """Tensors only one of the two checkpoints has (names matched across formats)."""
    return [r["tensor"] for r in _rows(diff) if not (r["in_a"] and r["in_b"])]


def vocab_coverage(checkpoint: str | os.PathLike, counts) -> dict[str, Any]:
    """How much of the target's token mass (counts over the target vocab) the draft
    vocabulary covers, and the best any draft vocabulary of that size could cover.

    Returns {"coverage", "best", "curve_draft", "curve_best"}: curves are cumulative
    coverage by draft rank (draft tokens sorted by frequency) for the drafter's own
    vocabulary and for the top-N tokens.
    """
    import torch

    ck = Checkpoint(checkpoint)
    try:
        keys = {canonical_key(k): k for k in ck.tensors}
        counts = torch.as_tensor(counts).to(torch.float64)
        total = float(counts.sum()) or 1.0
        if "d2t" in keys:
            d2t = ck.tensor(keys["d2t"]).to(torch.int64)
            ids = d2t + torch.arange(d2t.numel())
            ids = ids[(ids >= 0) & (ids < counts.numel())]
        else:  # full vocabulary
            ids = torch.arange(counts.numel())
    finally:
        ck.close()
    own = torch.sort(counts[ids], descending=True).values
    best = torch.sort(counts, descending=True).values[: max(ids.numel(), 1)]
    return {"draft_vocab_size": int(ids.numel()), "target_vocab_size": int(counts.numel()),
            "coverage": float(own.sum()) / total, "best": float(best.sum()) / total,
            "curve_draft": (torch.cumsum(own, 0) / total).tolist(),
            "curve_best": (torch.cumsum(best, 0) / total).tolist()}


def load_token_counts(path: str | os.PathLike):
    """Token counts over the target vocabulary from a shard directory (eagle3lab extract:
    loss-masked counts), a .safetensors file (tensor "counts"), a .pt/.npy file or a JSON
    list."""
    import json

    import torch

    p = Path(path)
    if p.is_dir():
        return token_counts(open_shards(p))
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(p))["counts"]
    if p.suffix == ".npy":
        import numpy as np

        return torch.from_numpy(np.load(p))
    if p.suffix == ".pt":
        return torch.load(p, weights_only=True)
    return torch.tensor(json.loads(p.read_text()), dtype=torch.int64)


def summary_numbers(report: Report, *, coverage: dict[str, Any] | None = None,
                    diff=None) -> dict[str, Any]:
    """The inspect notebook's key numbers for the batch report: engine, format, verdict,
    finding counts by severity and their codes, checks skipped, and where measured the
    draft vocabulary's coverage (`vocab_coverage`) and the tensors differing from the
    second checkpoint (`diff_checkpoints`); None where not measured."""
    return {
        "engine": report.engine, "format": report.format, "ok": report.ok,
        "findings": len(report.findings), "errors": len(report.errors()),
        "warnings": sum(f.severity == "warning" for f in report.findings),
        "codes": report.codes, "skipped_checks": len(report.skipped),
        "vocab_coverage": coverage["coverage"] if coverage is not None else None,
        "tensors_differing_from_second": (len(differing_tensors(diff)) if diff is not None
                                          else None),
    }
