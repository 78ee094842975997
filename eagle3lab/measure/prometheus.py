"""Speculative-decoding acceptance from a serving engine's Prometheus `/metrics`: the
exposition the reference server writes, a scraper, and acceptance over any window.

Prevents two misreadings of a live server. (1) Reading acceptance only from log lines
(printed every ~10 s, reset after each print) or from per-request fields (absent on the
OpenAI routes): vLLM's counters give accept length AND acceptance per draft position over
any window, as differences of two scrapes. (2) Quoting a counter since boot as the
number of one run: every number here is a difference `after - before`, never a raw total.

The metric names are the engines' own:
- vLLM, checked against 0.25.1: vllm/v1/spec_decode/metrics.py:228-264 `SpecDecodingProm`:
  Counters `vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
  `vllm:spec_decode_num_accepted_tokens`, and `vllm:spec_decode_num_accepted_tokens_per_pos`
  with the extra label `position` ("0".. "k-1"), each labelled `model_name` (the served
  model name) and `engine` ("0", one per engine core) (vllm/v1/metrics/loggers.py:431-436);
  absent without a speculative config (metrics.py:211-213). prometheus_client writes a
  Counter's sample as NAME_total (plus NAME_created); /metrics is prometheus_client's own
  text exposition (vllm/entrypoints/serve/instrumentator/metrics.py:78 `make_asgi_app`).
  Per verify step of a request: drafts += 1, draft_tokens += drafted, accepted += n,
  per_pos[i] += 1 for i < n (`SpecDecodingStats.observe_draft`, metrics.py:41-49); its
  docstring (metrics.py:177-196) defines accept length = 1 + accepted / drafts and the
  per-position rate = per_pos / drafts. Throughput and load, loggers.py: Gauges
  `vllm:num_requests_running`, `vllm:num_requests_waiting` (455-474),
  `vllm:kv_cache_usage_perc` (524-531, 0-1; not read here); Counters `vllm:prompt_tokens` (633-640),
  `vllm:generation_tokens` (667-674) and `vllm:request_success` with label
  `finished_reason` = stop | length | abort | error | repetition (676-688;
  vllm/v1/engine/__init__.py:30,42-64), incremented per engine step / finished request
  (loggers.py:1157-1186). With several API servers vLLM reads them through
  prometheus_client's multiprocess collector (vllm/v1/metrics/prometheus.py:40-49): the
  same names, no _created samples.
- SGLang 0.5.23 (python/sglang/srt/observability/metrics_collector.py): Gauges
  `sglang:spec_accept_length` (accepted drafts + bonus per verify, over the last logged
  batch), `sglang:spec_accept_rate`, `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
  `sglang:gen_throughput`; Counters `sglang:spec_verify_calls` and
  `sglang:generation_tokens` (label `is_streaming`). SGLang exposes no per-position counter:
  there, per-position acceptance is `unavailable` and only the gauges are reported.

vLLM position j (0-based) = our draft position k = j + 1; per_pos[j] / drafts is the
cumulative acceptance P(k) of `tables.per_position` (steps that accepted at least k).
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from typing import Any

from eagle3lab.errors import UserError
from eagle3lab.specdec.stats import decode_accept_length

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
VLLM_GEN_TOKENS, VLLM_PROMPT_TOKENS = "vllm:generation_tokens", "vllm:prompt_tokens"
VLLM_REQUESTS = "vllm:request_success"  # label finished_reason
VLLM_RUNNING, VLLM_WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
#: vLLM's finish reasons, the values of `finished_reason` (vllm/v1/engine/__init__.py:30).
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
SGLANG_ACCEPT_LENGTH, SGLANG_ACCEPT_RATE = "sglang:spec_accept_length", "sglang:spec_accept_rate"
SGLANG_RUNNING, SGLANG_QUEUE = "sglang:num_running_reqs", "sglang:num_queue_reqs"
SGLANG_GEN_THROUGHPUT = "sglang:gen_throughput"
SGLANG_VERIFY_CALLS, SGLANG_GEN_TOKENS = "sglang:spec_verify_calls", "sglang:generation_tokens"


class ReferenceMetrics:
    """The reference server's `/metrics`: vLLM's spec-decode counters and SGLang's gauges,
    in a registry of its own (prometheus_client writes the text format)."""

    def __init__(self, *, model_name: str, num_spec_tokens: int):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.num_spec_tokens, self.model_name = num_spec_tokens, model_name
        vl = {"model_name": model_name, "engine": "0"}
        sl = {"model_name": model_name}

        def counter(name, doc, labels, extra=()):
            return Counter(name, doc, list(labels) + list(extra), registry=self.registry)

        def gauge(name, doc, labels):
            return Gauge(name, doc, list(labels), registry=self.registry).labels(**labels)

        self.gen_tokens = counter(VLLM_GEN_TOKENS, "Number of generation tokens processed.",
                                  vl).labels(**vl)
        self.prompt_tokens = counter(VLLM_PROMPT_TOKENS, "Number of prefill tokens "
                                     "processed.", vl).labels(**vl)
        self.requests = counter(VLLM_REQUESTS, "Count of successfully processed requests.",
                                vl, ["finished_reason"])
        for reason in FINISH_REASONS:  # as vLLM: every reason exposed from boot, at 0
            self.requests.labels(**vl, finished_reason=reason)
        self.running = gauge(VLLM_RUNNING, "Number of requests in model execution batches.", vl)
        self.waiting = gauge(VLLM_WAITING, "Number of requests waiting to be processed.", vl)
        self.s_running = gauge(SGLANG_RUNNING, "The number of running requests.", sl)
        self.s_queue = gauge(SGLANG_QUEUE, "The number of requests in the waiting queue.", sl)
        self.s_throughput = gauge(SGLANG_GEN_THROUGHPUT, "The generation throughput "
                                  "(token/s).", sl)
        self.s_gen_tokens = counter(SGLANG_GEN_TOKENS, "Number of generation tokens "
                                    "processed.", sl, ["is_streaming"])
        self.spec = num_spec_tokens > 0
        if not self.spec:  # as vLLM: no spec-decode metrics without a speculative config
            return
        self.drafts = counter(VLLM_DRAFTS, "Number of spec decoding drafts.", vl).labels(**vl)
        self.draft_tokens = counter(VLLM_DRAFT_TOKENS, "Number of draft tokens.",
                                    vl).labels(**vl)
        self.accepted = counter(VLLM_ACCEPTED, "Number of accepted tokens.", vl).labels(**vl)
        per_pos = counter(VLLM_PER_POS, "Accepted tokens per draft position.", vl,
                          ["position"])
        self.per_pos = [per_pos.labels(**vl, position=str(j)) for j in range(num_spec_tokens)]
        self.s_accept_length = gauge(SGLANG_ACCEPT_LENGTH, "Mean acceptance length of "
                                     "speculative decoding (accepted drafts + bonus token "
                                     "per forward).", sl)
        self.s_accept_rate = gauge(SGLANG_ACCEPT_RATE, "Speculative acceptance rate "
                                   "(`accepted drafts / proposed drafts` in batch).", sl)
        self.s_verify = counter(SGLANG_VERIFY_CALLS, "Number of speculative decoding "
                                "verification calls.", sl).labels(**sl)

    def observe_tokens(self, n: int, *, streaming: bool) -> None:
        """n generated tokens (both engines' token counters)."""
        self.gen_tokens.inc(n)
        self.s_gen_tokens.labels(model_name=self.model_name,
                                 is_streaming=str(streaming).lower()).inc(n)

    def observe_request(self, *, prompt_tokens: int, finish_reason: str) -> None:
        """A finished request: its prompt tokens and finish reason (vLLM's
        `vllm:prompt_tokens` and `vllm:request_success`)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.requests.labels(model_name=self.model_name, engine="0",
                             finished_reason=finish_reason).inc()

    def observe_draft(self, accepted: int) -> None:
        """One verify step of a chain of `num_spec_tokens` drafts that accepted `accepted`
        (vLLM's `SpecDecodingStats.observe_draft`)."""
        if not self.spec:
            return
        self.drafts.inc()
        self.draft_tokens.inc(self.num_spec_tokens)
        self.accepted.inc(accepted)
        self.s_verify.inc()
        for j in range(min(accepted, self.num_spec_tokens)):
            self.per_pos[j].inc()

    def set_batch(self, *, running: int, waiting: int, accept_length: float | None = None,
                  accept_rate: float | None = None, throughput: float | None = None) -> None:
        """The gauges, as the engines set them after a scheduler step / logged batch."""
        for g, v in ((self.running, running), (self.s_running, running),
                     (self.waiting, waiting), (self.s_queue, waiting)):
            g.set(v)
        if throughput is not None:
            self.s_throughput.set(throughput)
        if self.spec and accept_length is not None:
            self.s_accept_length.set(accept_length)
            self.s_accept_rate.set(accept_rate or 0.0)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def parse_metrics(text: str) -> dict[str, Any]:
    """Prometheus text -> {"counters": {(sample name, position|None): value summed over
    the other labels (engines, ranks, models)}, "gauges": {name: value summed}}, parsed
    with prometheus_client's own text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    counters: dict[tuple[str, str | None], float] = {}
    gauges: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            if fam.type == "counter" or s.name.endswith("_total"):
                name = s.name[:-len("_total")] if s.name.endswith("_total") else s.name
                key = (name, s.labels.get("position"))
                counters[key] = counters.get(key, 0.0) + s.value
            elif fam.type in ("gauge", "untyped", "unknown"):
                gauges[s.name] = gauges.get(s.name, 0.0) + s.value
    return {"counters": counters, "gauges": gauges}


def scrape_text(url: str, *, timeout_s: float = 10.0) -> str:
    """GET URL/metrics as the engine wrote it (UserError when it does not answer)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as r:
            return r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise UserError(f"{url}/metrics answered HTTP {e.code}. SGLang exposes it only with "
                        f"--enable-metrics; vLLM always does.") from None
    except (urllib.error.URLError, OSError) as e:
        raise UserError(f"Cannot reach {url}/metrics: {e}. Is the server up?") from None


def scrape(url: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """GET URL/metrics -> `parse_metrics` plus the time `t` (monotonic seconds)."""
    text = scrape_text(url, timeout_s=timeout_s)
    return {"t": time.monotonic(), **parse_metrics(text)}


def window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Acceptance between two scrapes. `source` says which engine's metrics carried it:
    `vllm` (counters: accept length and per-position acceptance over the window, the
    accepted counts per position beside the rates), `sglang` (gauges: the last logged
    batch's accept length and rate; no per-position), or None. `requests` (finished, any
    reason) and `prompt_tokens` are vLLM's counters over the window (None elsewhere)."""
    ca, cb = after["counters"], before["counters"]

    def delta(name, pos=None):
        return ca.get((name, pos), 0.0) - cb.get((name, pos), 0.0)

    seconds = after.get("t", 0.0) - before.get("t", 0.0)
    tokens = delta(VLLM_GEN_TOKENS) or delta(SGLANG_GEN_TOKENS)
    vllm_load = (VLLM_REQUESTS, None) in ca
    out: dict[str, Any] = {"seconds": seconds, "generation_tokens": tokens,
                           "tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
                           "requests": delta(VLLM_REQUESTS) if vllm_load else None,
                           "prompt_tokens": delta(VLLM_PROMPT_TOKENS) if vllm_load else None,
                           "source": None, "drafts": None, "draft_tokens": None,
                           "accepted": None, "accept_length": math.nan,
                           "acceptance_rate": math.nan, "per_position": [],
                           "per_position_accepted": [],
                           "sglang_accept_length": after["gauges"].get(SGLANG_ACCEPT_LENGTH),
                           "sglang_accept_rate": after["gauges"].get(SGLANG_ACCEPT_RATE)}
    if (VLLM_DRAFTS, None) in ca:
        drafts, drafted, acc = delta(VLLM_DRAFTS), delta(VLLM_DRAFT_TOKENS), delta(VLLM_ACCEPTED)
        positions = sorted(int(p) for (n, p) in ca if n == VLLM_PER_POS and p is not None)
        per_pos = [delta(VLLM_PER_POS, str(j)) for j in positions]
        out.update(source="vllm", drafts=drafts, draft_tokens=drafted, accepted=acc,
                   accept_length=decode_accept_length(acc, drafts),
                   acceptance_rate=acc / drafted if drafted else math.nan,
                   per_position=[n / drafts if drafts else math.nan for n in per_pos],
                   per_position_accepted=per_pos)
    elif out["sglang_accept_length"] is not None:
        out.update(source="sglang", accept_length=out["sglang_accept_length"],
                   acceptance_rate=out["sglang_accept_rate"])
    return out


def positions_frame(windows: list[dict[str, Any]], *, label: str = "live"):
    """Windows -> one row per window and draft position k (1-based, as `tables`): the
    cumulative acceptance P(k) over that window, its end time and accept length."""
    import pandas as pd

    rows = []
    t0 = None
    for i, w in enumerate(windows):
        t0 = w.get("t_end", 0.0) if t0 is None else t0
        for j, p in enumerate(w["per_position"]):
            rows.append({"label": label, "window": i, "t_s": w.get("t_end", 0.0) - t0,
                         "position": j + 1, "p_cumulative": p, "drafts": w["drafts"],
                         "accept_length": w["accept_length"]})
    return pd.DataFrame(rows, columns=["label", "window", "t_s", "position", "p_cumulative",
                                       "drafts", "accept_length"])


class MetricsPoller:
    """Scrapes URL/metrics every `interval_s` in a thread; `windows()` are the differences
    of consecutive scrapes that saw drafts (for acceptance over time)."""

    def __init__(self, url: str, *, interval_s: float = 1.0):
        import threading

        self.url, self.interval_s = url, interval_s
        self.snapshots: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            try:
                self.snapshots.append(scrape(self.url))
            except Exception as e:  # a scrape failing is recorded, the run goes on
                self.errors.append(str(e))
            if self._stop.wait(self.interval_s):
                break

    def __enter__(self) -> "MetricsPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        try:
            self.snapshots.append(scrape(self.url))  # the closing scrape
        except Exception as e:
            self.errors.append(str(e))

    def windows(self) -> list[dict[str, Any]]:
        out = []
        for a, b in zip(self.snapshots, self.snapshots[1:]):
            w = window(a, b)
            if w["drafts"]:
                out.append({**w, "t_end": b["t"]})
        return out

    def total(self) -> dict[str, Any] | None:
        """The whole polled run as one window (first to last scrape)."""
        return window(self.snapshots[0], self.snapshots[-1]) if len(self.snapshots) > 1 \
            else None
