"""Ranks for the data stages (extract, regenerate, self-prompt) under torchrun.

Prevents the failures of running a data stage on many GPUs by hand: ranks that do the same
work twice or skip some (a rank's share here is a pure function of its rank, the world
size and data every rank reads alike; whatever depends on files on disk is decided once,
on rank 0, and broadcast), ranks that race on one file (only rank 0 writes the shared
files), and a rank that waits forever for a dead or hung peer (every collective has a
timeout, and torchrun ends the job when one rank exits with an error).

Communication and process management are PyTorch's own: torchrun starts the processes
and sets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE; torch.distributed (NCCL on
CUDA, gloo on the CPU) carries the barriers and the few small Python objects. Without
torchrun (or with one process) no process group is started and every helper here is the
identity, so a one-process run is exactly what it was before.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import datetime
import os
from typing import Any, Callable, Iterator

from eagle3lab.errors import UserError

#: Minutes a rank waits in a collective (a barrier: for the slowest rank to finish its
#: share) before the job fails; torchrun ends the job sooner when a rank dies.
DEFAULT_TIMEOUT_MIN = 60.0


@dataclasses.dataclass(frozen=True)
class Ranks:
    """Where this process stands in a torchrun job (the defaults: no torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def many(self) -> bool:
        return self.world_size > 1

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world_size}"


def detect() -> Ranks:
    """The ranks torchrun set in the environment (Ranks() when not launched by it)."""
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return Ranks()
    try:
        world = int(env["WORLD_SIZE"])
        return Ranks(int(env["RANK"]), world, int(env.get("LOCAL_RANK", env["RANK"])),
                     int(env.get("LOCAL_WORLD_SIZE", world)))
    except ValueError:
        raise UserError(f"RANK={env['RANK']!r} / WORLD_SIZE={env['WORLD_SIZE']!r} are not "
                        f"integers; start several processes with torchrun, which sets them."
                        ) from None


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def rank_gpus(ranks: Ranks) -> list[int]:
    """This rank's GPUs: the node's visible GPUs in LOCAL_WORLD_SIZE equal groups (one GPU
    each when there are as many ranks as GPUs; a group for a device-mapped target)."""
    import torch

    n = torch.cuda.device_count()
    per = n // max(ranks.local_world_size, 1)
    if per < 1:
        raise UserError(f"{ranks.local_world_size} ranks were started on this node but it has "
                        f"{n} visible GPU(s); start at most {n} (torchrun --nproc-per-node {n}).")
    return list(range(ranks.local_rank * per, (ranks.local_rank + 1) * per))


def rank_device(device: str, ranks: Ranks) -> str:
    """The device this rank computes on: under torchrun 'auto' / 'cuda' mean the rank's own
    GPU; an explicit 'cuda:i' is refused (every rank would take the same GPU)."""
    from eagle3lab.target.adapter import resolve_device

    dev = resolve_device(device)
    if not ranks.many or not dev.startswith("cuda"):
        return dev
    if dev != "cuda":
        raise UserError(f"--device {device} under torchrun would put all {ranks.world_size} "
                        f"ranks on one GPU; pass --device cuda (or auto): each rank takes the "
                        f"GPU of its LOCAL_RANK.")
    return f"cuda:{rank_gpus(ranks)[0]}"


def device_map_memory(ranks: Ranks) -> dict[int, int] | None:
    """accelerate's `max_memory` that confines a device-mapped target to this rank's GPU
    group (None without torchrun: the target may use every visible GPU)."""
    import torch

    if not ranks.many or not torch.cuda.is_available():
        return None
    return {g: torch.cuda.mem_get_info(g)[0] for g in rank_gpus(ranks)}


@contextlib.contextmanager
def session(*, cuda: bool, timeout_min: float = DEFAULT_TIMEOUT_MIN) -> Iterator[Ranks]:
    """Start the process group for the duration of a stage (NCCL on CUDA, gloo on CPU),
    unless there is one process or a group is already running (then it is reused, and
    left running)."""
    import torch
    import torch.distributed as dist

    ranks = detect()
    if not ranks.many or dist.is_initialized():
        yield ranks
        return
    device_id = None
    if cuda:
        gpu = rank_gpus(ranks)[0]
        torch.cuda.set_device(gpu)
        device_id = torch.device("cuda", gpu)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device_id,
                            timeout=datetime.timedelta(minutes=timeout_min))
    try:
        yield ranks
    finally:
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    dist = _dist()
    if dist is not None:
        dist.barrier()


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank ([obj] without a process group)."""
    dist = _dist()
    if dist is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def on_main(fn: Callable[[], Any]) -> Any:
    """Run `fn` on rank 0 only and hand its result to every rank. If it fails there, every
    rank raises: the same UserError, or (for another error) one that names rank 0's."""
    dist = _dist()
    if dist is None:
        return fn()
    box: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except BaseException as e:  # noqa: BLE001 - every rank must learn of it
            failure = e
            box[0] = ("error", e if isinstance(e, UserError) else None,
                      f"{type(e).__name__}: {e}")
    dist.broadcast_object_list(box, src=0)
    if failure is not None:
        raise failure
    if box[0][0] == "error":
        if box[0][1] is None:
            raise RuntimeError(f"rank 0 failed: {box[0][2]}")
        box[0][1].from_main = True  # the CLI prints it once, on rank 0
        raise box[0][1]
    return box[0][1]


def contiguous_shares(weights: list[int], parts: int) -> list[tuple[int, int]]:
    """Split range(len(weights)) into `parts` consecutive [a, b) ranges of about equal total
    weight (each cut where the running total is nearest to k/parts of the whole)."""
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    cuts = [0]
    for k in range(1, parts):
        goal = prefix[-1] * k / parts
        j = bisect.bisect_left(prefix, goal, lo=cuts[-1])
        if j > cuts[-1] and j <= len(weights) and goal - prefix[j - 1] < prefix[j] - goal:
            j -= 1
        cuts.append(min(max(j, cuts[-1]), len(weights)))
    cuts.append(len(weights))
    return [(cuts[k], cuts[k + 1]) for k in range(parts)]


def uses_cuda(target: Any, device: str, device_map: str | None) -> bool:
    """Whether a stage with these arguments runs its target on CUDA (picks NCCL vs gloo)."""
    import torch

    from eagle3lab.target.adapter import Target, resolve_device

    if isinstance(target, Target):
        return target.device.type == "cuda"
    return torch.cuda.is_available() and (device_map is not None
                                          or resolve_device(device).startswith("cuda"))


def run_stage(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """`fn(ranks, **kwargs)` within a `session` (a stage's keyword arguments: target,
    device, device_map and dist_timeout, the minutes a rank waits in a collective)."""
    kwargs = dict(kwargs)
    timeout = kwargs.pop("dist_timeout")
    cuda = uses_cuda(kwargs["target"], kwargs["device"], kwargs["device_map"])
    with session(cuda=cuda, timeout_min=timeout) as ranks:
        return fn(ranks, **kwargs)


def load_rank_target(target: Any, ranks: Ranks, *, device: str, dtype: str,
                     device_map: str | None):
    """The stage's target: as given if already loaded, else loaded on this rank's GPU (or,
    with a device map, on its group of GPUs)."""
    from eagle3lab.target.adapter import Target, load_target

    if isinstance(target, Target):
        return target
    if device_map is not None:
        return load_target(target, device=device, dtype=dtype, device_map=device_map,
                           max_memory=device_map_memory(ranks))
    return load_target(target, device=rank_device(device, ranks), dtype=dtype)
