"""Generation through a serving engine (SGLang, vLLM, the reference server) for the data
stages: the prompts' token ids go out, the answers' token ids come back, N in flight.

Prevents three ways regeneration at scale goes wrong when a server does the generating:
(1) a server that templates or tokenizes the text itself (another chat template, another
tokenizer revision) makes the loss mask inexact: here the chat template is applied locally
and only token ids are sent (SGLang's native `/generate` with `input_ids`; the OpenAI
`/v1/completions` with a token-id prompt and vLLM's `return_token_ids`), and the answer's
ids are kept as returned (so the rendering a stage records, `eagle3lab.data.rendering`, is
the one applied here: the server's own template is never used); (2) a wrong server
(another model behind the URL) writes a file of garbage: the server's model identity
(`/v1/models` id/root, SGLang's `/get_server_info` or `/server_info` or `/model_info`
`model_path`) must name the target before anything is written; (3) a flaky server kills a long run: failed requests are retried with exponential
backoff and counted, and answers are handed back in the prompts' order, so the file a
killed run leaves is a prefix the resume logic continues (never a prompt twice); an
answer the server cut short (finish reason `abort`, e.g. requests aborted while it shuts
down, or `error`) is a failed attempt, retried, never a record.

The OpenAI route as vLLM 0.25.1 serves it (vllm/entrypoints/openai/completion/):
`CompletionRequest` (protocol.py:46-160) takes `prompt` as a list of token ids (one
prompt, used as is: vllm/renderers/inputs/preprocess.py:48-56), `max_tokens`,
`temperature`, `top_p`, `seed`, `stop_token_ids` (merged with the generation config's
extra EOS ids, protocol.py:292-302), `skip_special_tokens`, `return_token_ids` and
`model` (optional; one that is not served is a 404, vllm/entrypoints/serve/engine/
serving.py:63-68). The answer (serving.py:499-643) carries the generated ids in
`choices[0].token_ids` (the prompt's in `choices[0].prompt_token_ids`, both only with
`return_token_ids`), a matched stop token included (vllm/v1/engine/detokenizer.py:108-126),
and `finish_reason` "stop" | "length" | "abort" ("error" becomes an HTTP error,
serving.py:525). `/v1/models` lists `id` (the served name) and `root` (the model path)
(vllm/entrypoints/openai/models/serving.py:66-77).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Callable

from eagle3lab import asyncutil
from eagle3lab.config import TARGET_PRESETS, preset_dir
from eagle3lab.errors import UserError
from eagle3lab.targets.adapter import config_sha256, resolve_target_path

APIS = ("sglang", "openai")


class CutShort(Exception):
    """An answer that ended neither by a stop token nor by the token budget."""


class TargetInfo:
    """What a data stage needs of the target when a server runs it: tokenizer, config hash,
    stop tokens, description; read from the target's directory, no weights loaded."""

    def __init__(self, target: str):
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.name = str(target)
        self.path = resolve_target_path(target)
        self.config = AutoConfig.from_pretrained(self.path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.config_sha256 = config_sha256(self.config.to_dict())
        try:
            eos = GenerationConfig.from_pretrained(self.path).eos_token_id
        except OSError:
            eos = getattr(self.config, "eos_token_id", None)
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self.eos_ids = sorted(set(eos if isinstance(eos, list) else [eos]) - {None})

    def describe(self) -> dict[str, Any]:
        text = self.config.get_text_config() if hasattr(self.config, "get_text_config") \
            else self.config
        return {"name": self.name, "path": self.path, "config_sha256": self.config_sha256,
                "architecture": (self.config.architectures or ["?"])[0],
                "num_layers": int(text.num_hidden_layers),
                "hidden_size": int(text.hidden_size), "vocab_size": int(text.vocab_size),
                "max_position_embeddings": getattr(text, "max_position_embeddings", None)}


def _names(values) -> set[str]:
    out = set()
    for v in values:
        if not v:
            continue
        v = str(v).rstrip("/")
        out |= {v.lower(), os.path.basename(v).lower()}
        if v in TARGET_PRESETS:
            out.add(preset_dir(v).name.lower())
    return out


class ServerGenerator:
    """Token ids in, token ids out, through one server; `stats` counts requests, retries
    and failures."""

    def __init__(self, url: str, *, api: str = "sglang", concurrency: int = 8,
                 retries: int = 5, backoff_s: float = 1.0, timeout_s: float = 600.0):
        if api not in APIS:
            raise UserError(f"--api {api!r}: expected one of {', '.join(APIS)}.")
        if concurrency < 1:
            raise UserError("--concurrency must be at least 1.")
        self.url, self.api, self.concurrency = url.rstrip("/"), api, concurrency
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.model: str | None = None  # the served model name (OpenAI requests name it)
        self.stats = {"requests": 0, "retries": 0, "failed": 0}

    def _get(self, path: str) -> Any:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, json.JSONDecodeError, ValueError):
            return None

    def identity(self) -> dict[str, Any]:
        """The names the server gives its model (and which route said so)."""
        if self.api == "openai":
            obj = self._get("/v1/models")
            data = (obj or {}).get("data") or []
            if data:
                self.model = data[0].get("id")
                return {"route": "/v1/models", "names": [v for d in data for v in
                                                         (d.get("id"), d.get("root")) if v]}
        for path in ("/get_server_info", "/server_info", "/model_info"):
            obj = self._get(path)
            if isinstance(obj, dict) and obj.get("model_path"):
                return {"route": path, "names": [obj["model_path"],
                                                 obj.get("served_model_name")]}
        asked = "/v1/models, " if self.api == "openai" else ""
        raise UserError(f"{self.url} does not say which model it serves (no answer from "
                        f"{asked}/get_server_info, /server_info, /model_info). Is the server "
                        f"up, and is --api {self.api} its API?")

    def check_identity(self, target: TargetInfo, expect: str | None = None) -> dict:
        """Refuse (UserError) unless the server's model is the target (or `expect`)."""
        ident = self.identity()
        served = _names(ident["names"])
        wanted = _names([expect] if expect else [target.name, target.path])
        if not served & wanted:
            raise UserError(
                f"The server at {self.url} serves {[n for n in ident['names'] if n]} "
                f"({ident['route']}), not the target {target.name!r} ({target.path}). "
                f"Records from another model would be wrong; nothing was written. Point "
                f"--server at a server of the target, or, if it serves the target under "
                f"another name, pass --server-model NAME.")
        return ident

    def _body(self, ids: list[int], sp: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        greedy = sp["temperature"] <= 0
        if self.api == "sglang":
            s = {"max_new_tokens": sp["max_new_tokens"], "temperature": sp["temperature"],
                 "stop_token_ids": sp["stop_token_ids"], "skip_special_tokens": True}
            if not greedy:
                s.update(top_p=sp["top_p"], sampling_seed=sp["seed"])
            return "/generate", {"input_ids": ids, "sampling_params": s}
        body = {"prompt": ids, "max_tokens": sp["max_new_tokens"],
                "temperature": sp["temperature"], "stop_token_ids": sp["stop_token_ids"],
                "return_token_ids": True, "skip_special_tokens": True}
        if self.model:
            body["model"] = self.model
        if not greedy:
            body.update(top_p=sp["top_p"], seed=sp["seed"])
        return "/v1/completions", body

    def _answer(self, obj: Any) -> tuple[list[int], str]:
        """(output ids incl. a matched stop token, "stop"|"length") from either API;
        CutShort for an answer that ended otherwise (aborted: retried)."""
        if self.api == "sglang":
            fr = (obj.get("meta_info") or {}).get("finish_reason") or {}
            ids = list(obj["output_ids"])
            finish = fr.get("type") or "length"
            matched = fr.get("matched")
            if finish == "stop" and isinstance(matched, int) and (not ids or ids[-1] != matched):
                ids.append(matched)  # a release that strips the stop token from output_ids
        else:
            ch = obj["choices"][0]
            if ch.get("token_ids") is None:
                raise UserError(f"{self.url}/v1/completions returned no token_ids: the "
                                f"server ignores vLLM's return_token_ids. Use --api sglang "
                                f"for SGLang's native /generate (token ids in, token ids "
                                f"out).")
            ids, finish = list(ch["token_ids"]), ch.get("finish_reason") or "length"
        if finish not in ("stop", "length"):
            raise CutShort(f"finish reason {finish!r} after {len(ids)} tokens")
        return ids, finish

    async def _request(self, session, key: str, ids: list[int], sp: dict) -> tuple:
        import aiohttp

        path, body = self._body(ids, sp)
        last = None
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            self.stats["requests"] += 1
            try:
                async with session.post(self.url + path, json=body) as r:
                    text = await r.text()
                    if r.status == 200:
                        return self._answer(json.loads(text))
                    last = f"HTTP {r.status}: {text[:200]}"
                    if 400 <= r.status < 500 and r.status not in (408, 429):
                        break  # the request itself is wrong: retrying will not help
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError,
                    json.JSONDecodeError, CutShort) as e:
                last = f"{type(e).__name__}: {e}"
        self.stats["failed"] += 1
        raise UserError(f"Prompt {key!r}: {self.url}{path} failed after {attempt + 1} "
                        f"attempt(s): {last}. The records written so far are kept; re-run "
                        f"the same command to resume.")

    def generate_ordered(self, jobs: list[tuple[str, list[int], dict[str, Any]]],
                         write: Callable[[int, list[int], str], None]) -> None:
        """Send every (key, prompt ids, sampling) with `concurrency` in flight; call
        `write(index, output ids, finish)` in the jobs' order as answers complete."""
        asyncutil.run(self._run(jobs, write))

    async def _run(self, jobs, write) -> None:
        import aiohttp

        results: dict[int, tuple] = {}
        next_i = 0
        queue: asyncio.Queue = asyncio.Queue()
        for i, job in enumerate(jobs):
            queue.put_nowait((i, job))
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async def worker():
                nonlocal next_i
                while True:
                    try:
                        i, (key, ids, sp) = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    results[i] = await self._request(session, key, ids, sp)
                    while next_i in results:  # hand back in order: the file is a prefix
                        write(next_i, *results.pop(next_i))
                        next_i += 1

            workers = [asyncio.ensure_future(worker()) for _ in range(self.concurrency)]
            try:
                await asyncio.gather(*workers)
            finally:
                for w in workers:
                    w.cancel()


