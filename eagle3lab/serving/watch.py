"""The start-up watchdog: says within the silence window, not after ten minutes, that a
server start has hung or crashed, collects the stacks, names the likely fix, and stops it.

Prevents the classic lost hour on a GPU node: SGLang's launcher waits up to ten minutes
for a scheduler that died (traceback scrolled away) or deadlocked in NCCL or CUDA-graph
capture (log silent, GPUs at 0%, processes sleeping; the causes per phase are catalogued in
`serverlogs/catalogue.py`).
Each `poll()` combines four signals: the log (phases and crash markers;
`serverlogs/analyzer.py`), the server's `/health`, the process group (psutil), and GPU utilisation (NVML through
nvidia-ml-py when present; on a CPU machine it is absent and the state says so). Verdicts:
`starting`, `ready`, `crashed` (process gone with an error, or a traceback in the log),
`hung` (not ready and no new log line for `silence_s`, default 120 s, with GPU utilisation
at ~0 where measurable), `exited` (ended cleanly, e.g. stopped, or the log says the server
shut down: uvicorn's, vLLM's `[shutdown]` or SGLang's shutdown lines, analyzer.py; its
processes may still be exiting then). `wait()` acts on a final
verdict: on `hung` it dumps every group member's Python stacks into the run dir, names the
likely causes and fixes for the phase it stopped in, and stops the group; on `crashed` (and
on `exited` while the group is still shutting down) it stops whatever is left of the group.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any, Callable

from eagle3lab.fsutil import atomic_write_json
from eagle3lab.serverlogs.analyzer import LogFollower
from eagle3lab.serverlogs.catalogue import hang_cause
from eagle3lab.serving import process

FINAL = ("ready", "crashed", "hung", "exited")


class GpuMonitor:
    """GPU utilisation in percent per device through NVML, or None with the reason."""

    def __init__(self) -> None:
        self.note: str | None = None
        self._nvml = None
        self._handles: list = []
        try:
            import pynvml  # provided by the nvidia-ml-py package
        except ImportError:
            self.note = ("GPU utilisation not measured: NVML bindings absent (pip install "
                         "nvidia-ml-py on a GPU machine); hang detection uses the log and "
                         "the processes only.")
            return
        try:
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.note = f"GPU utilisation not measured: NVML unusable here ({e}); no GPU?"

    def sample(self) -> list[int] | None:
        if self._nvml is None:
            return None
        try:
            return [int(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self._handles]
        except Exception as e:
            self.note = f"GPU utilisation read failed: {e}"
            return None


def health(url: str | None, timeout_s: float = 2.0) -> int | None:
    """HTTP status of GET URL/health; None when nothing answers."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError, TimeoutError):
        return None


