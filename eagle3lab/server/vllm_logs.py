"""vLLM log lines -> timestamps, start-up phases, crash markers and decode statistics, in
the shapes `logs.LogAnalyzer` uses for SGLang's, so one analyzer (and `eagle3lab logs`)
reads both engines with the same verdicts and findings.

Prevents a vLLM server read as "no decode lines, no phases": its log has another stamp,
other start-up messages, and prints acceptance as a separate `SpecDecoding metrics` line
every stats interval (~10 s, reset after each print) instead of in a batch line.

Formats, from vLLM's source (vllm-project/vllm):
- stamp: vllm/logger.py `_FORMAT = "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]
  %(message)s"`, `_DATE_FORMAT = "%m-%d %H:%M:%S"` (no year; older releases: `...
  %(filename)s:%(lineno)d] %(message)s` without the `[`); v0.10+ prefixes each process's
  lines with `(APIServer pid=N) ` / `(EngineCore_DP0 pid=N) ` (vllm/utils
  `decorate_logs`), Ray workers add `(RayWorkerWrapper pid=N) `.
- decode: vllm/v1/metrics/loggers.py `LoggingStatLogger.log`: `Engine %03d: Avg prompt
  throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs,
  Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%` (older:
  without `Engine %03d: `; newer: `Preemptions: %d` may sit before the KV usage), then
  vllm/v1/spec_decode/metrics.py `SpecDecodingLogging.log`: `SpecDecoding metrics: Mean
  acceptance length: %.2f, Accepted throughput: %.2f tokens/s, Drafted throughput: %.2f
  tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: %s,
  Avg Draft acceptance rate: %.1f%%` (rates `%.3f` joined by ", ").
- start-up: vllm/entrypoints/openai/api_server.py (`vLLM API server version`, `non-default
  args`, `Starting vLLM API server %d on %s`), vllm/v1/worker/gpu_model_runner.py
  (`Starting to load model`, `Model loading took %.4f GiB and %.6f seconds`, `Graph
  capturing finished in %.0f secs, took %.2f GiB`), vllm/compilation/backends.py +
  monitor.py (`Dynamo bytecode transform time`, `torch.compile takes %.2f s in total`),
  vllm/v1/core/kv_cache_utils.py (`GPU KV cache size: %s tokens`), vllm/v1/engine/core.py
  (`init engine (profile, create kv cache, warmup model) took %.2f seconds`, `EngineCore
  failed to start.`), uvicorn (`Application startup complete.`: vLLM is ready then).
- fatal: vllm/v1/engine/core.py / core_client.py (`EngineCore failed to start`, `Engine
  core initialization failed`), vllm/v1/engine/exceptions.py (`EngineDeadError`),
  vllm/v1/engine/async_llm.py (`AsyncLLM output_handler failed`).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

_STAMP = re.compile(
    r"^(?P<prefix>(?:\([\w.-]+ pid=\d+\) ?)*)(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<md>\d{2}-\d{2}) (?P<clock>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,6}))? "
    r"\[?(?P<file>[\w.-]+):(?P<lineno>\d+)\] ?(?P<msg>.*)$")
_PROC = re.compile(r"\(([\w.-]+) pid=\d+\)")

#: (phase, pattern) for vLLM; the phase names are SGLang's where the step is the same,
#: so the hang causes of `warnings.HANG_CAUSES` apply.
PHASES: list[tuple[str, re.Pattern]] = [
    ("launch", re.compile(r"^vLLM API server version|^non-default args:")),
    ("init-distributed", re.compile(r"^world_size=\d+ rank=\d+")),
    ("load-weights", re.compile(r"^Starting to load model")),
    ("weights-loaded", re.compile(r"^Model loading took")),
    ("cuda-graph-capture", re.compile(r"^Dynamo bytecode transform time|^torch\.compile "
                                      r"takes|^Capturing CUDA graph")),
    ("kv-cache", re.compile(r"^GPU KV cache size:|^Available KV cache memory")),
    ("cuda-graph-captured", re.compile(r"^Graph capturing finished|^init engine \(profile")),
    ("http-server", re.compile(r"^Starting vLLM API server")),
    ("ready", re.compile(r"Application startup complete")),
]

CRASH = re.compile(r"EngineCore failed to start|Engine core initialization failed|"
                   r"EngineDeadError|AsyncLLM output_handler failed")

_STATS = re.compile(r"^(?:Engine (?P<engine>\d+): )?Avg prompt throughput: "
                    r"(?P<prompt>[0-9.]+) tokens/s, Avg generation throughput: "
                    r"(?P<gen>[0-9.]+) tokens/s, Running: (?P<running>\d+) reqs, "
                    r"Waiting: (?P<waiting>\d+) reqs")
_KV = re.compile(r"GPU KV cache usage: ([0-9.]+)%")
_SPEC = re.compile(r"^SpecDecoding metrics: (?:Draft acceptance rate: [0-9.nan]+%?, )?"
                   r"Mean acceptance length: (?P<mean>[0-9.]+|nan)")
_SPEC_FIELDS = {
    "accepted": re.compile(r"Accepted: (\d+) tokens"),
    "drafted": re.compile(r"Drafted: (\d+) tokens"),
    "rate_pct": re.compile(r"Avg Draft acceptance rate: ([0-9.]+|nan)%"),
}
_PER_POS = re.compile(r"Per-position acceptance rate: ((?:[0-9.]+|nan)(?:, (?:[0-9.]+|nan))*)")


def parse_stamp(line: str, *, year: int | None = None
                ) -> tuple[dt.datetime, tuple[str, ...], str] | None:
    """(time, process tags + level, message) of a vLLM-stamped line; None otherwise. vLLM's
    stamp has no year: `year` (default: this year, or last year for a date ahead of now)."""
    m = _STAMP.match(line)
    if not m:
        return None
    now = dt.datetime.now()
    frac = (m["frac"] or "0").ljust(6, "0")
    t = dt.datetime.strptime(f"{year or now.year}-{m['md']} {m['clock']}",
                             "%Y-%m-%d %H:%M:%S").replace(microsecond=int(frac))
    if year is None and t > now + dt.timedelta(days=1):
        t = t.replace(year=now.year - 1)
    tags = tuple(_PROC.findall(m["prefix"])) + (m["level"],)
    return t, tags, m["msg"]


def parse_stats(message: str) -> dict[str, Any] | None:
    """The fields of an `Avg prompt throughput ...` line as a decode row (SGLang's keys:
    running_req, queue_req, gen_throughput, token_usage); None for other messages."""
    m = _STATS.match(message)
    if not m:
        return None
    kv = _KV.search(message)
    return {"running_req": int(m["running"]), "token": None,
            "token_usage": float(kv.group(1)) / 100 if kv else None, "accept_len": None,
            "accept_rate": None, "gen_throughput": float(m["gen"]),
            "queue_req": int(m["waiting"]), "graph": None, "per_position": None,
            "prompt_throughput": float(m["prompt"])}


def parse_spec(message: str) -> dict[str, Any] | None:
    """accept_len (incl. the bonus token), accept_rate (0-1), per_position (vLLM's
    per-position rates: accepted at position j / drafts) of a `SpecDecoding metrics`
    line; None for other messages."""
    m = _SPEC.match(message)
    if not m:
        return None
    out: dict[str, Any] = {"accept_len": float(m["mean"])}
    for name, rx in _SPEC_FIELDS.items():
        f = rx.search(message)
        out[name] = (float(f.group(1)) if name == "rate_pct" else int(f.group(1))) if f \
            else None
    out["accept_rate"] = out.pop("rate_pct") / 100 if out.get("rate_pct") is not None \
        else None
    pp = _PER_POS.search(message)
    out["per_position"] = [float(x) for x in pp.group(1).split(", ")] if pp else None
    return out
