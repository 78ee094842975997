"""vLLM log lines -> timestamps, start-up phases, crash markers, shutdown lines, decode
statistics and the facts a speculative start proves (version, drafter, aux layers), in
the shapes `analyzer.LogAnalyzer` uses for SGLang's, so one analyzer (and `eagle3lab logs`)
reads both engines with the same verdicts and findings.

Prevents a vLLM server read as "no decode lines, no phases", a stopped server read as
still "ready", and a speculative start taken on trust: its log has another stamp, other
start-up messages, prints acceptance as a separate `SpecDecoding metrics` line every stats
interval (~10 s, reset after each print) instead of in a batch line, and says which aux
layers of the target it captures for the EAGLE-3 drafter.

Formats, checked against the source of vLLM 0.25.1 (the wheel's .py files; older formats
still read where noted):
- stamp: vllm/logger.py:22-26 `_FORMAT = VLLM_LOGGING_PREFIX + "%(levelname)s
  %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"`, `_DATE_FORMAT = "%m-%d %H:%M:%S"`:
  no year, no milliseconds (a `datefmt` drops logging's `,mmm`; a fraction is still
  read). `fileinfo` is the file name, or with VLLM_LOGGING_LEVEL=DEBUG a shortened path
  such as `v1/engine/core.py` or `model_executor/.../utils/fp8_utils.py`
  (vllm/logging_utils/formatter.py:58-69); older releases: `%(filename)s:%(lineno)d]`
  without the `[`. A multi-line message repeats the stamp on every line, each ended by
  `\\r\\n` (formatter.py:71-75). Each process's stdout/stderr lines start with `(NAME
  pid=N) ` (vllm/utils/system_utils.py:201-234 `_add_prefix`, via `decorate_logs`):
  `APIServer` (vllm/entrypoints/openai/api_server.py:688), `EngineCore` or
  `EngineCore_DP{n}` (vllm/v1/engine/core.py:1166-1173), `Worker` or `Worker_TP{n}`...
  (vllm/v1/executor/multiproc_executor.py:1016-1044); uvicorn's own lines keep uvicorn's
  format under that prefix (`(APIServer pid=N) INFO:     Application startup
  complete.`), as do tqdm bars (`Capturing CUDA graphs (...)`, `\\r`-separated updates).
- version and model: vllm/entrypoints/serve/utils/api_utils.py:317-339
  `log_version_and_model` (called at api_server.py:558): a block-letter logo whose lines
  end in `version %s` and `model   %s` under vLLM's formatter, else `vLLM server version
  %s, serving model %s` (older: `vLLM API server version %s`); v1/engine/core.py:114-118
  `Initializing a V1 LLM engine (v%s) with config: %s`, the config's `__str__`
  (vllm/config/vllm.py:2005-2008) holding `speculative_config=SpeculativeConfig(method=
  'eagle3', model='DRAFT', num_spec_tokens=N)` (vllm/config/speculative.py:1262-1276).
- start-up: api_utils.py:271-273 (`non-default args: %s`),
  vllm/distributed/parallel_state.py:1564,1608 (`world_size=%d rank=%d ...`),
  vllm/v1/worker/gpu_worker.py:360 (`Using V2 Model Runner`: 0.25.1 picks the V2 runner
  for dense targets with method eagle3, vllm/config/vllm.py:519-555,2068-2094),
  vllm/v1/worker/gpu_model_runner.py:5209-5213 (V1: `Starting to load model %s...`),
  vllm/v1/worker/gpu/model_runner.py:281 (V2: `Loading model from scratch...`),
  vllm/model_executor/model_loader/default_loader.py:430-433 (`Loading weights took %.2f
  seconds`, once per model: target, then drafter), gpu_model_runner.py:5306-5309 /
  gpu/model_runner.py:302-306 (`Model loading took %s GiB [memory ]and %.6f seconds`),
  vllm/compilation/backends.py:1149 (`Dynamo bytecode transform time: %.2f s`),
  vllm/compilation/monitor.py:20,82 (`torch.compile took %.2f s in total`, older `torch.
  compile takes`; `Initial profiling/warmup run took %.2f s`), gpu_worker.py:538-541
  (`Available KV cache memory: %s GiB`), vllm/v1/core/kv_cache_utils.py:2146 (`GPU KV
  cache size: %s tokens`), gpu_model_runner.py:6766-6772 (tqdm `Capturing CUDA graphs
  (...)`), gpu_model_runner.py:6707-6711 / gpu/model_runner.py:722-726 (`Graph capturing
  finished in %.0f secs, took %.2f GiB`), core.py:326-347 (`init engine (profile, create
  kv cache, warmup model) took %.2f s`; older `... seconds`), api_server.py:612,616
  (`Supported tasks: %s`, `Starting vLLM server on %s`; older `Starting vLLM API server
  %d on %s`), vllm/entrypoints/launcher.py:37 (`Available routes are:`), uvicorn
  (`Started server process [N]`, `Application startup complete.`: vLLM is ready then).
- the drafter: gpu_model_runner.py:5233 (V1: `Loading drafter model...`),
  vllm/v1/spec_decode/llm_base_proposer.py:1438-1536 (V1: `Detected EAGLE model ...`
  sharing the target's embedding / lm_head), the aux layers the target captures for
  EAGLE-3 (vLLM ids: id k = the input of decoder layer k): V2
  vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:28,31 `Using Eagle3 auxiliary
  layers from config: %s` / `... from model: %s`; V1 gpu_model_runner.py:5396-5397 `Using
  auxiliary layers from speculative config: %s` (V1 logs nothing when the target's
  default, (2, L // 2, L - 3) from vllm/model_executor/models/interfaces.py:1408-1430, is
  used); V2 vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py:90 (`Capturing
  model for speculator...`).
- decode: vllm/v1/metrics/loggers.py:219-283 `LoggingStatLogger.log`: `Engine %03d: Avg
  prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d
  reqs, Waiting: %d reqs[, Deferred: %d reqs][, Preemptions: %d], GPU KV cache usage:
  %.1f%%, Prefix cache hit rate: %.1f%%[, ...]` (prefix loggers.py:160-161; with DP the
  aggregated logger's `%d Engines Aggregated: `, loggers.py:309-310; older: no prefix;
  printed at DEBUG when the engine is idle, loggers.py:223), every VLLM_LOG_STATS_INTERVAL
  (10 s, vllm/envs.py:47), then vllm/v1/spec_decode/metrics.py:107-137
  `SpecDecodingLogging.log`: `SpecDecoding metrics: Mean acceptance length: %.2f,
  Accepted throughput: %.2f tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d
  tokens, Drafted: %d tokens, Per-position acceptance rate: %s, Avg Draft acceptance rate:
  %.1f%%` (rates `%.3f` joined by ", "; `nan` when nothing was drafted).
- fatal: core.py:1231,1233 (`EngineCore failed to start.`, `EngineCore encountered a
  fatal error.`), vllm/v1/engine/utils.py:1272-1276 (`Engine core initialization failed.
  See root cause above. ...`), vllm/v1/engine/exceptions.py:9 (`EngineDeadError`),
  vllm/v1/engine/async_llm.py:704 (`AsyncLLM output_handler failed.`),
  vllm/v1/engine/core_client.py:702-704 (`[shutdown] MPClient: engine core exited
  unexpectedly; starting cleanup`), multiproc_executor.py:284-286,737,898,904,1004
  (`Worker proc %s died unexpectedly, ...`, `WorkerProc initialization failed ...`,
  `WorkerProc failed to start.`, `WorkerProc failed.`, `WorkerProc hit an exception.`).
- shutdown (0.25.1 tags these lines `[shutdown] `): launcher.py:100,116,125,128,149
  (`[shutdown] API server: shutdown triggered`, `... stopping engine client mode=%s
  timeout=%ss`, `... engine client stopped`, `... signalling HTTP server shutdown`, `...
  shutting down FastAPI HTTP server`; older: `Shutting down FastAPI HTTP server.`),
  core.py:1214-1217,1227,1333-1336,1364-1367 (`[shutdown] EngineCore: trigger received
  signal=%s`, `... exiting busy loop`, `... start mode=%s timeout=%ds`, `... request
  processing complete; starting resource teardown`), core_client.py:655-662 (`[shutdown]
  MPClient: start timeout=%s` ... `complete`), multiproc_executor.py:427,433
  (`[shutdown] Executor: ...`); uvicorn's (`Shutting down`, `Waiting for application
  shutdown.`, `Application shutdown complete.`, `Finished server process [N]`) are in
  `SHUTDOWN` of analyzer.py, shared with SGLang.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

_LEVELS = r"DEBUG|INFO|WARNING|ERROR|CRITICAL"
#: vLLM's process prefixes, `(NAME pid=N) ` (none or several).
PROC_PREFIX = r"(?:\([\w.-]+ pid=\d+\) ?)*"
_STAMP = re.compile(
    rf"^(?P<prefix>{PROC_PREFIX})(?P<level>{_LEVELS}) "
    r"(?P<md>\d{2}-\d{2}) (?P<clock>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,6}))? "
    r"\[?(?P<file>[\w./-]+):(?P<lineno>\d+)\] ?(?P<msg>.*)$")
#: An unstamped line under vLLM's process prefix and/or in uvicorn's default format
#: (`LEVEL:` padded to 9 columns, then the message).
_UNSTAMPED = re.compile(rf"^(?P<prefix>{PROC_PREFIX})(?:(?P<level>{_LEVELS}):\s+)?(?P<msg>.*)$")
_PROC = re.compile(r"\(([\w.-]+) pid=\d+\)")

#: (phase, pattern) for vLLM; the phase names are SGLang's where the step is the same,
#: so the hang causes of `warnings.HANG_CAUSES` apply.
PHASES: list[tuple[str, re.Pattern]] = [
    ("launch", re.compile(r"^vLLM (?:API )?server version|\u2588\s+version \S+\s*$|"
                          r"^non-default args:|^Initializing a V1 LLM engine")),
    ("init-distributed", re.compile(r"^world_size=\d+ rank=\d+")),
    ("load-weights", re.compile(r"^Starting to load model|^Loading model from scratch|"
                                r"^Loading drafter model")),
    ("weights-loaded", re.compile(r"^Model loading took")),
    ("cuda-graph-capture", re.compile(r"^Dynamo bytecode transform time|^torch\.compile "
                                      r"t(?:akes|ook)|^Capturing CUDA graph")),
    ("kv-cache", re.compile(r"^GPU KV cache size:|^Available KV cache memory")),
    ("cuda-graph-captured", re.compile(r"^Graph capturing finished|^init engine \(profile")),
    ("http-server", re.compile(r"^Starting vLLM (?:API )?server|^Available routes are|"
                               r"Started server process")),
    ("ready", re.compile(r"Application startup complete")),
]

#: The fatal lines (see "fatal" above; RayWorkerProc: vllm/v1/executor/ray_executor_v2.py:
#: 213,515).
CRASH = re.compile("|".join((
    "EngineCore failed to start", "EngineCore encountered a fatal error",
    "Engine core initialization failed", "EngineDeadError", "AsyncLLM output_handler failed",
    "engine core exited unexpectedly", r"Worker proc \S+ died unexpectedly",
    "WorkerProc initialization failed", "WorkerProc failed", "WorkerProc hit an exception",
    "RayWorkerProc failed", r"RayWorkerProc rank=\S+ died unexpectedly")))

#: vLLM's own shutdown lines (uvicorn's are in analyzer.SHUTDOWN); a crash line that carries
#: the `[shutdown]` tag (the engine core died) is matched by CRASH first.
SHUTDOWN = re.compile(r"^\[shutdown\] |^Shutting down FastAPI HTTP server")

_STATS = re.compile(r"^(?:Engine (?P<engine>\d+): |\d+ Engines Aggregated: )?Avg prompt "
                    r"throughput: (?P<prompt>[0-9.]+) tokens/s, Avg generation throughput: "
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

_INTS = re.compile(r"-?\d+")
#: (fact, pattern): what a start proves, read from the lines above; the value is the
#: first named group that matched (`speculative_config`, `aux_layers`: see parse_facts).
FACTS: list[tuple[str, re.Pattern]] = [
    ("version", re.compile(r"^vLLM (?:API )?server version (?P<v>[^\s,]+)|"
                           r"\u2588\s+version (?P<v2>\S+)\s*$|"
                           r"^Initializing a V1 LLM engine \(v(?P<v3>[^)\s]+)\)")),
    ("served_model", re.compile(r"^vLLM server version \S+, serving model (?P<v>\S+)|"
                                r"\u2588\s+model\s+(?P<v2>\S+)\s*$")),
    ("model_runner", re.compile(r"^Using (?P<v>V2) Model Runner")),
    ("listen", re.compile(r"^Starting vLLM (?:API )?server (?:\d+ )?on (?P<v>\S+)")),
    ("speculative_config", re.compile(
        r"speculative_config=SpeculativeConfig\(method='(?P<method>[^']*)', "
        r"model=(?:'(?P<model>[^']*)'|None), num_spec_tokens=(?P<n>\d+|None)\)")),
    ("aux_layers", re.compile(r"^Using (?:Eagle3 )?auxiliary layers from (?P<src>speculative "
                              r"config|config|model): (?P<v>[(\[][-\d,\s]*[)\]])")),
]
#: After the drafter's load began: both models' weights are in (V2 runner:
#: vllm/v1/worker/gpu/model_runner.py:302; V1: gpu_model_runner.py, after the drafter).
MODEL_LOADED = re.compile(r"^Model loading took")
#: Lines where the drafter's load begins (the aux-layer line comes before its weights).
DRAFTER_BEGINS = re.compile(r"^Loading drafter model|^Detected EAGLE model|"
                            r"^Capturing model for speculator|^Using (?:Eagle3 )?auxiliary "
                            r"layers from")


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


def parse_unstamped(line: str) -> tuple[tuple[str, ...], str] | None:
    """(process tags + uvicorn level, message) of an unstamped line that carries vLLM's
    process prefix or uvicorn's `LEVEL:` column; None for any other line."""
    m = _UNSTAMPED.match(line)
    if not m or not (m["prefix"] or m["level"]):
        return None
    tags = tuple(_PROC.findall(m["prefix"])) + ((m["level"],) if m["level"] else ())
    return tags, m["msg"]


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


def parse_facts(message: str) -> dict[str, Any]:
    """The facts one message states: version, served_model, model_runner ("V2"), listen,
    speculative_config ({method, model, num_spec_tokens}), aux_layers ({ids, source:
    "config" | "model"}); empty for other messages."""
    out: dict[str, Any] = {}
    for name, rx in FACTS:
        m = rx.search(message)
        if not m:
            continue
        if name == "speculative_config":
            n = m["n"]
            out[name] = {"method": m["method"], "model": m["model"],
                         "num_spec_tokens": int(n) if n.isdigit() else None}
        elif name == "aux_layers":
            out[name] = {"ids": [int(x) for x in _INTS.findall(m["v"])],
                         "source": "model" if m["src"] == "model" else "config"}
        else:
            out[name] = next(v for k, v in m.groupdict().items() if v is not None)
    return out
