"""The reference server: the offline engine behind the subset of SGLang's native HTTP API
(and of the OpenAI completions API) that benchmark and regeneration clients use, logging
in SGLang's format, with `/metrics` in the engines' Prometheus names. NOT a production
server.

Prevents the live-server tooling (launch, watchdog, log reader, benchmark client, metrics
scraper, regeneration through a server, notebook 04) from being tested only on a GPU node,
i.e. from being untested: this server runs anywhere the offline engine runs (CPU), so every
piece is exercised against a real process. Routes (routes.py):
- `GET /health` (and `/health_generate`): 503 while warming up, 200 once ready;
- `POST /generate` with SGLang's request fields (`text` or `input_ids`, single or batch,
  `sampling_params`: max_new_tokens, temperature, top_p, stop_token_ids, ignore_eos,
  sampling_seed, skip_special_tokens; the inert fields SGLang's benchmark client always
  sends) and SGLang's response (`text`, `output_ids`, `meta_info` with
  `completion_tokens`, `finish_reason`, `e2e_latency` and, when speculating,
  `spec_verify_ct`, `spec_accept_length`, `spec_accept_rate`, `spec_num_correct_drafts`,
  `spec_num_proposed_drafts`, and the histogram as `spec_correct_drafts_histogram`, SGLang
  0.5.23's name and length, and `spec_accept_histogram`, the older name, every position;
  sglang/srt/managers/tokenizer_manager.py `_calculate_spec_decoding_metrics`, 0.5.23);
  with `"stream": true` SSE `data: {...}` chunks with the cumulative `text` and
  `meta_info.completion_tokens`, one per engine step, then `data: [DONE]`;
- `POST /v1/completions` (OpenAI, as vLLM 0.25.1: a prompt as text or token ids,
  `max_tokens`, `temperature`, `top_p`, `seed`, `stop_token_ids`, `ignore_eos`,
  `return_token_ids`, `stream`, `stream_options`; the fields of vLLM's response and stream
  chunks, routes.py) and `GET /v1/models` (the served model name, `root` the
  target);
- `GET /metrics`: vLLM's spec-decode, token and request counters and request gauges,
  SGLang's gauges (measure/prometheus.py);
- `GET /get_server_info` (and `/server_info`): `internal_states[0].avg_spec_accept_length`
  (cumulative since boot, as SGLang), `model_path`.
The engine is eagle3lab.specdec's `load_engine`: plain decoding, or with `--draft` the
speculative engine (which refuses a drafter that does not fit the target before serving).
Requests are served concurrently by threads but decoded one at a time (a lock): a request
waits in the queue (counted in the log's `#queue-req` and in /metrics) while /health and
/metrics keep answering. The log has SGLang's start-up lines (`Load weight begin/end`,
`The server is fired up and ready to roll!`) and one `Prefill batch` and one `Decode
batch` line per request (SGLang prints a decode line every 40 decode steps; here the
engine runs a request in one call). Accept length, as SGLang: in `meta_info`
completion_tokens / spec_verify_ct; in the log line and `avg_spec_accept_length`
decode-phase tokens per verify step, (accepted drafts + one bonus token per step) / steps,
so a drafter that is never accepted reads exactly 1.00; /metrics counts every verify step
as it happens (vLLM's definition: 1 + accepted / drafts, the same number).
SIGUSR1 writes every thread's stack to the log (faulthandler); SIGTERM shuts down cleanly.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from typing import Any, Callable

from eagle3lab.errors import UserError
from eagle3lab.measure.prometheus import ReferenceMetrics
from eagle3lab.refserver.routes import make_handler
from eagle3lab.specdec.load import load_engine

SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "stop_token_ids", "ignore_eos",
                 "sampling_seed", "skip_special_tokens"}
REQUEST_KEYS = {"text", "input_ids", "sampling_params", "stream", "rid", "return_logprob"}
#: Fields SGLang's own benchmark client always sends (sglang/benchmark/serving.py
#: `async_request_sglang_generate`, 0.5.23); accepted when they ask for nothing the
#: reference server lacks (no LoRA, no logprobs, no routed experts).
INERT_KEYS = {"lora_path": (None,), "return_routed_experts": (False, None),
              "logprob_start_len": (-1, None), "return_logprob": (False, None)}


def make_logger(name: str, rank_tag: str = "") -> logging.Logger:
    """SGLang's log format: `[YYYY-MM-DD HH:MM:SS{ TP0}] message` on stdout."""
    log = logging.getLogger(f"eagle3lab.reference.{name}")
    if not log.handlers:
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter(f"[%(asctime)s{rank_tag}] %(message)s",
                                         datefmt="%Y-%m-%d %H:%M:%S"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


class Httpd(ThreadingHTTPServer):
    """The HTTP server: one thread per request; a client that left before its answer (a
    /health probe that timed out on a busy machine) is one log line, not the traceback
    socketserver prints, which the log reader (rightly, for an engine) takes for a crash
    and the watchdog then stops a healthy server."""

    daemon_threads = True

    def __init__(self, address, handler, *, log: logging.Logger):
        self.log = log
        super().__init__(address, handler)

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):  # BrokenPipeError, ConnectionResetError
            self.log.info(f"{client_address[0]}:{client_address[1]} went away before its "
                          f"answer was sent ({type(exc).__name__}).")
            return
        super().handle_error(request, client_address)


