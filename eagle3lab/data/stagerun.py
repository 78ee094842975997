"""The target of a data stage (extract, regenerate, self-prompt) on torchrun's ranks, and
the process group's backend and wait.

Prevents the failures of running a data stage on many GPUs by hand: ranks whose targets
land on one GPU or whose device maps overlap (each rank loads the target on its own GPU, or
with `--device-map` on its own equal group of the node's GPUs: accelerate's `max_memory`
confines the map to it), and ranks that wait a fixed default in the wrong unit: the wait
(`dist_timeout`) is in seconds, like training's, with a longer default because ranks wait
at the end of unequal shares for the slowest one.

The ranks, process group and collectives are `eagle3lab.distributed`'s; the order a stage
runs in (the session around it included) is `eagle3lab.data.stage.Stage`; which rank does
which part of the work and how the parts are merged is `eagle3lab.data.rankparts`.
Without torchrun a stage runs in one process exactly as before.
"""

from __future__ import annotations

from typing import Any

from eagle3lab.distributed import Ranks, rank_device, rank_gpus
from eagle3lab.targets.adapter import Target, resolve_device

#: Seconds a rank waits in a collective (a barrier: for the slowest rank to finish its
#: share) before the job fails; torchrun ends the job sooner when a rank dies.
DEFAULT_TIMEOUT_S = 3600.0


def device_map_memory(ranks: Ranks) -> dict[int, int] | None:
    """accelerate's `max_memory` that confines a device-mapped target to this rank's GPU
    group (None without torchrun: the target may use every visible GPU)."""
    import torch

    if not ranks.many or not torch.cuda.is_available():
        return None
    return {g: torch.cuda.mem_get_info(g)[0] for g in rank_gpus(ranks)}


def uses_cuda(target: Any, device: str, device_map: str | None) -> bool:
    """Whether a stage with these arguments runs its target on CUDA (picks NCCL vs gloo)."""
    import torch

    if isinstance(target, Target):
        return target.device.type == "cuda"
    return torch.cuda.is_available() and (device_map is not None
                                          or resolve_device(device).startswith("cuda"))


def load_rank_target(target: Any, ranks: Ranks, *, device: str, dtype: str,
                     device_map: str | None):
    """The stage's target: as given if already loaded, else loaded on this rank's GPU (or,
    with a device map, on its group of GPUs)."""
    # lazy: a test patches eagle3lab.targets.adapter.load_target
    from eagle3lab.targets.adapter import load_target

    if isinstance(target, Target):
        return target
    if device_map is not None:
        return load_target(target, device=device, dtype=dtype, device_map=device_map,
                           max_memory=device_map_memory(ranks))
    return load_target(target, device=rank_device(resolve_device(device), ranks), dtype=dtype)
