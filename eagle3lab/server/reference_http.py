"""The reference server's HTTP routes: SGLang's native `/generate` (JSON or SSE stream),
the OpenAI `/v1/completions` and `/v1/models` as vLLM serves them, `/metrics`, `/health`
and the server info.

Prevents clients that work against the reference server and break against a real engine
(or the reverse): every answer keeps the engine's field names. SGLang's stream, as its
own benchmark client reads it (sglang/benchmark/serving.py `async_request_sglang_generate`,
0.5.23): lines `data: {JSON}` with the cumulative `text` and `meta_info`
(`completion_tokens`, and `spec_accept_length` on the last), then `data: [DONE]`. The
OpenAI stream, as vLLM's (vllm/entrypoints/openai/serving_completion.py): `data:` chunks
whose `choices[0].text` is the delta (and `token_ids` the delta ids when
`return_token_ids`; vllm/entrypoints/openai/protocol.py `CompletionRequest`), then
`data: [DONE]`. A stream is written with `Connection: close` (no length known ahead).
"""

from __future__ import annotations

import json
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

#: OpenAI completion fields the reference server implements (vLLM's names).
OPENAI_KEYS = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stream",
               "stop_token_ids", "ignore_eos", "skip_special_tokens", "return_token_ids", "n",
               "stream_options"}


def openai_request(server, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """A `/v1/completions` body -> (prompt ids, SGLang-style sampling params)."""
    bad = set(body) - OPENAI_KEYS
    if bad:
        raise ValueError(f"unsupported completion field(s) {sorted(bad)}; the reference "
                         f"server implements {sorted(OPENAI_KEYS)}")
    if body.get("n", 1) != 1:
        raise ValueError("n > 1 is not supported by the reference server")
    if body.get("model") not in (None, server.model_name):
        raise ValueError(f"model {body['model']!r} is not served here; this server serves "
                         f"{server.model_name!r}")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        if len(prompt) != 1:
            raise ValueError("send one prompt per request to the reference server")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = server.tokenizer(prompt).input_ids
    elif isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        ids = list(prompt)
    else:
        raise ValueError("prompt must be a string or a list of token ids")
    sp = {"max_new_tokens": int(body.get("max_tokens") or 16),
          "temperature": float(body.get("temperature", 1.0)),
          "top_p": float(body.get("top_p", 1.0)), "ignore_eos": bool(body.get("ignore_eos")),
          "skip_special_tokens": body.get("skip_special_tokens", True)}
    if body.get("seed") is not None:
        sp["sampling_seed"] = int(body["seed"])
    if body.get("stop_token_ids"):
        sp["stop_token_ids"] = list(body["stop_token_ids"])
    return ids, sp


def openai_response(server, ids: list[int], out: dict[str, Any], *, token_ids: bool) -> dict:
    meta = out["meta_info"]
    choice = {"index": 0, "text": out["text"], "logprobs": None,
              "finish_reason": meta["finish_reason"]["type"]}
    if token_ids:
        choice["token_ids"] = out["output_ids"]
    resp = {"id": f"cmpl-{meta['id']}", "object": "text_completion", "created": int(time.time()),
            "model": server.model_name, "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": meta["completion_tokens"],
                      "total_tokens": len(ids) + meta["completion_tokens"]}}
    if token_ids:
        resp["prompt_token_ids"] = ids
    return resp


def make_handler(server):
    """The request handler class bound to a `ReferenceServer`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # uvicorn-style access log, without the probes
            if not self.path.startswith(("/health", "/metrics")):
                server.http_log.info(f'INFO:     {self.client_address[0]}:'
                                     f'{self.client_address[1]} - "{self.requestline}" '
                                     f'{args[1] if len(args) > 1 else ""}')

        def _send(self, code: int, obj: Any = None, *, raw: bytes | None = None,
                  content_type: str = "application/json") -> None:
            data = raw if raw is not None else (b"" if obj is None else json.dumps(obj).encode())
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _start_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def _event(self, obj: Any) -> None:
            payload = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {payload}\n\n".encode())
            self.wfile.flush()

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                self._send(200 if server.ready else 503)
            elif path == "/metrics":
                self._send(200, raw=server.metrics.render(),
                           content_type="text/plain; version=0.0.4; charset=utf-8")
            elif path in ("/get_server_info", "/server_info"):
                self._send(200, server.server_info())
            elif path == "/model_info":
                self._send(200, {"model_path": server.settings["target"],
                                 "served_model_name": server.model_name,
                                 "is_generation": True})
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{
                    "id": server.model_name, "object": "model", "owned_by": "eagle3lab",
                    "root": server.settings["target"], "max_model_len": server.ctx}]})
            else:
                self._send(404, {"error": {"message": f"no route {path}"}})

        def do_POST(self):
            path = self.path.split("?")[0]
            if path not in ("/generate", "/v1/completions"):
                return self._send(404, {"error": {"message": f"no route {path}"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if not isinstance(body, dict):
                    raise ValueError("the request body must be a JSON object")
                if path == "/generate":
                    return self._generate(body)
                return self._completions(body)
            except (ValueError, TypeError, KeyError) as e:
                return self._send(HTTPStatus.BAD_REQUEST, {"error": {"message": str(e)}})
            except (BrokenPipeError, ConnectionResetError):
                server.log.info("Client disconnected during a stream.")
            except Exception as e:  # the engine failed: say so, keep serving
                server.log.error(f"Request failed: {type(e).__name__}: {e}")
                return self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})

        def _generate(self, body: dict[str, Any]) -> None:
            if not body.get("stream"):
                return self._send(200, server.handle_generate(body))
            _, prompts, sp = server.parse_generate(body)
            ids = prompts[0]
            rid = uuid.uuid4().hex
            skip = sp.get("skip_special_tokens", True)
            self._start_stream()

            def chunk(so_far: list[int]) -> None:  # cumulative text, as SGLang streams
                self._event({"text": server.tokenizer.decode(so_far, skip_special_tokens=skip),
                             "output_ids": list(so_far),
                             "meta_info": {"id": rid, "prompt_tokens": len(ids),
                                           "completion_tokens": len(so_far),
                                           "finish_reason": None}})

            out = server.generate_one(ids, sp, streaming=True, on_tokens=chunk)
            self._event({**out, "meta_info": {**out["meta_info"], "id": rid}})
            self._event("[DONE]")

        def _completions(self, body: dict[str, Any]) -> None:
            ids, sp = openai_request(server, body)
            want_ids = bool(body.get("return_token_ids"))
            if not body.get("stream"):
                out = server.generate_one(ids, sp)
                return self._send(200, openai_response(server, ids, out, token_ids=want_ids))
            cid, sent = f"cmpl-{uuid.uuid4().hex}", {"ids": [], "text": ""}
            skip = sp.get("skip_special_tokens", True)
            self._start_stream()

            def delta(so_far: list[int], finish: str | None = None) -> None:
                text = server.tokenizer.decode(so_far, skip_special_tokens=skip)
                choice = {"index": 0, "text": text[len(sent["text"]):], "logprobs": None,
                          "finish_reason": finish}
                if want_ids:
                    choice["token_ids"] = so_far[len(sent["ids"]):]
                sent.update(ids=list(so_far), text=text)
                self._event({"id": cid, "object": "text_completion", "created":
                             int(time.time()), "model": server.model_name,
                             "choices": [choice]})

            out = server.generate_one(ids, sp, streaming=True, on_tokens=delta)
            delta(out["output_ids"], out["meta_info"]["finish_reason"]["type"])
            self._event("[DONE]")

    return Handler