def connect(target, server: str, *, many_ranks: bool, api: str, concurrency: int,
            retries: int, server_model: str | None
            ) -> tuple[TargetInfo, ServerGenerator, dict[str, Any]]:
    """A data stage's server: the target's tokenizer and config (no weights), the client,
    and the server's model identity, checked against the target before anything is
    written (UserError otherwise; also under torchrun, where the server is the scale)."""
    if many_ranks:
        raise UserError("--server with torchrun: the server runs the GPUs; run one "
                        "process and raise --concurrency instead.")
    tgt = TargetInfo(target)
    gen = ServerGenerator(server, api=api, concurrency=concurrency, retries=retries)
    return tgt, gen, gen.check_identity(tgt, server_model)


def regenerate_through_server(gen: ServerGenerator, tgt: TargetInfo, batches, *, f,
                              encode, record, params: dict[str, Any], progress=None
                              ) -> tuple[int, int, list[str]]:
    """The pending prompts of `regenerate` (its batches, in order) through `gen`:
    (new records, new tokens, prompt ids skipped as too long). `encode(prompt)` -> ids or
    None (too long); `record(prompt, prompt ids, response ids, text, finish, seed)`; each
    record is appended to `f` and fsynced as soon as the ones before it are written."""
    jobs, prompts, skipped = [], [], []
    for idx, p in (item for b in batches for item in b):
        ids = encode(p)
        if ids is None:
            skipped.append(p.id)
            continue
        seed = params["seed"] + idx
        jobs.append((p.id, ids, {**params, "seed": seed, "stop_token_ids": tgt.eos_ids}))
        prompts.append((p, ids, seed))
    counts = {"records": 0, "tokens": 0}

    def write(i: int, out_ids: list[int], finish: str) -> None:
        p, ids, seed = prompts[i]
        text = tgt.tokenizer.decode(out_ids, skip_special_tokens=True)
        rec = record(p, ids, out_ids, text, finish, seed if params["temperature"] > 0
                     else None)
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
        counts["records"] += 1
        counts["tokens"] += len(out_ids)
        if progress is not None:
            progress(1)

    gen.generate_ordered(jobs, write)
    return counts["records"], counts["tokens"], skipped


def server_summary(gen: ServerGenerator, ident: dict, started: float) -> dict[str, Any]:
    """What the meta file records about the server run."""
    return {"url": gen.url, "api": gen.api, "concurrency": gen.concurrency,
            "model": ident, "requests": gen.stats["requests"],
            "retries": gen.stats["retries"], "failed": gen.stats["failed"],
            "seconds": round(time.time() - started, 2)}

