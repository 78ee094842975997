"""The reference server's HTTP routes: SGLang's native `/generate` (JSON or SSE stream),
the OpenAI `/v1/completions` and `/v1/models` as vLLM serves them, `/metrics`, `/health`
and the server info.

Prevents clients that work against the reference server and break against a real engine
(or the reverse): every answer keeps the engine's field names. SGLang's stream, as its
own benchmark client reads it (sglang/benchmark/serving.py `async_request_sglang_generate`,
0.5.23): lines `data: {JSON}` with the cumulative `text` and `meta_info`
(`completion_tokens`, and `spec_accept_length` on the last), then `data: [DONE]`.

`/v1/completions` as vLLM 0.25.1 answers it (vllm/entrypoints/openai/completion/):
- request (protocol.py:46-160 `CompletionRequest`): `prompt` a string or a list of token
  ids (or a list of one of those), `max_tokens` (default 16), `temperature`, `top_p`,
  `seed`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens`, `return_token_ids`, `n`,
  `stream`, `stream_options` (`include_usage`, `continuous_usage_stats`; refused without
  `stream`, protocol.py:470-479); unknown fields are ignored by vLLM (logged at DEBUG,
  vllm/entrypoints/openai/engine/protocol.py:28-57) but refused here, so a client's typo
  shows. A `model` that is not served: 404 `NotFoundError` "The model `X` does not
  exist." (vllm/entrypoints/serve/engine/serving.py:63-68); errors are `{"error":
  {"message", "type", "param", "code"}}` (vllm/entrypoints/serve/utils/error_response.py).
- response (serving.py:499-643, sent as `model_dump()`, api_router.py:61-63): `id`
  (`cmpl-...`), `object` "text_completion", `created`, `model`, `choices[0]` with `index`,
  `text`, `logprobs`, `finish_reason` ("stop" | "length"), `stop_reason` (the stop token
  id when a `stop_token_ids` entry ended it, else null), `token_ids` and `prompt_token_ids`
  (both INSIDE the choice, null unless `return_token_ids`; protocol.py:520-535; the ids
  include a stop token: vllm/v1/engine/detokenizer.py:108-126), `prompt_logprobs`; `usage`
  {`prompt_tokens`, `total_tokens`, `completion_tokens`, `prompt_tokens_details`}.
- stream (serving.py:282-497, chunks as `model_dump_json(exclude_unset=True)`): `data:`
  chunks whose `choices[0]` has the delta `text`, `finish_reason` / `stop_reason` (null
  until the end), `token_ids` = the delta ids (null without `return_token_ids`) and
  `prompt_token_ids` (the prompt on the first chunk only with `return_token_ids`, else
  null); with `stream_options.include_usage` one more chunk with `choices: []` and `usage`
  (serving.py:456-486), with `continuous_usage_stats` `usage` on every chunk
  (serving.py:431-438); then `data: [DONE]`. Here the last chunk carries only the
  finish_reason (vLLM puts it on the chunk with the last tokens). A stream is written with
  `Connection: close` (no length known ahead).
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
#: vLLM's error types by status (vllm/entrypoints/serve/utils/error_response.py:16-70).
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


class NotServed(ValueError):
    """A request for a model this server does not serve (vLLM: 404)."""


def error_body(code: int, message: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's `ErrorResponse` shape."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(code, "BadRequestError"),
                      "param": param, "code": code}}


def openai_request(server, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """A `/v1/completions` body -> (prompt ids, SGLang-style sampling params)."""
    bad = set(body) - OPENAI_KEYS
    if bad:
        raise ValueError(f"unsupported completion field(s) {sorted(bad)}; the reference "
                         f"server implements {sorted(OPENAI_KEYS)}")
    if body.get("n", 1) != 1:
        raise ValueError("n > 1 is not supported by the reference server")
    if body.get("stream_options") and not body.get("stream"):
        raise ValueError("Stream options can only be defined when `stream=True`.")
    if body.get("model") not in (None, server.model_name):
        raise NotServed(f"The model `{body['model']}` does not exist. (this server serves "
                        f"{server.model_name!r})")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        if len(prompt) != 1:
            raise ValueError("send one prompt per request to the reference server")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = server.tokenizer(prompt).input_ids
    elif isinstance(prompt, list) and prompt and all(
            isinstance(i, int) and i >= 0 for i in prompt):
        ids = list(prompt)
    else:
        raise ValueError("prompt must be a string or a non-empty list of token ids")
    sp = {"max_new_tokens": int(body.get("max_tokens") or 16),
          "temperature": float(body.get("temperature", 1.0)),
          "top_p": float(body.get("top_p", 1.0)), "ignore_eos": bool(body.get("ignore_eos")),
          "skip_special_tokens": body.get("skip_special_tokens", True)}
    if body.get("seed") is not None:
        sp["sampling_seed"] = int(body["seed"])
    if body.get("stop_token_ids"):
        sp["stop_token_ids"] = list(body["stop_token_ids"])
    return ids, sp


def _stop_reason(server, out: dict[str, Any], sp: dict[str, Any]) -> int | None:
    """vLLM's `stop_reason`: the token id when one of the request's `stop_token_ids` ended
    it (vllm/v1/core/sched/utils.py:104-111), None for EOS or a length stop."""
    fr = out["meta_info"]["finish_reason"]
    matched = fr.get("matched") if fr["type"] == "stop" else None
    eos = getattr(server.tokenizer, "eos_token_id", None)
    return matched if matched in (sp.get("stop_token_ids") or ()) and matched != eos \
        else None


def _usage(prompt: int, completion: int, *, details: bool) -> dict[str, Any]:
    u = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
         "completion_tokens": completion}
    return {**u, "prompt_tokens_details": None} if details else u


def openai_response(server, ids: list[int], out: dict[str, Any], sp: dict[str, Any], *,
                    token_ids: bool) -> dict:
    """The non-streamed `CompletionResponse`, every field vLLM's `model_dump()` writes."""
    meta = out["meta_info"]
    choice = {"index": 0, "text": out["text"], "logprobs": None,
              "finish_reason": meta["finish_reason"]["type"],
              "stop_reason": _stop_reason(server, out, sp),
              "token_ids": list(out["output_ids"]) if token_ids else None,
              "prompt_logprobs": None, "prompt_token_ids": list(ids) if token_ids else None,
              "routed_experts": None}
    return {"id": f"cmpl-{meta['id']}", "object": "text_completion",
            "created": int(time.time()), "model": server.model_name, "choices": [choice],
            "service_tier": None, "system_fingerprint": None,
            "usage": _usage(len(ids), meta["completion_tokens"], details=True),
            "kv_transfer_params": None, "metrics": None}


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
                self._send(200, {"object": "list", "data": [{  # vLLM's ModelCard fields
                    "id": server.model_name, "object": "model", "created": int(time.time()),
                    "owned_by": "eagle3lab", "root": server.settings["target"],
                    "parent": None, "max_model_len": server.ctx, "permission": []}]})
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
            except NotServed as e:
                return self._send(HTTPStatus.NOT_FOUND, error_body(404, str(e), "model"))
            except (ValueError, TypeError, KeyError) as e:
                return self._send(HTTPStatus.BAD_REQUEST, error_body(400, str(e)))
            except (BrokenPipeError, ConnectionResetError):
                server.log.info("Client disconnected during a stream.")
            except Exception as e:  # the engine failed: say so, keep serving
                server.log.error(f"Request failed: {type(e).__name__}: {e}")
                return self._send(500, error_body(500, f"{type(e).__name__}: {e}"))

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
                return self._send(200, openai_response(server, ids, out, sp,
                                                       token_ids=want_ids))
            opts = body.get("stream_options") or {}
            usage, continuous = bool(opts.get("include_usage")), bool(
                opts.get("include_usage") and opts.get("continuous_usage_stats"))
            cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
            sent = {"ids": [], "text": ""}
            skip = sp.get("skip_special_tokens", True)
            self._start_stream()

            def chunk(choices: list[dict], **extra) -> None:
                self._event({"id": cid, "object": "text_completion", "created": created,
                             "model": server.model_name, "choices": choices, **extra})

            def delta(so_far: list[int], out: dict | None = None) -> None:
                text = server.tokenizer.decode(so_far, skip_special_tokens=skip)
                new_ids = so_far[len(sent["ids"]):]
                choice = {"index": 0, "text": text[len(sent["text"]):], "logprobs": None,
                          "finish_reason": out and out["meta_info"]["finish_reason"]["type"],
                          "stop_reason": out and _stop_reason(server, out, sp),
                          "prompt_token_ids": ids if want_ids and not sent["ids"] else None,
                          "token_ids": new_ids if want_ids else None}
                sent.update(ids=list(so_far), text=text)
                chunk([choice], **({"usage": _usage(len(ids), len(so_far), details=False)}
                                   if continuous else {}))

            out = server.generate_one(ids, sp, streaming=True, on_tokens=delta)
            delta(out["output_ids"], out)
            if usage:
                chunk([], usage=_usage(len(ids), len(out["output_ids"]), details=False))
            self._event("[DONE]")

    return Handler
