"""The one thin layer over torch.distributed that every stage run under torchrun uses (the
data stages, training, the CLI's error printing).

Prevents the failures of a stage spread over torchrun's processes, and two copies of this
layer that disagree on them:
- ranks that disagree on who they are: one reading of torchrun's RANK / WORLD_SIZE /
  LOCAL_RANK / LOCAL_WORLD_SIZE (`detect`) and one description of a rank (`Ranks`);
- ranks on one GPU: each rank computes on its own GPU (`rank_device`; an explicit
  `cuda:i` under torchrun is refused);
- a rank that waits forever for a dead or hung peer: `session` starts the process group
  (nccl on CUDA, gloo on the CPU) with a timeout in SECONDS on every collective, and
  torchrun ends the job when a rank exits with an error;
- ranks that decide differently or race on one file: `Ranks.on_main` runs a decision on
  rank 0 only and hands every rank its result, or the same error;
- one error printed by every rank: `report` lets rank 0 print what every rank raises and
  puts the message into torchrun's error file, so its summary shows it.
- tests and the `--tiny` benchmark that start their ranks each their own way:
  `fork_ranks` forks torchrun's ranks from the calling process (no torchrun, no new
  interpreter per rank), the one helper tests/testutil.py and bench/scale.py use.

Communication and process management are PyTorch's own. Without torchrun no process group
is started and every collective returns its input, so a one-process run is exactly what it
was before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from datetime import timedelta
from typing import Any, Callable, Iterator

from eagle3lab.errors import UserError


class RankFailure(UserError):
    """A collective failed on this rank: another rank died or stopped answering.
    `linger_s`: seconds to wait before exiting (a peer died: let torchrun see it first);
    `record`: whether torchrun's error file should carry this message."""

    def __init__(self, msg: str, *, linger_s: float = 0.0, record: bool = True):
        super().__init__(msg)
        self.linger_s, self.record = linger_s, record


def under_torchrun() -> bool:
    """Whether torchrun started this process (it sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclasses.dataclass(frozen=True)
class Ranks:
    """Where this process stands in a torchrun job (the defaults: one process, no process
    group). `session` fills in the rest: the process group's `backend` (None: none, every
    collective returns its input), this rank's `device` and the collectives' `timeout_s`;
    `health` is a gloo side group that training's fault diagnosis uses."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    device: str = "cpu"
    timeout_s: float | None = None
    health: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def many(self) -> bool:
        return self.world_size > 1

    @property
    def active(self) -> bool:
        """Whether a process group carries the collectives."""
        return self.backend is not None

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world_size}"

    def sum(self, values) -> list[float]:
        """Element-wise sum over ranks (float64); the values themselves in one process.
        values: numbers, or one 1-d tensor (on any device: summed where the backend works,
        and read back once)."""
        import torch

        if isinstance(values, torch.Tensor):
            t = values.detach().to(torch.float64)
        else:
            if not self.active:
                return list(values)
            t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        if self.active:
            import torch.distributed as dist

            t = t.to(self.device if self.backend == "nccl" else "cpu")
            dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank ([obj] in one process)."""
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.active:
            import torch.distributed as dist

            dist.barrier()

    def on_main(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on rank 0 only and hand its result to every rank. If it fails there,
        every rank raises: the same UserError, or (for another error) one naming rank 0's."""
        if not self.active:
            return fn()
        failure: BaseException | None = None
        box: Any = None
        if self.main:
            try:
                box = ("ok", fn())
            except BaseException as e:  # noqa: BLE001 - every rank must learn of it
                failure = e
                box = ("error", e if isinstance(e, UserError) else None,
                       f"{type(e).__name__}: {e}")
        box = self.broadcast(box)
        if failure is not None:
            raise failure
        if box[0] == "error":
            if box[1] is None:
                raise RuntimeError(f"rank 0 failed: {box[2]}")
            raise box[1]
        return box[1]


def detect() -> Ranks:
    """The ranks torchrun set in the environment (Ranks() when not launched by it;
    LOCAL_RANK / LOCAL_WORLD_SIZE default to RANK / WORLD_SIZE: one node)."""
    env = os.environ
    if not under_torchrun():
        return Ranks()
    try:
        world = int(env["WORLD_SIZE"])
        return Ranks(int(env["RANK"]), world, int(env.get("LOCAL_RANK", env["RANK"])),
                     int(env.get("LOCAL_WORLD_SIZE", world)))
    except ValueError:
        raise UserError(f"RANK={env['RANK']!r} / WORLD_SIZE={env['WORLD_SIZE']!r} are not "
                        f"integers; start several processes with torchrun, which sets them."
                        ) from None


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
    """The device this rank computes on, from a resolved device ('cpu', 'cuda', 'cuda:i',
    ...): with many ranks 'cuda' means the rank's own GPU (the first of its group) and an
    explicit 'cuda:i' is refused (every rank would take the same GPU)."""
    if not ranks.many or not device.startswith("cuda"):
        return device
    if device != "cuda":
        raise UserError(f"--device {device} under torchrun would put all {ranks.world_size} "
                        f"ranks on one GPU; pass --device cuda (or auto): each rank takes the "
                        f"GPU of its LOCAL_RANK.")
    return f"cuda:{rank_gpus(ranks)[0]}"


