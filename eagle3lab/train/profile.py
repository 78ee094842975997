"""A window of training steps under torch.profiler: where a step's time goes.

Prevents guessing why a run is slow from a utilisation figure. The study's online runs left
the GPU 40-45 % busy at ~100k tokens/s (docs/study.md, sessions 19 and 20), and whether the
host's per-step read of the step's sums (the loop waits for the GPU to finish before it
queues the next step), its launches, or the target's forward is the cause decides what to
change. `TrainConfig.profile_steps = [FIRST, LAST]` records those optimizer steps (1-based,
main rank) and writes RUN/profile/:

- `summary.json`: the window's steps, wall seconds and tokens (tokens/s under the
  profiler, which slows the host: compare shares, not rates, with an unprofiled run); the
  device's busy seconds (the union of its kernel, copy and set intervals) and its share of
  the wall; the host's seconds in synchronising calls (CUDA runtime synchronise and copy
  calls, aten's scalar read; nested ones counted once), each by name, and their share;
  per region of the loop (`REGIONS`: the batch, forward and backward, the step's read, the
  optimizer), the host's seconds inside it and the device's seconds of what it launched;
- `ops.txt`: torch.profiler's own tables, the top ops by device time and by host time.

On the CPU only host activity is recorded (the device figures are null).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from eagle3lab.fsutil import atomic_write_json, atomic_write_text

#: Host calls that wait for the device (CUDA runtime names as the profiler records them;
#: a pageable copy blocks like a synchronise) or read a device scalar.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cudaMemcpyAsync", "aten::_local_scalar_dense")
PROFILE_DIR = "profile"
#: The loop's regions (train/loop.py labels them with torch.profiler.record_function):
#: a micro-batch made ready (online: the target's forward), the drafter's forward and
#: backward with the step's sums, the gradient clip and the one read of the step's numbers,
#: the optimizer and scheduler step. Whatever the loop does outside them (logging, eval,
#: checkpoints) is the rest of the wall.
REGIONS = ("e3l.batch", "e3l.forward_backward", "e3l.step_read", "e3l.optimizer")


def labelled(items: Iterable[Any], name: str) -> Iterator[Any]:
    """`items`, each one fetched inside record_function(name): the time a loader takes to
    produce an item shows as a region of the profile (nothing is recorded unprofiled)."""
    from torch.profiler import record_function

    it = iter(items)
    while True:
        with record_function(name):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by (start_us, end_us) intervals, overlaps counted once."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e6


def summarize(events: Any, *, wall_s: float, tokens: int, steps: list[int],
              device: bool) -> dict[str, Any]:
    """summary.json's record from torch.profiler's `events()` (FunctionEvents)."""
    from torch.autograd import DeviceType

    dev, spans = [], []
    sync: dict[str, float] = {}
    by_region: dict[str, list[Any]] = {name: [] for name in REGIONS}
    for e in events:  # one pass: a window holds hundreds of thousands of events
        span = (e.time_range.start, e.time_range.end)
        if e.device_type != DeviceType.CPU:
            # the device's kernels, copies and sets; not the marks the profiler puts on the
            # device for each record_function (the loop's regions, inductor's graph calls):
            # they span their kernels and the gaps between them (torch's tables skip them too)
            if e.name not in REGIONS and not getattr(e, "is_user_annotation", False):
                dev.append(span)
        elif e.name in SYNC_CALLS:
            spans.append(span)
            sync[e.name] = sync.get(e.name, 0.0) + (span[1] - span[0]) / 1e6
        elif e.name in by_region:
            by_region[e.name].append(e)
    busy = _union_seconds(dev) if device else None
    regions: dict[str, dict[str, Any]] = {}
    for name, mine in by_region.items():
        regions[name] = {
            "count": len(mine),
            "host_s": _union_seconds([(e.time_range.start, e.time_range.end) for e in mine]),
            # the kernels and copies launched inside it, wherever they ran in time
            "device_s": sum(e.device_time_total for e in mine) / 1e6 if device else None}
    # a scalar read holds its copy and its synchronise: nested calls counted once
    host_sync = _union_seconds(spans)
    return {"steps": list(steps), "n_steps": steps[1] - steps[0] + 1,
            "wall_s": round(wall_s, 6), "tokens": int(tokens),
            "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
            "device_busy_s": busy,
            "device_busy_share": busy / wall_s if busy is not None and wall_s > 0 else None,
            "host_sync_s": host_sync,
            "host_sync_share": host_sync / wall_s if wall_s > 0 else None,
            "host_sync_by_call": dict(sorted(sync.items(), key=lambda kv: -kv[1])),
            "regions": regions,
            "note": "under torch.profiler, which slows the host: compare shares, not rates"}


class StepProfiler:
    """Start torch.profiler before step FIRST, stop after step LAST, write RUN/profile/.
    Does nothing when `steps` is empty or on a rank other than the main one."""

    def __init__(self, steps: list[int], out: str | Path, *, device_type: str,
                 enabled: bool = True):
        self.steps = list(steps)
        self.on = bool(self.steps) and enabled
        self.out = Path(out) / PROFILE_DIR
        self.device = device_type == "cuda"
        self.prof = None
        self.t0 = 0.0
        self.tokens0 = 0
        self.first = 0

    def before(self, step: int, tokens: int) -> None:
        """Called before optimizer step `step` (1-based) fetches its batch; `tokens`
        processed so far. A run resumed inside the window starts it at its first step
        (the summary's `steps` say which were recorded)."""
        if not self.on or not self.steps[0] <= step <= self.steps[1] or self.prof is not None:
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device else [])
        if self.device:
            torch.cuda.synchronize()
        self.prof = profile(activities=acts)
        self.prof.start()
        self.t0, self.tokens0, self.first = time.perf_counter(), tokens, step

    def after(self, step: int, tokens: int) -> Path | None:
        """Called after step `step`; at LAST, stops and writes RUN/profile/ (returned)."""
        if self.prof is None or step < self.steps[1]:
            return None
        import torch

        if self.device:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self.t0
        prof, self.prof = self.prof, None
        prof.stop()
        self.on = False
        summary = summarize(prof.events(), wall_s=wall, tokens=tokens - self.tokens0,
                            steps=[self.first, self.steps[1]], device=self.device)
        table = prof.key_averages()
        parts = []
        if self.device:
            parts += ["top ops by device time", table.table(sort_by="self_device_time_total",
                                                            row_limit=30)]
        parts += ["top ops by host time", table.table(sort_by="self_cpu_time_total",
                                                      row_limit=30)]
        atomic_write_text(self.out / "ops.txt", "\n\n".join(parts) + "\n")
        atomic_write_json(self.out / "summary.json", summary)
        return self.out

    def close(self) -> None:
        """Stop a window the run left early (stopped, failed): nothing is written."""
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.stop()