class Watchdog:
    """Watches one `ServerHandle` (launch.py) from start-up to a final verdict."""

    def __init__(self, handle, *, silence_s: float = 120.0, poll_s: float = 1.0,
                 gpu_idle_pct: float = 5.0, dump_stacks: bool = True,
                 stop_on_failure: bool = True, gpu: GpuMonitor | None = None):
        self.handle = handle
        self.silence_s = float(silence_s)
        self.poll_s = float(poll_s)
        self.gpu_idle_pct = gpu_idle_pct
        self.dump_stacks = dump_stacks
        self.stop_on_failure = stop_on_failure
        self.follower = LogFollower(handle.log_path)
        self.gpu = gpu or GpuMonitor()
        self.t0 = time.monotonic()
        self.last_growth = self.t0
        self.events: list[dict[str, Any]] = [{"t_s": 0.0, "event": "process started",
                                              "pid": handle.pid}]
        self._seen_phases = 0
        self._healthy_once = False
        self.state: dict[str, Any] = {}

    @property
    def analyzer(self):
        return self.follower.analyzer

    def _event(self, event: str, **kw) -> None:
        self.events.append({"t_s": round(time.monotonic() - self.t0, 2), "event": event, **kw})

    def poll(self) -> dict[str, Any]:
        """Read new log lines and probe the server once; returns the current state."""
        rc = self.handle.proc.poll()  # first: an exited process has flushed its log
        now = time.monotonic()
        if self.follower.poll():
            self.last_growth = now
        a = self.analyzer
        for p in a.phases[self._seen_phases:]:
            self._event(f"phase {p['phase']}", log_time=p["time"], line=p["line"])
        self._seen_phases = len(a.phases)
        members = process.group_members(self.handle.pgid) if rc is None else []
        status = health(self.handle.url) if rc is None else None
        if status == 200 and not self._healthy_once:
            self._healthy_once = True
            self._event("health 200")
        gpu = self.gpu.sample()
        quiet = now - self.last_growth
        if a.crash is not None:
            verdict, reason = "crashed", a.crash["error"] or a.crash["marker"]
        elif a.shutdown is not None:
            verdict = "exited"
            reason = (f"the log says the server shut down (line {a.shutdown['line']}: "
                      f"{a.shutdown['marker'][:120]})" + (
                          "" if rc is not None else "; its processes are still exiting"))
        elif rc is not None:
            stopped = self.handle.stop_report is not None
            verdict = "exited" if rc == 0 or stopped else "crashed"
            reason = f"process exited with code {rc}" + (" (stopped)" if stopped else "")
        elif a.ready or status == 200:
            verdict, reason = "ready", "log says ready" if a.ready else "/health answers 200"
        elif quiet > self.silence_s and (gpu is None or max(gpu, default=0) < self.gpu_idle_pct):
            verdict = "hung"
            reason = (f"no new log line for {quiet:.0f} s (silence window "
                      f"{self.silence_s:.0f} s)" + ("" if gpu is None else
                                                     f", GPU utilisation {gpu}%"))
        else:
            verdict, reason = "starting", None
        self.state = {
            "verdict": verdict, "reason": reason, "phase": a.phase,
            "elapsed_s": round(now - self.t0, 2), "silence_s": round(quiet, 2),
            "returncode": rc, "health": status, "gpu_utilisation": gpu,
            "gpu_note": self.gpu.note, "processes": process.describe(members),
            "phases": a.phases, "warnings": a.warnings.items(), "events": self.events,
        }
        return self.state

    def wait(self, timeout_s: float = 600.0,
             on_change: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll until a final verdict (or timeout_s: verdict stays `starting`, with a
        note); act on it (stacks + stop on hung, stop on crashed); return the state."""
        deadline = time.monotonic() + timeout_s
        shown = (None, None)
        while True:
            st = self.poll()
            key = (st["verdict"], st["phase"])
            if on_change and key != shown:
                on_change(st)
            shown = key
            if st["verdict"] in FINAL:
                break
            if time.monotonic() >= deadline:
                st["reason"] = (f"still starting after {timeout_s:.0f} s (phase "
                                f"{st['phase']!r}); the log is still growing, so not hung")
                break
            time.sleep(self.poll_s)
        self._event(f"verdict {st['verdict']}", reason=st["reason"])
        if st["verdict"] == "hung":
            cause, fix = hang_cause(st["phase"])
            st["causes"] = [{"cause": cause, "fix": fix}]
            if self.dump_stacks:
                members = process.group_members(self.handle.pgid)
                st["stacks"] = process.dump_stacks(
                    members, self.handle.run_dir / f"stacks-{self.handle.name}",
                    log_path=self.handle.log_path, faulthandler_ok=self.handle.faulthandler_ok)
                self._event("stacks dumped", method=st["stacks"]["method"],
                            files=len(st["stacks"]["files"]))
        shutting_down = st["verdict"] == "exited" and st["returncode"] is None
        if (st["verdict"] in ("hung", "crashed") or shutting_down) and self.stop_on_failure:
            st["stop"] = self.handle.stop()
            self._event("process group stopped", signals=st["stop"]["signals"])
        st["findings"] = self.analyzer.report(silence_s=self.silence_s)["findings"]
        st["events"] = self.events
        atomic_write_json(self.handle.run_dir / f"{self.handle.name}.watch.json", st)
        return st


def print_progress(state: dict[str, Any]) -> None:
    """A one-line progress printer for `Watchdog.wait(on_change=...)`."""
    extra = f" ({state['reason']})" if state.get("reason") else ""
    arm = f"[{state['arm']}] " if state.get("arm") else ""
    print(f"{arm}[{state['elapsed_s']:7.1f} s] {state['verdict']:<8} phase: "
          f"{state['phase'] or '-'}{extra}", flush=True)