class ReferenceServer:
    """Holds the engine, the counters, `/metrics` and the two loggers; `generate_one` does
    the work, one request at a time (a lock), while other threads answer /health, /metrics
    and queue their requests."""

    def __init__(self, engine, *, settings: dict[str, Any]):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.settings = settings
        self.spec = bool(getattr(engine, "num_draft_tokens", 0))
        self.lock = threading.Lock()
        self.count_lock = threading.Lock()
        self.ready = False  # /health answers 503 until the warm-up request has run
        self.waiting = 0
        self.running = 0
        self.total_correct = 0  # accepted draft tokens since boot (speculative only)
        self.total_verify = 0  # verify steps since boot (speculative only)
        model = getattr(getattr(engine, "target", None), "model", None)
        self.ctx = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0)
                       or 8192)
        self.model_name = settings.get("served_model_name") or settings["target"]
        self.metrics = ReferenceMetrics(model_name=self.model_name, num_spec_tokens=int(
            getattr(engine, "steps", 0) or 0) if self.spec else 0)
        self.log = make_logger("scheduler", " TP0")
        self.http_log = make_logger("http")

    def _queue(self, delta: int) -> None:
        with self.count_lock:
            self.waiting += delta
            self.metrics.set_batch(running=self.running, waiting=self.waiting)

    def generate_one(self, ids: list[int], sp: dict[str, Any], *, streaming: bool = False,
                     on_tokens: Callable[[list[int]], None] | None = None) -> dict[str, Any]:
        """One request through the engine (waits for the lock; the queue is counted in
        the log and /metrics). `on_tokens(all ids so far)` after every engine step."""
        self._queue(+1)
        with self.lock:
            self._queue(-1)
            self.running = 1
            try:
                return self._run(ids, sp, streaming=streaming, on_tokens=on_tokens)
            finally:
                self.running = 0
                self.metrics.set_batch(running=0, waiting=self.waiting)

    def _run(self, ids, sp, *, streaming, on_tokens) -> dict[str, Any]:
        stops = set() if sp.get("ignore_eos") else (
            set(sp["stop_token_ids"]) | set(getattr(self.engine, "stop_token_ids", ()))
            if sp.get("stop_token_ids") else None)
        usage = len(ids) / self.ctx
        self.log.info(f"Prefill batch, #new-seq: 1, #new-token: {len(ids)}, #cached-token: 0, "
                      f"token usage: {usage:.2f}, #running-req: 0, #queue-req: {self.waiting}, ")
        so_far: list[int] = []

        def on_step(tokens: list[int], accepted: int | None) -> None:
            so_far.extend(tokens)
            self.metrics.observe_tokens(len(tokens), streaming=streaming)
            if accepted is not None:
                self.metrics.observe_draft(accepted)
            if on_tokens is not None:
                on_tokens(list(so_far))

        t0 = time.perf_counter()
        r = self.engine.generate(ids, max_new_tokens=int(sp.get("max_new_tokens", 128)),
                                 temperature=float(sp.get("temperature", 1.0)),
                                 top_p=float(sp.get("top_p", 1.0)),
                                 seed=sp.get("sampling_seed"), stop_token_ids=stops,
                                 on_step=on_step)
        latency = time.perf_counter() - t0
        n = r.completion_tokens
        self.metrics.observe_request(prompt_tokens=len(ids), finish_reason=(
            "stop" if r.finish_reason == "stop" else "length"))
        msg = (f"Decode batch, #running-req: 1, #token: {len(ids) + n}, "
               f"token usage: {(len(ids) + n) / self.ctx:.2f}, ")
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex, "prompt_tokens": len(ids), "completion_tokens": n,
            "cached_tokens": 0, "e2e_latency": latency,
            "finish_reason": ({"type": "stop", "matched": r.output_ids[-1]}
                              if r.finish_reason == "stop" else {"type": "length", "length": n}),
            "prefill_s": r.prefill_s, "decode_s": r.decode_s}
        decode_accept = rate = None
        if self.spec and r.verify_ct:
            correct = sum(k * c for k, c in enumerate(r.accept_histogram))
            proposed = r.verify_ct * r.num_draft_tokens
            self.total_verify += r.verify_ct
            self.total_correct += correct
            # meta_info (as SGLang's tokenizer_manager): completion tokens / verify steps;
            # the log line and avg_spec_accept_length (as SGLang's scheduler): decode-phase
            # tokens / verify steps = (accepted drafts + one bonus per step) / steps.
            decode_accept = (correct + r.verify_ct) / r.verify_ct
            rate = correct / proposed if proposed else 0.0
            meta.update({"spec_verify_ct": r.verify_ct, "spec_accept_length": r.accept_length,
                         "spec_accept_rate": rate, "spec_num_correct_drafts": correct,
                         "spec_num_proposed_drafts": proposed,
                         "spec_accept_histogram": list(r.accept_histogram)})
            # SGLang 0.5.23's name, its list grown only as far as the largest count seen
            # (schedule_batch.py `update_spec_correct_drafts_histogram`); the older name
            # above keeps every position (its length is num_draft_tokens + 1)
            last = max((k for k, c in enumerate(r.accept_histogram) if c), default=0)
            meta["spec_correct_drafts_histogram"] = list(r.accept_histogram[:last + 1])
            msg += f"accept len: {decode_accept:.2f}, accept rate: {rate:.2f}, "
        busy = r.prefill_s + r.decode_s  # the engine runs a request in one call
        throughput = n / busy if busy > 0 else 0.0
        self.metrics.set_batch(running=1, waiting=self.waiting, accept_length=decode_accept,
                               accept_rate=rate, throughput=throughput)
        msg += f"cpu graph: False, gen throughput (token/s): {throughput:.2f}, " \
               f"#queue-req: {self.waiting}"
        self.log.info(msg)
        text = self.tokenizer.decode(r.output_ids,
                                     skip_special_tokens=sp.get("skip_special_tokens", True))
        return {"text": text, "output_ids": list(r.output_ids), "meta_info": meta}

    def parse_generate(self, body: dict[str, Any]) -> tuple[bool, list[list[int]], dict]:
        """SGLang's `/generate` body -> (batch?, prompts as token ids, sampling params);
        ValueError naming what the reference server does not implement."""
        unknown = set(body) - REQUEST_KEYS - set(INERT_KEYS)
        if unknown:
            raise ValueError(f"unsupported request field(s) {sorted(unknown)}; the reference "
                             f"server implements {sorted(REQUEST_KEYS)}")
        active = [k for k, inert in INERT_KEYS.items() if k in body and body[k] not in inert]
        if active:
            raise ValueError(f"{active} are not supported by the reference server (no LoRA, "
                             f"logprobs or routed experts)")
        sp = body.get("sampling_params") or {}
        bad = set(sp) - SAMPLING_KEYS
        if bad:
            raise ValueError(f"unsupported sampling_params {sorted(bad)}; supported: "
                             f"{sorted(SAMPLING_KEYS)}")
        if "input_ids" in body:
            ids = body["input_ids"]
            batch = bool(ids) and isinstance(ids[0], list)
            prompts = ids if batch else [ids]
        elif "text" in body:
            batch = isinstance(body["text"], list)
            texts = body["text"] if batch else [body["text"]]
            prompts = [self.tokenizer(t).input_ids for t in texts]
        else:
            raise ValueError("the request needs text or input_ids")
        if body.get("stream") and batch:
            raise ValueError("stream with a batch of prompts is not supported; send one "
                             "prompt per streaming request")
        return batch, [[int(i) for i in p] for p in prompts], sp

    def handle_generate(self, body: dict[str, Any]) -> Any:
        batch, prompts, sp = self.parse_generate(body)
        out = [self.generate_one(ids, sp) for ids in prompts]
        return out if batch else out[0]

    def server_info(self) -> dict[str, Any]:
        s = self.settings
        state: dict[str, Any] = {"engine": type(self.engine).__name__}
        if self.spec and self.total_verify:
            state["avg_spec_accept_length"] = (self.total_correct + self.total_verify) \
                / self.total_verify
        return {"model_path": s["target"], "served_model_name": self.model_name,
                "tp_size": 1, "host": s["host"], "port": s["port"], "device": s["device"],
                "speculative_algorithm": "EAGLE3" if self.spec else None,
                "speculative_draft_model_path": s.get("draft"),
                "speculative_num_steps": s.get("steps") if self.spec else None,
                "speculative_eagle_topk": s.get("topk") if self.spec else None,
                "speculative_num_draft_tokens": s.get("draft_tokens") if self.spec else None,
                "internal_states": [state], "version": "eagle3lab-reference",
                "production": False}


