"""The reference server: the offline engine behind the subset of SGLang's native HTTP API
that the benchmark client uses, logging in SGLang's format. NOT a production server.

Prevents the live-server tooling (launch, watchdog, log reader, benchmark client,
notebook 04) from being tested only on a GPU node, i.e. from being untested: this server
runs anywhere the offline engine runs (CPU), so every piece is exercised against a real
process. It serves
- `GET /health` (and `/health_generate`): 503 while warming up, 200 once ready;
- `POST /generate` with SGLang's request fields (`text` or `input_ids`, single or batch,
  `sampling_params`: max_new_tokens, temperature, top_p, stop_token_ids, ignore_eos,
  sampling_seed) and SGLang's response (`text`, `output_ids`, `meta_info` with
  `completion_tokens`, `finish_reason`, `e2e_latency` and, when speculating,
  `spec_verify_ct`, `spec_accept_length`, `spec_accept_rate`, `spec_accept_histogram`);
- `GET /get_server_info` (and `/server_info`): `internal_states[0].avg_spec_accept_length`
  (cumulative since boot, as SGLang).
The engine is eagle3lab.specdec's `load_engine`: plain decoding, or with `--draft` the
speculative engine (which refuses a drafter that does not fit the target before serving).
Requests run one at a time through the engine. The log has SGLang's start-up lines
(`Load weight begin/end`, `The server is fired up and ready to roll!`) and one `Prefill
batch` and one `Decode batch` line per request (SGLang prints a decode line every 40
decode steps; here the engine runs a request in one call). Accept length, as SGLang: in
`meta_info` completion_tokens / spec_verify_ct; in the log line and
`avg_spec_accept_length` decode-phase tokens per verify step, (accepted drafts + one bonus
token per step) / steps, so a drafter that is never accepted reads exactly 1.00.
SIGUSR1 writes every thread's stack to the log (faulthandler); SIGTERM shuts down cleanly.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from eagle3lab.errors import UserError

SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "stop_token_ids", "ignore_eos",
                 "sampling_seed", "skip_special_tokens"}
REQUEST_KEYS = {"text", "input_ids", "sampling_params", "stream", "rid", "return_logprob"}


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


class ReferenceServer:
    """Holds the engine, the counters and the two loggers; `handle_generate` does the work."""

    def __init__(self, engine, *, settings: dict[str, Any]):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.settings = settings
        self.spec = bool(getattr(engine, "num_draft_tokens", 0))
        self.lock = threading.Lock()
        self.ready = False  # /health answers 503 until the warm-up request has run
        self.waiting = 0
        self.total_correct = 0  # accepted draft tokens since boot (speculative only)
        self.total_verify = 0  # verify steps since boot (speculative only)
        model = getattr(getattr(engine, "target", None), "model", None)
        self.ctx = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0)
                       or 8192)
        self.log = make_logger("scheduler", " TP0")
        self.http_log = make_logger("http")

    def generate_one(self, ids: list[int], sp: dict[str, Any]) -> dict[str, Any]:
        stops = set() if sp.get("ignore_eos") else (
            set(sp["stop_token_ids"]) | set(getattr(self.engine, "stop_token_ids", ()))
            if sp.get("stop_token_ids") else None)
        usage = len(ids) / self.ctx
        self.log.info(f"Prefill batch, #new-seq: 1, #new-token: {len(ids)}, #cached-token: 0, "
                      f"token usage: {usage:.2f}, #running-req: 0, #queue-req: {self.waiting}, ")
        t0 = time.perf_counter()
        r = self.engine.generate(ids, max_new_tokens=int(sp.get("max_new_tokens", 128)),
                                 temperature=float(sp.get("temperature", 1.0)),
                                 top_p=float(sp.get("top_p", 1.0)),
                                 seed=sp.get("sampling_seed"), stop_token_ids=stops)
        latency = time.perf_counter() - t0
        n = r.completion_tokens
        msg = (f"Decode batch, #running-req: 1, #token: {len(ids) + n}, "
               f"token usage: {(len(ids) + n) / self.ctx:.2f}, ")
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex, "prompt_tokens": len(ids), "completion_tokens": n,
            "cached_tokens": 0, "e2e_latency": latency,
            "finish_reason": ({"type": "stop", "matched": r.output_ids[-1]}
                              if r.finish_reason == "stop" else {"type": "length", "length": n}),
            "prefill_s": r.prefill_s, "decode_s": r.decode_s}
        if self.spec and r.verify_ct:
            correct = sum(k * c for k, c in enumerate(r.accept_histogram))
            proposed = r.verify_ct * r.num_draft_tokens
            self.total_verify += r.verify_ct
            self.total_correct += correct
            # meta_info (as SGLang's tokenizer_manager): completion tokens / verify steps;
            # the log line and avg_spec_accept_length (as SGLang's scheduler): decode-phase
            # tokens / verify steps = (accepted drafts + one bonus per step) / steps.
            decode_accept = (correct + r.verify_ct) / r.verify_ct
            meta.update({"spec_verify_ct": r.verify_ct, "spec_accept_length": r.accept_length,
                         "spec_accept_rate": correct / proposed if proposed else 0.0,
                         "spec_num_correct_drafts": correct,
                         "spec_num_proposed_drafts": proposed,
                         "spec_accept_histogram": list(r.accept_histogram)})
            msg += (f"accept len: {decode_accept:.2f}, "
                    f"accept rate: {meta['spec_accept_rate']:.2f}, ")
        busy = r.prefill_s + r.decode_s  # the engine runs a request in one call
        msg += (f"cpu graph: False, gen throughput (token/s): "
                f"{n / busy if busy > 0 else 0.0:.2f}, #queue-req: {self.waiting}")
        self.log.info(msg)
        text = self.tokenizer.decode(r.output_ids,
                                     skip_special_tokens=sp.get("skip_special_tokens", True))
        return {"text": text, "output_ids": list(r.output_ids), "meta_info": meta}

    def handle_generate(self, body: dict[str, Any]) -> Any:
        unknown = set(body) - REQUEST_KEYS
        if unknown:
            raise ValueError(f"unsupported request field(s) {sorted(unknown)}; the reference "
                             f"server implements {sorted(REQUEST_KEYS)}")
        if body.get("stream") or body.get("return_logprob"):
            raise ValueError("stream and return_logprob are not supported by the reference "
                             "server")
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
        out = []
        for ids in prompts:
            self.waiting += 1
            with self.lock:
                self.waiting -= 1
                out.append(self.generate_one([int(i) for i in ids], sp))
        return out if batch else out[0]

    def server_info(self) -> dict[str, Any]:
        s = self.settings
        state: dict[str, Any] = {"engine": type(self.engine).__name__}
        if self.spec and self.total_verify:
            state["avg_spec_accept_length"] = (self.total_correct + self.total_verify) \
                / self.total_verify
        return {"model_path": s["target"], "tp_size": 1, "host": s["host"], "port": s["port"],
                "device": s["device"],
                "speculative_algorithm": "EAGLE3" if self.spec else None,
                "speculative_draft_model_path": s.get("draft"),
                "speculative_num_steps": s.get("steps") if self.spec else None,
                "speculative_eagle_topk": s.get("topk") if self.spec else None,
                "speculative_num_draft_tokens": s.get("draft_tokens") if self.spec else None,
                "internal_states": [state], "version": "eagle3lab-reference",
                "production": False}


def _handler(server: ReferenceServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # uvicorn-style access log, without /health
            if not self.path.startswith("/health"):
                server.http_log.info(f'INFO:     {self.client_address[0]}:'
                                     f'{self.client_address[1]} - "{self.requestline}" '
                                     f'{args[1] if len(args) > 1 else ""}')

        def _send(self, code: int, obj: Any = None) -> None:
            data = b"" if obj is None else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                self._send(200 if server.ready else 503)
            elif path in ("/get_server_info", "/server_info"):
                self._send(200, server.server_info())
            elif path == "/model_info":
                self._send(200, {"model_path": server.settings["target"],
                                 "is_generation": True})
            else:
                self._send(404, {"error": {"message": f"no route {path}"}})

        def do_POST(self):
            path = self.path.split("?")[0]
            if path != "/generate":
                return self._send(404, {"error": {"message": f"no route {path}"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if not isinstance(body, dict):
                    raise ValueError("the request body must be a JSON object")
                result = server.handle_generate(body)
            except (ValueError, TypeError, KeyError) as e:
                return self._send(HTTPStatus.BAD_REQUEST, {"error": {"message": str(e)}})
            except Exception as e:  # the engine failed: say so, keep serving
                server.log.error(f"Request failed: {type(e).__name__}: {e}")
                return self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})
            self._send(200, result)

    return Handler


def serve(*, target: str, draft: str | None = None, steps: int = 3, topk: int = 1,
          draft_tokens: int | None = None, host: str = "127.0.0.1", port: int = 30000,
          device: str = "auto") -> int:
    """Load, warm up and serve until SIGTERM/SIGINT. Returns the exit code."""
    import psutil

    from eagle3lab.specdec.load import load_engine

    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    settings = {"target": target, "draft": draft, "steps": steps, "topk": topk,
                "draft_tokens": draft_tokens, "host": host, "port": port, "device": device}
    log, log_rank = make_logger("http"), make_logger("scheduler", " TP0")
    log.info("server_args=ReferenceServerArgs(" + ", ".join(
        f"{k}={v!r}" for k, v in settings.items()) + ", production=False)")
    avail = psutil.virtual_memory().available / 2**30
    log_rank.info(f"Load weight begin. avail mem={avail:.2f} GB")
    t0 = time.perf_counter()
    engine = load_engine(target=target, draft=draft or None, steps=steps, topk=topk,
                         draft_tokens=draft_tokens, device=device)
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
        httpd = ThreadingHTTPServer((host, port), _handler(server))
    except OSError as e:
        raise UserError(f"Cannot listen on {host}:{port}: {e.strerror or e}. Choose another "
                        f"--port (or stop the server that holds it).") from None
    httpd.daemon_threads = True
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
