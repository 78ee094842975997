"""Checks that read tensor values: the vocab map, NaN/Inf, dtypes.

Prevents three quiet ways to serve garbage: a d2t/t2d pair that disagrees (SGLang maps draft
ids through `d2t + arange` and never looks at t2d, so a regenerated or truncated map sends
every draft token to the wrong target id), a NaN that slipped out of training (the server
then proposes token 0 forever), and weights in a dtype the engine silently casts. The NaN
scan streams each tensor in blocks, so it stays fast and small on an 8B-target drafter.
"""

from __future__ import annotations

from eagle3lab.formats.findings import Finding, error, warning
from eagle3lab.formats.reader import Checkpoint


def vocab_map_findings(ck: Checkpoint, names: dict[str, str], *, draft_vocab: int | None,
                       target_vocab: int | None) -> list[Finding]:
    """`names` maps canonical "d2t"/"t2d" to the checkpoint's key (absent: not checked)."""
    import torch

    out: list[Finding] = []
    d2t = ck.tensor(names["d2t"]) if "d2t" in names else None
    t2d = ck.tensor(names["t2d"]) if "t2d" in names else None
    if d2t is not None:
        if d2t.is_floating_point() or d2t.dtype == torch.bool or d2t.dim() != 1:
            out.append(error("vocab-map", f"d2t must be a 1-D integer tensor of offsets; found "
                             f"{list(d2t.shape)} {d2t.dtype}.", tensor="d2t",
                             found=str(d2t.dtype)))
            d2t = None
        elif draft_vocab is not None and d2t.numel() != draft_vocab:
            out.append(error("vocab-map", f"d2t has {d2t.numel()} entries but "
                             f"draft_vocab_size is {draft_vocab}.", tensor="d2t",
                             expected=draft_vocab, found=d2t.numel()))
    if t2d is not None:
        if t2d.dim() != 1 or t2d.is_floating_point():
            out.append(error("vocab-map", f"t2d must be a 1-D bool mask over the target "
                             f"vocabulary; found {list(t2d.shape)} {t2d.dtype}.", tensor="t2d",
                             found=str(t2d.dtype)))
            t2d = None
        else:
            if t2d.dtype != torch.bool:
                if not bool(((t2d == 0) | (t2d == 1)).all()):
                    out.append(error("vocab-map", "t2d holds values other than 0/1.",
                                     tensor="t2d"))
                    t2d = None
                else:
                    t2d = t2d.to(torch.bool)
    if t2d is not None:
        if target_vocab is not None and t2d.numel() != target_vocab:
            out.append(error("vocab-map", f"t2d covers {t2d.numel()} tokens but the target "
                             f"vocabulary has {target_vocab}.", tensor="t2d",
                             expected=target_vocab, found=t2d.numel()))
        n_true = int(t2d.sum())
        if draft_vocab is not None and n_true != draft_vocab:
            out.append(error("vocab-map", f"t2d marks {n_true} tokens but draft_vocab_size is "
                             f"{draft_vocab}.", tensor="t2d", expected=draft_vocab,
                             found=n_true))
    if d2t is not None:
        ids = d2t.to(torch.int64) + torch.arange(d2t.numel())
        limit = target_vocab if target_vocab is not None else (
            t2d.numel() if t2d is not None else None)
        if int(ids.min()) < 0 or (limit is not None and int(ids.max()) >= limit):
            out.append(error("vocab-map", f"d2t + arange gives target ids in "
                             f"[{int(ids.min())}, {int(ids.max())}], outside the target "
                             f"vocabulary [0, {limit}). d2t must hold OFFSETS "
                             f"(target_id - draft_id), not absolute ids.", tensor="d2t",
                             expected=[0, limit], found=[int(ids.min()), int(ids.max())]))
        elif ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            k = int(torch.nonzero(ids[1:] <= ids[:-1])[0])
            out.append(error("vocab-map", f"d2t + arange is not strictly increasing (draft ids "
                             f"{k} and {k + 1} map to target ids {int(ids[k])} and "
                             f"{int(ids[k + 1])}).", tensor="d2t"))
        elif t2d is not None and (limit is None or t2d.numel() == limit):
            mask = torch.zeros(t2d.numel(), dtype=torch.bool)
            mask[ids] = True
            diff = int((mask ^ t2d).sum())
            if diff:
                out.append(error("vocab-map", f"d2t and t2d disagree about {diff} target "
                                 f"token(s) being in the draft vocabulary.", tensor="d2t",
                                 found=diff))
    return out


def nonfinite_findings(ck: Checkpoint) -> list[Finding]:
    import torch

    out = []
    for name, info in ck.tensors.items():
        if not info.is_float or info.numel == 0:
            continue
        bad = 0
        for block in ck.chunks(name):
            if block.dtype.is_floating_point and block.dtype.itemsize == 1:
                block = block.float()  # float8: no aminmax kernel
            lo, hi = torch.aminmax(block)  # one pass; NaN/Inf propagate into lo/hi
            if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
                bad += int((~torch.isfinite(block)).sum())
        if bad:
            out.append(error("nonfinite", f"{name} has {bad} NaN/Inf value(s).", tensor=name,
                             found=bad))
    return out


def dtype_findings(ck: Checkpoint, *, casts_float32: bool, engine: str) -> list[Finding]:
    floats = {}
    for name, info in ck.tensors.items():
        if info.is_float:
            floats.setdefault(info.dtype, []).append(name)
    out = []
    if len(floats) > 1:
        summary = {dt: len(v) for dt, v in floats.items()}
        minority = min(floats, key=lambda d: len(floats[d]))
        out.append(warning("dtype", f"Mixed float dtypes {summary}; e.g. "
                           f"{floats[minority][:3]} are {minority}.", found=summary))
    if casts_float32 and "float32" in floats:
        out.append(warning("dtype", f"{len(floats['float32'])} float32 tensor(s): {engine} "
                           f"loads them into its serving dtype (usually bfloat16), so the "
                           f"served drafter is not bit-identical to the one evaluated in "
                           f"float32.", found="float32"))
    return out