def serve(*, target: str, draft: str | None = None, steps: int = 3, topk: int = 1,
          draft_tokens: int | None = None, host: str = "127.0.0.1", port: int = 30000,
          device: str = "auto", served_model_name: str | None = None,
          dtype: str = "float32", threads: int = 0) -> int:
    """Load, warm up and serve until SIGTERM/SIGINT. Returns the exit code. dtype: the
    target's and drafter's; threads: torch CPU threads (0: torch's default)."""
    import psutil
    import torch

    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    settings = {"target": target, "draft": draft, "steps": steps, "topk": topk,
                "draft_tokens": draft_tokens, "host": host, "port": port, "device": device,
                "served_model_name": served_model_name, "dtype": dtype, "threads": threads}
    if threads < 0:
        raise UserError(f"--threads {threads}: give a whole number of torch threads, 0 for "
                        f"torch's default.")
    if threads:
        torch.set_num_threads(threads)
    log, log_rank = make_logger("http"), make_logger("scheduler", " TP0")
    log.info("server_args=ReferenceServerArgs(" + ", ".join(
        f"{k}={v!r}" for k, v in settings.items()) + ", production=False)")
    avail = psutil.virtual_memory().available / 2**30
    log_rank.info(f"Load weight begin. avail mem={avail:.2f} GB")
    t0 = time.perf_counter()
    engine = load_engine(target=target, draft=draft or None, steps=steps, topk=topk,
                         draft_tokens=draft_tokens, device=device, dtype=dtype)
    model = getattr(getattr(engine, "target", None), "model", None)
    after = psutil.virtual_memory().available / 2**30
    log_rank.info(f"Load weight end. elapsed={time.perf_counter() - t0:.2f} s, "
                  f"type={type(model).__name__}, dtype={getattr(model, 'dtype', '?')}, "
                  f"avail mem={after:.2f} GB, mem usage={max(avail - after, 0):.2f} GB.")
    server = ReferenceServer(engine, settings=settings)
    log_rank.info(f"max_total_num_tokens={server.ctx}, max_running_requests=1, "
                  f"context_len={server.ctx}, speculative={server.spec}, "
                  f"num_draft_tokens={getattr(engine, 'num_draft_tokens', 0)}")
    try:
        httpd = Httpd((host, port), make_handler(server), log=log)
    except OSError as e:
        raise UserError(f"Cannot listen on {host}:{port}: {e.strerror or e}. Choose another "
                        f"--port (or stop the server that holds it).") from None
    log.info(f"HTTP server listening on http://{host}:{port} (eagle3lab reference server; "
             f"not a production server)")
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.info(f"Bound to {host}: this server is reachable from outside this machine.")
    server.generate_one(server.tokenizer("Hello").input_ids, {"max_new_tokens": 1,
                                                             "temperature": 0.0})  # warm-up
    stopping = threading.Event()

    def on_signal(signum, frame):
        if not stopping.is_set():
            stopping.set()
            log.info(f"Received {signal.Signals(signum).name}; shutting down.")
            threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.ready = True
    log.info("The server is fired up and ready to roll!")
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
    log.info("Shutdown complete.")
    return 0
