"""Training on many processes: what the loop needs beyond the shared layer
(`eagle3lab.distributed`: ranks, process group, collectives).

The model is wrapped in DDP, or sharded with FSDP2 (`fully_shard`: parameters, gradients
and Adam state) with `fsdp=True`; without torchrun the drafter itself, so the loop has one
code path and a one-process run computes, logs and writes exactly what it did before.

Prevents the failures of a training run spread over processes:
- ranks that disagree: every decision (log, eval, stop, NaN) is taken on all-reduced
  numbers, so every rank takes it at the same step; a NaN on one rank stops all of them;
- a dead or hung rank that leaves the others waiting forever: collectives time out after
  `dist_timeout` seconds, the rank that notices says which rank stopped answering (gloo's
  `monitored_barrier` on a side group, `with_health_group`) and exits, and torchrun ends
  the job; a rank whose peer died waits a moment so that torchrun's summary names the dead
  rank first;
- half-written checkpoints: `shared_atomic_dir` lists a checkpoint only after every rank's
  part is written (barrier, then rank 0 renames);
- a resume that is another run: the micro-batches of an optimizer step depend only on
  world size x grad_accum (`PackedData.steps`), so a DDP run resumes at any world size with
  the same product (`check_resume_world` refuses others, naming both sizes); FSDP runs
  resume at their own world size.

Test-only fault injection: EAGLE3LAB_TEST_FAULT="kill:RANK:STEP" (SIGKILL) or
"hang:RANK:STEP" makes that rank die or hang when it starts that optimizer step;
"term:RANK:STEP" sends it SIGTERM there (a deadline's stop: train/loop.py's `_TermFlag`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

from eagle3lab.distributed import RankFailure, Ranks, under_torchrun
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_dir


def check_launch(*, fsdp: bool) -> None:
    if fsdp and not under_torchrun():
        raise UserError("fsdp (--fsdp) shards the drafter over torchrun's ranks: launch with "
                        "`torchrun --nproc-per-node N -m eagle3lab train ... --fsdp`.")


def with_health_group(d: Ranks) -> Ranks:
    """`d` with a gloo side group for `monitored_barrier` (which rank stopped answering,
    `comm_failure`); every rank makes it, right after the session starts."""
    if not d.active:
        return d
    import torch.distributed as dist

    return dataclasses.replace(d, health=dist.new_group(
        backend="gloo", timeout=timedelta(seconds=d.timeout_s)))


def describe(d: Ranks, *, fsdp: bool, grad_accum: int) -> dict[str, Any]:
    """What run.json records about the ranks."""
    return {"world_size": d.world_size, "backend": d.backend, "fsdp": fsdp,
            "grad_accum": grad_accum, "micro_batches_per_step": d.world_size * grad_accum}


def check_resume_world(previous: dict | None, now: dict, out) -> None:
    """Refuse to resume a run at a world size that would change its optimizer steps."""
    prev = previous or {"world_size": 1, "grad_accum": 1, "fsdp": False}
    w0, k0, w, k = prev["world_size"], prev["grad_accum"], now["world_size"], now["grad_accum"]
    if now["fsdp"] and w != w0:
        raise UserError(f"Cannot resume the FSDP run in {out} on {w} rank(s): it was trained "
                        f"on {w0}. Resume it with torchrun on {w0} ranks.")
    if w * k != w0 * k0:
        fix = (f"--grad-accum {w0 * k0 // w} on {w} rank(s)" if (w0 * k0) % w == 0
               else f"a world size that divides {w0 * k0}")
        raise UserError(
            f"Cannot resume the run in {out} at world size {w} x grad_accum {k} = {w * k} "
            f"micro-batches per optimizer step: it was trained at world size {w0} x "
            f"grad_accum {k0} = {w0 * k0}. Any world size x grad_accum = {w0 * k0} continues "
            f"the same steps: use {fix}.")


def check_shared_dir(d: Ranks, out: Path) -> None:
    """Refuse a run directory that not every rank sees (nodes without a shared filesystem)."""
    if not d.active:
        return
    import socket

    probe = out / f".ranks-probe-{d.broadcast(os.urandom(6).hex() if d.main else None)}"
    if d.main:
        probe.write_text("")
    d.barrier()
    seen = d.gather((probe.exists(), socket.gethostname()))
    d.barrier()
    if d.main:
        probe.unlink()
    missing = [f"rank {r} on {host}" for r, (ok, host) in enumerate(seen) if not ok]
    if missing:
        raise UserError(f"The run directory {out} is not shared by every rank: "
                        + ", ".join(missing) + " cannot see a file rank 0 wrote there. "
                        "Put --out on a filesystem every node mounts (NFS, Lustre, ...).")


# --- the model --------------------------------------------------------------------------
def wrap_model(model, d: Ranks, *, fsdp: bool, device: str,
               reduce_dtype: str = "float32"):
    """(model to train, the drafter inside it). DDP under torchrun; FSDP2 `fully_shard`
    (each decoder layer, then the whole drafter, as speculators does) with fsdp=True; the
    drafter itself in one process. reduce_dtype "bfloat16": gradients cross the ranks in
    bf16 (half the bytes: DDP's `bf16_compress_hook`, FSDP2's `MixedPrecisionPolicy(
    reduce_dtype=...)`), for links where the all-reduce of a large drafter's fp32
    gradients, which cannot overlap its TTT backward (every shared weight's gradient is
    complete only at the end), costs as much as the step."""
    if not d.active:
        return model, model
    import torch

    bf16 = reduce_dtype == "bfloat16"
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu",
                                (d.world_size,))
        mp = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if bf16 else None)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model, model
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(
        model, device_ids=[device] if device.startswith("cuda") else None)
    if bf16:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            bf16_compress_hook)

        if d.backend != "nccl":
            raise UserError(f"grad_reduce_dtype=bfloat16 (--grad-reduce-dtype) under DDP uses "
                            f"PyTorch's bf16_compress_hook, which needs NCCL (GPUs); this run "
                            f"uses {d.backend}. Leave it at float32, or add --fsdp (FSDP2 "
                            f"reduces in bf16 on any backend).")

        ddp.register_comm_hook(None, bf16_compress_hook)
    return ddp, model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def grad_sync(model, *, sync: bool) -> Iterator[None]:
    """Around a micro-step's forward and backward: all-reduce (DDP) / reduce-scatter
    (FSDP) the gradients only when `sync` (the step's last micro-batch)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel) and not sync:
        with model.no_sync():
            yield
        return
    if is_sharded(model):
        model.set_requires_gradient_sync(sync)
    yield


def clip_grad_norm(params, max_norm: float):
    """The global gradient norm (before clipping), clipped to max_norm (0 = off)."""
    import torch

    gn = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    return gn.full_tensor() if hasattr(gn, "full_tensor") else gn


def gathered_state_dict(model, d: Ranks) -> dict | None:
    """A sharded drafter's full state dict, gathered to CPU on rank 0 (every rank takes
    part; None elsewhere). None for an unsharded drafter: its own state_dict is whole."""
    if not (d.active and is_sharded(model)):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                              cpu_offload=True))
    return sd if d.main else None


