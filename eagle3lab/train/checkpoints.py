"""The run directory: run.json, atomic checkpoints, exact resume, final/, and the packed
copy of final/ that is shipped.

Prevents a run that cannot be trusted after a crash: checkpoints are written atomically
(temp dir, then rename) with the optimizer, scheduler, data position and RNG, so a resumed
run logs exactly what an uninterrupted run logs; metrics lines logged after the checkpoint
it resumes from (work lost in the interruption) and torn lines are dropped, so they are
recomputed instead of logged twice. A checkpoint made with another configuration is
refused instead of half-loaded. `pack_drafter` makes the shipping copy (bf16, without the
embedding the target already has) atomically, so a half-written drafter never ships.

Layout: RUN_DIR/run.json, metrics.jsonl, checkpoints/step-N/ (speculators save_pretrained +
trainer_state.pt + checkpoint.json, which names the frozen tensors), final/ (speculators
format + eagle3lab.json). A checkpoint carried to another machine may leave its frozen
tensors out (left-out.json: their sha256); loading it keeps the drafter's own, once they
are checked equal, so a drafter built from another target is refused, not resumed.
Under torchrun (`dist`: the `Ranks`; see train/distributed.py) rank 0 writes those from
the full state dict (gathered under FSDP), each rank adds rng-rank{R}.pt (its RNG state),
an FSDP run adds sharded/ (model and optimizer shards, torch.distributed.checkpoint;
trainer_state.pt then holds no optimizer), and the checkpoint is renamed into place only
when every rank's part is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle3lab.config import package_versions
from eagle3lab.data import rendering
from eagle3lab.distributed import Ranks
from eagle3lab.errors import UserError
from eagle3lab.fsutil import (atomic_dir, atomic_write_json, atomic_write_text, read_json_object,
                             sha256_file)
from eagle3lab.workdir import FINAL, LEFT_OUT
from eagle3lab.train import distributed

RUN_FORMAT = "eagle3lab-run"
RUN_VERSION = 1


def read_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    p = Path(run_dir) / "run.json"
    if not p.exists():
        raise UserError(f"{run_dir} is not a training run directory (no run.json).")
    return read_json_object(p, what="run record", fix="Delete the run directory and train "
                            "again, or choose a new --out.")


def is_finished(run_dir: str | os.PathLike) -> bool:
    p = Path(run_dir) / "run.json"
    return p.exists() and read_run(run_dir).get("status") == "done"


def versions() -> dict[str, str]:
    """The versions run.json records: eagle3lab and the libraries that compute the run."""
    return package_versions(("speculators", "torch", "transformers"))


def _rng_state() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(s: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save_pretrained(model, directory: Path, state_dict: dict | None = None) -> None:
    """speculators' save_pretrained without the "Writing model shards" progress bar
    (`state_dict`: the gathered weights of a sharded drafter)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(directory, state_dict=state_dict)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def list_checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints (atomic dirs that contain trainer_state.pt), oldest first."""
    found = [p for p in (out / "checkpoints").glob("step-*") if (p / "trainer_state.pt").exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def save_checkpoint(out: Path, model, opt, sched, state: dict, keep: int, *,
                    dist: Ranks | None = None) -> Path:
    """checkpoints/step-N (see the module docstring); `model` is the drafter (FSDP-sharded
    or not, never the DDP wrapper). Every rank calls it under torchrun."""
    import shutil

    import torch

    d = dist or Ranks()
    sharded = d.active and distributed.is_sharded(model)
    final = out / "checkpoints" / f"step-{state['step']}"
    with distributed.shared_atomic_dir(final, d) as tmp:
        if sharded:
            distributed.save_sharded(model, opt, tmp / "sharded")
        weights = distributed.gathered_state_dict(model, d)
        if d.main:
            save_pretrained(model, tmp, weights)
            torch.save({"optimizer": None if sharded else opt.state_dict(),
                        "scheduler": sched.state_dict(), "state": state,
                        "rng": _rng_state()}, tmp / "trainer_state.pt")
            atomic_write_json(tmp / "checkpoint.json", {
                "step": state["step"], "tokens": state["tokens"], "epoch": state["epoch"],
                # what a carry may leave out and resume from the drafter built fresh
                # (bench/run_carry.py: the target's embedding, a frozen head)
                "frozen": [] if sharded else frozen_keys(model)})
        if d.active:
            torch.save(_rng_state(), tmp / f"rng-rank{d.rank}.pt")
    if d.main:
        for old in list_checkpoints(out)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _load_weights(directory: Path) -> dict:
    """Every tensor of a saved model's *.safetensors files (sharded or not)."""
    from safetensors.torch import load_file

    weights = {}
    for f in sorted(directory.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    return weights


#: CKPT/LEFT_OUT (workdir): the frozen tensors a carry left out of the checkpoint's weights
#: ({"format", "version", "sha256": {key: tensor_sha256}}; bench/run_carry.py writes it)
LEFT_OUT_FORMAT = "eagle3lab-left-out"


def frozen_keys(model) -> list[str]:
    """The drafter's frozen parameters (requires_grad False: the target's embedding, a
    frozen head): they equal what building the drafter gives, so a checkpoint carried
    between machines may leave them out (`load_checkpoint` checks them against LEFT_OUT)."""
    return sorted(n for n, p in model.named_parameters() if not p.requires_grad)


def tensor_sha256(t) -> str:
    """sha256 of a tensor's dtype, shape and bytes (as stored: no conversion)."""
    import hashlib

    import torch

    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _left_out_checked(ckpt: Path, model, missing: list[str]) -> set[str]:
    """The keys missing from CKPT's weights that a carry left out (CKPT/LEFT_OUT), each
    checked against the drafter as built here: one that differs (another target, another
    vocab map) is refused in one line instead of resuming a different drafter."""
    if not (ckpt / LEFT_OUT).is_file():
        return set()
    rec = read_json_object(ckpt / LEFT_OUT, what="checkpoint's left-out record",
                           fix="Carry the checkpoint again (bench/run_carry.py out).")
    if rec.get("format") != LEFT_OUT_FORMAT or not isinstance(rec.get("sha256"), dict):
        raise UserError(f"{ckpt / LEFT_OUT}: not a left-out record (format "
                        f"{LEFT_OUT_FORMAT!r} with a sha256 map).")
    state = model.state_dict()
    ok = set()
    for k in missing:
        if k not in rec["sha256"]:
            continue
        if tensor_sha256(state[k]) != rec["sha256"][k]:
            raise UserError(f"Checkpoint {ckpt} left out {k} (frozen, carried without it) "
                            f"and this drafter's {k} is not the one it trained with: built "
                            "from another target or vocab map? Resume where it was made.")
        ok.add(k)
    return ok


def load_checkpoint(ckpt: Path, model, opt, sched, *,
                    dist: Ranks | None = None) -> dict:
    """Load a checkpoint into the drafter (`model`, as for save_checkpoint), optimizer and
    scheduler; restore this rank's RNG state (rank 0's where the run had fewer ranks, or
    in one process). Frozen tensors a carry left out (CKPT/LEFT_OUT) stay as built, once
    checked equal to those the run trained with."""
    import torch

    d = dist or Ranks()
    if (ckpt / "sharded").is_dir():
        distributed.load_sharded(model, opt, ckpt / "sharded")
    else:
        missing, unexpected = model.load_state_dict(_load_weights(ckpt), strict=False)
        left = _left_out_checked(ckpt, model, missing)
        bad = [k for k in missing if not k.startswith("verifier_") and k not in left] \
            + list(unexpected)
        if bad:
            raise UserError(f"Checkpoint {ckpt} does not fit this drafter (keys {bad[:5]}); "
                            f"it was made with another configuration.")
    blob = torch.load(ckpt / "trainer_state.pt", weights_only=False, map_location="cpu")
    if blob["optimizer"] is not None:
        opt.load_state_dict(blob["optimizer"])
    sched.load_state_dict(blob["scheduler"])
    own = ckpt / f"rng-rank{d.rank}.pt"
    _set_rng_state(torch.load(own, weights_only=False) if d.active and own.exists()
                   else blob["rng"])
    return blob["state"]


def truncate_metrics(path: Path, step: int) -> None:
    """Drop lines logged after `step` (work lost in the interruption) and torn lines."""
    keep = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    keep.append(line)
            except (json.JSONDecodeError, KeyError):
                continue
    atomic_write_text(path, "".join(x + "\n" for x in keep))


def check_resume_rendering(recorded: dict[str, Any] | None, now: dict[str, Any],
                           out) -> None:
    """Refuse to resume a run whose data was rendered otherwise than its run.json recorded
    (another chat template, system prompt or template kwargs: a drafter half trained on
    each); a run made before rendering was recorded (None) is not checked."""
    if isinstance(recorded, dict) and recorded != now:
        raise UserError(f"Cannot resume {out}: its data was rendered with "
                        f"{rendering.describe(recorded)}, this data with "
                        f"{rendering.describe(now)}. Resume with the run's own data, or "
                        f"start a new run directory.")


def save_final(out: Path, model, info: dict[str, Any], state_dict: dict | None = None) -> Path:
    """RUN_DIR/final/: the drafter in speculators format + eagle3lab.json describing it
    (rank 0 only; `state_dict`: the gathered weights of a sharded drafter). Its
    "rendering" is how the training text was rendered (`eagle3lab.data.rendering`; what
    `inspect --target` and `preflight` compare with what serving renders)."""
    with atomic_dir(out / FINAL) as tmp:
        save_pretrained(model, tmp, state_dict)
        atomic_write_json(tmp / "eagle3lab.json", {k: info[k] for k in (
            "format", "version", "versions", "data", "drafter", "rendering",
            "metric_definitions") if k in info})
    return out / FINAL


def pack_drafter(final: str | os.PathLike, dst: str | os.PathLike) -> dict[str, Any]:
    """Copy a trained speculators drafter (a run's final/) for shipping: without
    `embed_tokens` (the target's own; `load_drafter` and the engines take the target's),
    floating tensors in bf16, with its config.json and eagle3lab.json; written atomically.
    Returns the file facts (path, bytes, sha256, parameter count)."""
    import torch
    from safetensors.torch import save_file

    final, dst = Path(final), Path(dst)
    if not (final / "config.json").is_file() or not any(final.glob("*.safetensors")):
        raise UserError(f"{final} is not a trained drafter (it needs config.json and "
                        f"*.safetensors: a training run's {FINAL}/ directory).")
    weights = _load_weights(final)
    keep = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
            for k, v in weights.items() if k != "embed_tokens.weight"}
    with atomic_dir(dst) as tmp:
        save_file(keep, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name in ("config.json", "eagle3lab.json"):
            if (final / name).exists():
                (tmp / name).write_text((final / name).read_text())
    f = dst / "model.safetensors"
    return {"path": str(dst), "bytes": f.stat().st_size, "sha256": sha256_file(f),
            "params": sum(v.numel() for v in keep.values())}