@contextlib.contextmanager
def session(*, device: str, timeout: float) -> Iterator[Ranks]:
    """This process's Ranks for the duration of a stage. Under torchrun: the rank's device
    (`rank_device`, made CUDA's current one), the process group started (nccl on CUDA,
    gloo otherwise) with `timeout` SECONDS on every collective, unless one is running
    already (then it is used and left running); on success a barrier (no rank leaves while
    another still talks to it), then the group is destroyed; after an error it is left to
    the process's exit (a peer may be dead). Without torchrun: no process group, `device`
    unchanged."""
    ranks = detect()
    if not under_torchrun():
        yield dataclasses.replace(ranks, device=device, timeout_s=timeout)
        return
    import torch
    import torch.distributed as dist

    device = rank_device(device, ranks)
    cuda = device.startswith("cuda")
    if cuda:
        index = torch.device(device).index
        device = f"cuda:{rank_gpus(ranks)[0] if index is None else index}"
        torch.cuda.set_device(device)
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout),
                                device_id=torch.device(device) if cuda else None)
    ranks = dataclasses.replace(ranks, rank=dist.get_rank(), world_size=dist.get_world_size(),
                                backend=dist.get_backend(), device=device, timeout_s=timeout)
    ok = False
    try:
        yield ranks
        ok = True
    finally:
        if ok:
            ranks.barrier()
            if owned:
                dist.destroy_process_group()


def report(e: UserError) -> tuple[bool, float]:
    """For the CLI, on a UserError: (print it on this rank?, seconds to wait before
    exiting). Under torchrun only rank 0 prints errors every rank raises, a RankFailure
    prints wherever it happens, and torchrun's error file gets the message so that its
    summary shows it for the rank that failed first."""
    if not under_torchrun():
        return True, 0.0
    failure = isinstance(e, RankFailure)
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path and (not failure or e.record):
        msg = f"{type(e).__name__}: {e}"
        with contextlib.suppress(OSError), open(path, "w") as f:
            json.dump({"message": {"message": msg, "extraInfo": {
                "py_callstack": msg, "timestamp": str(int(time.time()))}}}, f)
    try:
        main = detect().main
    except UserError:  # RANK unreadable: better twice than never
        main = True
    return main or failure, (e.linger_s if failure else 0.0)


# --- ranks forked from this process (tests and the --tiny benchmark) ----------------------

def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it; a wildcard or "localhost" host is
    probed on the loopback): torchrun's master port, a server's --port."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("0.0.0.0", "localhost") else "127.0.0.1", 0))
        return s.getsockname()[1]


def _forked_rank(rank: int, world: int, port: int, env: dict[str, str], torchrun_vars: bool,
                 logs: Callable[[int], str] | None, fn: Callable[[int], Any]) -> None:
    """One forked rank: its output to logs(rank) (when given), torchrun's variables (when
    `torchrun_vars`), one thread (torchrun's OMP_NUM_THREADS=1; OpenMP is not fork-safe
    beyond one), `env`, then fn(rank)."""
    import sys

    import torch

    if logs is not None:
        with open(logs(rank), "w") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
        # also where sys.stdout / sys.stderr were replaced (pytest's capture, a notebook)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
    if torchrun_vars:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    os.environ.update(OMP_NUM_THREADS="1", **env)
    torch.set_num_threads(1)
    try:
        fn(rank)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def fork_ranks(fn: Callable[[int], Any], *, world: int = 2, env: dict[str, str] | None = None,
               limit_s: float | None = None, stop_when: Callable[[], bool] | None = None,
               torchrun_vars: bool = True, logs: Callable[[int], str] | None = None,
               poll_s: float = 0.5) -> None:
    """The ranks of a torchrun job without torchrun: `world` processes forked from this one
    (the libraries are not imported again per rank: ~15 s of CPU each on a small machine),
    each calling fn(rank) with torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE /
    MASTER_ADDR / MASTER_PORT set (a free port; `torchrun_vars=False`: none, as for a plain
    one-process command), OMP_NUM_THREADS=1 and one torch thread, and `env`.

    Waits until every rank has ended, or until stop_when() is true (the ranks still running
    are then killed: a hung rank). A rank that raises or exits non-zero raises here (torch's
    ProcessRaisedException carries its traceback); past `limit_s` seconds a TimeoutError is
    raised. `logs(rank)`: a file each rank's stdout and stderr go to. Every rank still alive
    when this returns or raises is killed. Prevents two copies of this helper (the tests',
    bench/scale.py's) that set the ranks up differently."""
    import sys

    import torch.multiprocessing as mp

    sys.stdout.flush()  # else a buffered line is printed again by every forked rank
    sys.stderr.flush()
    ctx = mp.start_processes(_forked_rank, args=(world, free_port(), dict(env or {}),
                                                 torchrun_vars, logs, fn),
                             nprocs=world, start_method="fork", join=False)
    deadline = None if limit_s is None else time.monotonic() + limit_s
    try:
        while not (stop_when is not None and stop_when()) and not ctx.join(timeout=poll_s):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the {world} forked ranks did not finish within "
                                   f"{limit_s:g} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join()