def save_sharded(model, opt, path: Path) -> None:
    """Model and optimizer shards of every rank (torch.distributed.checkpoint)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))


def load_sharded(model, opt, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(path))
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)


@contextlib.contextmanager
def shared_atomic_dir(final: Path, d: Ranks) -> Iterator[Path]:
    """`fsutil.atomic_dir` for all ranks: rank 0 makes the temporary directory, every rank
    writes its part into it, and only after a barrier (every part complete) does rank 0
    rename it to `final`; a second barrier lets every rank see it."""
    if not d.active:
        with atomic_dir(final) as tmp:
            yield tmp
        return
    if d.main:
        with atomic_dir(final) as tmp:
            d.broadcast(str(tmp))
            yield tmp
            d.barrier()
    else:
        yield Path(d.broadcast(None))
        d.barrier()
    d.barrier()


# --- faults -----------------------------------------------------------------------------
def fault_point(d: Ranks, step: int) -> None:
    """Test-only fault injection (see the module docstring)."""
    spec = os.environ.get("EAGLE3LAB_TEST_FAULT")
    if not spec:
        return
    kind, rank, at = spec.split(":")
    if int(rank) == d.rank and int(at) == step:
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        while kind == "hang":
            time.sleep(60)


def is_comm_error(e: BaseException) -> bool:
    import torch.distributed as dist

    text = str(e).lower()
    return isinstance(e, dist.DistError) or any(s in text for s in (
        "gloo", "connection closed by peer", "connection reset", "nccl", "timed out",
        "timeout caused pair closure"))


def comm_failure(d: Ranks, e: BaseException, *, step: int | None, checkpoint) -> RankFailure:
    """The message for a collective that failed on this rank: which rank stopped answering
    (a peer that died closes its connections; one that hangs fails gloo's
    monitored_barrier, which rank 0 runs over every rank), and how to resume."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    first = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". This is typically")[0][:240]
    died = "closed by peer" in first or "Connection reset" in first
    where = f"rank {d.rank} of {d.world_size}: " + (f"at step {step}" if step
                                                    else "before the first step")
    resume = (f" The last complete checkpoint is {checkpoint}: rerun the same torchrun "
              f"command with --resume." if checkpoint else
              " No checkpoint was written yet (set --checkpoint-every).")
    if died:
        return RankFailure(f"{where} another rank closed its connection ({first}): it died; "
                           f"torchrun's summary names it." + resume,
                           linger_s=min(d.timeout_s, 10.0), record=False)
    return RankFailure(f"{where} a collective failed ({first}) within dist_timeout="
                       f"{d.timeout_s:g}; {_unanswering(d)}." + resume)


def _unanswering(d: Ranks) -> str:
    import torch.distributed as dist

    try:
        dist.monitored_barrier(group=d.health, wait_all_ranks=True,
                               timeout=timedelta(seconds=min(d.timeout_s, 60.0)))
        return "every rank answered a check afterwards"
    except RuntimeError as x:
        m = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", str(x))
        if m:
            return f"rank {m.group(1).strip()} did not answer a check either: it hangs or died"
        if not d.main:
            return ("rank 0, which checks every rank, did not answer: rank 0 hangs or died, "
                    "or rank 0's message names the rank that did")
        return "a check of the other ranks failed too"

