"""Regenerate training responses with the target itself.

A drafter learns to predict the *target's* next tokens; training it on someone else's
answers (ShareGPT text, a bigger model's outputs) teaches a distribution the target never
produces, and acceptance suffers. This module has the target answer each prompt with its
own chat template, batched, greedy or seeded sampling, and writes one JSONL record per
prompt (ids + assistant-only loss mask).

Resumable: records are appended and fsynced a batch at a time; a re-run skips prompt ids
already written (a torn last line from a crash is cut off first; a bad line before good
ones is refused, not cut), so a prompt is never
answered twice. The parameters are recorded in `<out>.meta.json`; a re-run with different
ones is refused instead of mixing two kinds of responses in one file. How the prompts were
rendered (chat template sha256 and source, system prompt, template kwargs, tokenizer
sha256: `eagle3lab.data.rendering`) is the meta's "rendering"; the template's sha256 and
kwargs are parameters too (a file made before they were recorded: the tokenizer's
template, no kwargs). `conversations_rendering` reads it back (no meta: unknown).

Under torchrun the batches are dealt to the ranks and their answers merged into one file
in the prompts' order, the same file one process writes (`eagle3lab.data.rankparts`).

With `server=URL` a serving engine generates instead (`eagle3lab.data.remote`): the chat
template is still applied here (token ids go out, so the loss mask is exact), the server's
model must be the target (checked before anything is written), N requests are in flight,
failed ones are retried with backoff; greedy records equal in-process ones token for
token where both round alike (fp32; a bf16 engine's kernels part from transformers' after
a near-tie: docs/vllm.md). The target's weights are not loaded then (tokenizer and config
only).

With `engine="static"` eagle3lab's own batched decoder generates in this process
(`eagle3lab.specdec.batched.BatchedEngine`: static KV cache, CUDA graphs, `batch_size`
rows in flight, each refilled with the next prompt as its answer ends, the refilled rows
prefilled together), a chunk of `STATIC_CHUNK_ROWS * batch_size` prompts per unit (each
chunk appended and fsynced as one, in the prompts' order, so resuming is as with batches).
Transformers' `generate` (engine "hf") copies its growing cache every step and pads every
batch to its longest answer; on a GPU that, not the model, sets the pace. Greedy static
records equal hf ones where both round alike (fp32); sampled ones are seeded per prompt
(seed + prompt index, the record's `seed`), so they do not depend on the chunking. The
engine is part of a file's identity (files made before it read as "hf"). The data layer
cannot import specdec (a higher layer), so the engine's class is passed beside the config
(`engine_class`), as a loaded target is; `eagle3lab regenerate --engine static` does so.

The settings are `RegenerateConfig`; the run is `eagle3lab.data.stage.Stage`'s order (a
unit is one batch of prompts, or one chunk for the static engine; through a server, this
rank's whole share).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from eagle3lab import __version__
from eagle3lab.config import PathStr, cli_group
from eagle3lab.errors import UserError
from eagle3lab.fsutil import (atomic_write_json, check_writable_dir, read_appended_jsonl,
                              read_json_object)
from eagle3lab.data import rankparts, remote
from eagle3lab.data.prompts import (chat_prompt_ids, conversation_record, load_prompts,
                                    meta_path, prompts_fingerprint)
from eagle3lab.data.rendering import template_sha256, tokenizer_template, unknown
from eagle3lab.data.stage import GenerationConfig, GenerationStage, build_config

#: Parameters that change what a response is; a resumed run must use the same ones.
_IDENTITY_KEYS = ("target_config_sha256", "prompts_sha256", "max_new_tokens", "temperature",
                  "top_p", "seed", "system_prompt", "samples", "engine",
                  "chat_template_sha256", "template_kwargs")
#: What a file made before a key existed was made with (a file made before rendering was
#: recorded: the tokenizer's template, `rendering_defaults`).
_IDENTITY_DEFAULTS = {"samples": 1, "engine": "hf"}


def rendering_defaults(tokenizer) -> dict[str, Any]:
    """The rendering parameters of a file made before they were recorded: the tokenizer's
    own template, no template kwargs (what every stage rendered with then)."""
    return {"chat_template_sha256": template_sha256(tokenizer_template(tokenizer)),
            "template_kwargs": {}}


def conversations_rendering(path: str | os.PathLike) -> dict[str, Any]:
    """The rendering record of a conversations (or prompts) file: its `<out>.meta.json`'s
    "rendering"; a file without a meta, or a meta without the record (made before it was
    recorded, or elsewhere), is `unknown`, never a match."""
    path = Path(path)
    mpath = meta_path(path)
    if not mpath.is_file():
        return unknown(f"{path.name} has no {mpath.name} (not written by eagle3lab "
                       f"regenerate)")
    meta = read_json_object(mpath, what="meta file")
    rec = meta.get("rendering")
    if not isinstance(rec, dict):
        return unknown(f"{mpath.name} records no rendering (made before eagle3lab recorded "
                       f"it)")
    return rec
#: The static engine's unit: this many times batch_size prompts (the rows stay full but
#: for the chunk's tail; a killed run loses at most the chunk in flight).
STATIC_CHUNK_ROWS = 16
#: Rows the static engine prefills together when they are refilled at once.
STATIC_PREFILL_ROWS = 64


def read_meta(out: Path, kind: str) -> dict[str, Any] | None:
    """The `<out>.meta.json` that a resumed run compares its parameters with (None when
    `out` or its meta file does not exist yet); a corrupt one is refused, naming it, since
    without it `out` cannot be resumed safely."""
    mpath = meta_path(out)
    if not (out.exists() and mpath.exists()):
        return None
    fix = (f"It records the parameters {out.name} was made with, so {out.name} cannot be "
           f"resumed without it: delete both files to start over, or choose a new --out.")
    meta = read_json_object(mpath, what="meta file", fix=fix)
    if meta.get("kind", kind) != kind or not isinstance(meta.get("params", {}), dict):
        raise UserError(f"The meta file {mpath} is not a {kind} meta file (kind "
                        f"{meta.get('kind')!r}, params {type(meta.get('params')).__name__}). "
                        + fix)
    return meta


def made_with_engine(out: str | os.PathLike) -> str | None:
    """The engine an existing responses file was made with (its meta's; a file made before
    the engine was recorded: `_IDENTITY_DEFAULTS`'), None when there is none yet: a caller
    that picks the engine itself (the pipeline) resumes a file with it instead of having
    the file refused as made with other parameters."""
    meta = read_meta(Path(out), "eagle3lab-conversations")
    return None if meta is None else {**_IDENTITY_DEFAULTS, **meta.get("params", {})}["engine"]


class RegenerateConfig(GenerationConfig):
    """`regenerate`'s settings (`eagle3lab regenerate`'s options)."""

    WHERE: ClassVar[str] = "regenerate"

    prompts: PathStr = Field("train", description="'train' or 'eval' (shipped sets) or a "
                             "JSONL file of {\"prompt\": ...}", json_schema_extra=cli_group("data"))
    out: PathStr = Field(description="output JSONL file (appended to on resume)",
                         json_schema_extra=cli_group("data"))
    limit: int | None = Field(None, description="use only the first N prompts",
                              json_schema_extra=cli_group("data"))
    max_new_tokens: int = Field(256, ge=1, description="answer length cap",
                                json_schema_extra=cli_group("generation"))
    batch_size: int = Field(16, ge=1, description="prompts generated together",
                            json_schema_extra=cli_group("generation"))
    temperature: float = Field(0.0, description="0 = greedy",
                               json_schema_extra=cli_group("generation"))
    top_p: float = Field(1.0, description="nucleus sampling (temperature > 0)",
                         json_schema_extra=cli_group("generation"))
    seed: int = Field(0, description="sampling seed (per batch: seed + index)",
                      json_schema_extra=cli_group("generation"))
    max_prompt_tokens: int = Field(1024, ge=1, description="prompts longer than this many "
                                   "tokens (chat template applied) are skipped",
                                   json_schema_extra=cli_group("generation"))
    samples: int = Field(1, ge=1, description="sampled answers per prompt (ids PROMPT#k; "
                         "needs --temperature > 0)", json_schema_extra=cli_group("generation"))
    engine: Literal["hf", "static"] = Field(
        "hf", description="hf: transformers' generate, padded batches; static: eagle3lab's "
        "BatchedEngine (static KV cache + CUDA graphs, batch_size rows in flight refilled as "
        "answers finish; for GPUs; sampled answers seeded per prompt: seed + index)",
        json_schema_extra=cli_group("generation"))

    def check(self, where: str) -> None:
        if self.samples > 1 and self.temperature <= 0:
            raise UserError("samples > 1 needs temperature > 0 (greedy answers would repeat).")
        if self.engine == "static" and self.server is not None:
            raise UserError(f"{where}: engine 'static' generates in this process; with "
                            f"server={self.server} the server generates. Drop one of the two.")
        if self.engine == "static" and self.device_map is not None:
            raise UserError(f"{where}: engine 'static' runs the target on one device; drop "
                            f"device_map={self.device_map} or use engine 'hf'.")


def regenerate(config: RegenerateConfig | dict[str, Any] | None = None, /, *,
               target: Any = None, progress: bool = True, engine_class: Any = None,
               **options: Any) -> dict[str, Any]:
    """Have the target answer `prompts`; append JSONL records to `out`. Returns a summary.

    config / options: `RegenerateConfig` (or its fields as keyword arguments, which
    override a config's). target: a preset name, an HF directory / hub id, or an already
    loaded `Target`.
    temperature 0 = greedy; otherwise sampling seeded per batch with seed + first index.
    samples: answers per prompt (record ids PROMPT_ID#k; use with temperature > 0).
    device_map: accelerate's device map for a target larger than one GPU.
    Under torchrun the batches (the same as one process forms) are dealt to the ranks in
    turn; rank r appends its answers to its part file and rank 0 merges them into `out` in
    the prompts' order (`eagle3lab.data.rankparts`). Every rank returns the same summary.
    server: a serving engine's URL generates instead (api "sglang": native /generate with
    input_ids; "openai": /v1/completions with token ids), `concurrency` requests in
    flight, `retries` per request with backoff; `server_model` names the served model when
    it is not the target's name. Sampled answers are seeded per prompt (seed + index).
    engine "static": `engine_class` is `eagle3lab.specdec.batched.BatchedEngine` (or a class
    with its constructor and `generate_many`); chunks of prompts are units; sampled answers
    are seeded per prompt (seed + index).
    """
    cfg, loaded = build_config(RegenerateConfig, config, target, options)
    if cfg.engine == "static" and engine_class is None:
        raise UserError("regenerate: engine 'static' needs its class passed beside the config "
                        "(engine_class=eagle3lab.specdec.batched.BatchedEngine: the data "
                        "layer cannot import specdec); `eagle3lab regenerate --engine static` "
                        "passes it.")
    stage = RegenerateStage(cfg, target=loaded, progress=progress)
    stage.engine_class = engine_class
    return stage.run()


class RegenerateStage(GenerationStage[RegenerateConfig]):
    """plan: the prompts, the target (or the server), the parameters; resume: the parameter
    check, a killed run's rank parts merged, the ids done; a unit: one batch (the batches
    one process forms, dealt to the ranks), or through a server this rank's whole share,
    whose records are written as they arrive; merge: rank 0 merges the ranks' parts into
    `out` in the prompts' order."""

    CONFIG = RegenerateConfig
    #: the static engine's class (`regenerate`'s engine_class) and, once built, the engine
    engine_class: Any = None
    engine: Any = None

    def plan(self) -> None:
        cfg = self.config
        self.out = out = Path(cfg.out)
        check_writable_dir(out.parent)
        plist = load_prompts(cfg.prompts, limit=cfg.limit)
        self.old = read_meta(out, "eagle3lab-conversations")
        if cfg.samples > 1:
            plist = [dataclasses.replace(p, id=f"{p.id}#{k}") for k in range(cfg.samples)
                     for p in plist]
        self.tgt, self.gen, self.ident = self.load_target()
        # the template is applied here also through a server (token ids go out)
        self.renderer = cfg.renderer(self.tgt.tokenizer)
        self.rendering = self.renderer.record()
        self.fp = prompts_fingerprint(cfg.prompts)
        self.params = {
            "target_config_sha256": self.tgt.config_sha256, "prompts_sha256": self.fp["sha256"],
            "max_new_tokens": cfg.max_new_tokens, "temperature": float(cfg.temperature),
            "top_p": float(cfg.top_p), "seed": cfg.seed, "system_prompt": cfg.system_prompt,
            "samples": cfg.samples, "engine": cfg.engine,
            "chat_template_sha256": self.rendering["chat_template"]["sha256"],
            "template_kwargs": self.rendering["template_kwargs"],
        }
        self.mpath = meta_path(out)
        self.plist = plist
        self.known = {p.id for p in plist}
        self.order = {p.id: i for i, p in enumerate(plist)}

    def resume(self) -> dict[str, Any]:
        """Rank 0 (or the one process): parameter check, leftover parts, what is done."""
        out, old, params = self.out, self.old, self.params
        if old is not None:
            old_params = {**_IDENTITY_DEFAULTS, **rendering_defaults(self.tgt.tokenizer),
                          **old.get("params", {})}  # older files
            diff = [k for k in _IDENTITY_KEYS if old_params.get(k) != params[k]]
            if diff:
                raise UserError(
                    f"{out} was made with different parameters ({', '.join(diff)}: "
                    + ", ".join(f"{k}={old_params.get(k)!r} now {params[k]!r}" for k in diff)
                    + "). Resuming would mix two kinds of responses; choose a new --out or "
                    f"delete {out} and {self.mpath}.")
        rankparts.merge_jsonl_parts(out, self.order, "conversation record")  # of a killed run
        done = set(read_appended_jsonl(out, lambda r: "id" in r, "conversation record",
                                       keep=lambda r: r["id"]))
        cfg = self.config
        meta = {
            "kind": "eagle3lab-conversations", "eagle3lab": __version__,
            "target": self.tgt.describe(), "prompts": self.fp, "params": params,
            "rendering": self.rendering, "batch_size": cfg.batch_size, "limit": cfg.limit,
            "records": len(done & self.known), "skipped_too_long": [],
        }
        if cfg.temperature > 0:  # how a record's `seed` was chosen
            meta["seeding"] = ("per prompt: seed + prompt index" if cfg.engine == "static"
                               else "per batch: seed + the batch's first prompt index")
        atomic_write_json(self.mpath, meta)
        return {"done": done, "meta": meta}

    def start(self, state: dict[str, Any]) -> None:
        cfg, ranks = self.config, self.ranks
        done, self.meta = state["done"], state["meta"]
        pending = [(i, p) for i, p in enumerate(self.plist) if p.id not in done]
        # the batches (static engine: chunks) one process forms (so the same padding and
        # seeds), dealt to the ranks
        size = cfg.batch_size * (STATIC_CHUNK_ROWS if cfg.engine == "static" else 1)
        batches = [pending[b:b + size] for b in range(0, len(pending), size)]
        self.mine = batches[ranks.rank::ranks.world_size]
        dest = rankparts.jsonl_part_path(self.out, ranks.rank) if ranks.many else self.out
        self.tok = tok = self.tgt.tokenizer
        self.new_tokens, self.new_records, self.skipped = 0, 0, []
        self.make_bar(total=sum(len(b) for b in self.mine), desc="regenerate", unit="prompt")
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        eos_ids = (self.tgt.model.generation_config.eos_token_id
                   if self.gen is None and self.mine else None)
        self.eos_set = set(eos_ids if isinstance(eos_ids, list)
                           else [eos_ids or tok.eos_token_id])
        self.f = open(dest, "a", encoding="utf-8")

    def units(self):
        if self.gen is not None:
            yield self.mine  # the server's client keeps `concurrency` requests in flight
        else:
            yield from self.mine

    def encode(self, p) -> list[int] | None:
        """A prompt's ids through the chat template (None: longer than max_prompt_tokens)."""
        ids = chat_prompt_ids(self.tok, p.prompt, renderer=self.renderer)
        return None if len(ids) > self.config.max_prompt_tokens else ids

    def compute(self, batch) -> tuple[list[dict[str, Any]], int, list[str]] | None:
        """(records, new tokens, ids skipped as too long) of a batch; through a server, of
        the whole share, its records already written (None then)."""
        import torch

        cfg, tgt = self.config, self.tgt
        if self.gen is not None:
            n, tokens, skipped = remote.regenerate_through_server(
                self.gen, tgt, batch, f=self.f, encode=self.encode,
                record=conversation_record,
                params={"max_new_tokens": cfg.max_new_tokens,
                        "temperature": float(cfg.temperature), "top_p": float(cfg.top_p),
                        "seed": cfg.seed}, progress=self.bar.update)
            self.new_records, self.new_tokens, self.skipped = n, tokens, skipped
            self.meta["server"] = remote.server_summary(self.gen, self.ident, self.t0)
            return None
        encoded, kept, skipped = [], [], []
        for idx, p in batch:
            ids = self.encode(p)
            if ids is None:
                skipped.append(p.id)
                continue
            encoded.append(ids)
            kept.append((idx, p))
        if not kept:
            return [], 0, skipped
        if cfg.engine == "static":
            return self.compute_static(kept, encoded, skipped)
        pad_id = self.pad_id
        width = max(len(e) for e in encoded)
        input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
        attn = torch.zeros_like(input_ids)
        for r, e in enumerate(encoded):  # left padding: all answers start at `width`
            input_ids[r, width - len(e):] = torch.tensor(e)
            attn[r, width - len(e):] = 1
        batch_seed = cfg.seed + kept[0][0]
        gen_kwargs: dict[str, Any] = {"max_new_tokens": cfg.max_new_tokens,
                                      "pad_token_id": pad_id,
                                      "eos_token_id": list(self.eos_set)}
        if cfg.temperature > 0:
            torch.manual_seed(batch_seed)
            gen_kwargs.update(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p,
                              top_k=0)
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            gen = tgt.model.generate(input_ids=input_ids.to(tgt.device),
                                     attention_mask=attn.to(tgt.device), **gen_kwargs)
        return self.records(kept, encoded, [gen[r, width:].tolist() for r in range(len(kept))],
                            [batch_seed] * len(kept), skipped)

    def compute_static(self, kept, encoded, skipped):
        """`compute` of a chunk with the static engine (built once, on the first chunk):
        its rows stay full while prompts remain; sampled answers seeded per prompt."""
        cfg = self.config
        if self.engine is None:
            self.engine = self.engine_class(self.tgt, None, batch_size=cfg.batch_size,
                                            prefill_rows=STATIC_PREFILL_ROWS)
        seeds = [cfg.seed + idx for idx, _ in kept]
        results = self.engine.generate_many(
            encoded, max_new_tokens=cfg.max_new_tokens, temperature=float(cfg.temperature),
            top_p=float(cfg.top_p), seeds=seeds if cfg.temperature > 0 else None,
            stop_token_ids=self.eos_set, on_done=lambda i, res: self.bar.update(1))
        return self.records(kept, encoded, [r.output_ids for r in results], seeds, skipped)

    def records(self, kept, encoded, outputs, seeds, skipped):
        """(records, new tokens, skipped ids): each answer cut after its first stop token
        and decoded as every engine's is."""
        cfg = self.config
        records, tokens = [], 0
        for r, (idx, p) in enumerate(kept):
            resp = outputs[r]
            stop = next((k for k, t in enumerate(resp) if t in self.eos_set), None)
            finish = "stop" if stop is not None else "length"
            resp = resp[:stop + 1] if stop is not None else resp
            text = self.tok.decode(resp, skip_special_tokens=True)
            records.append(conversation_record(p, encoded[r], resp, text, finish,
                                               seeds[r] if cfg.temperature > 0 else None))
            tokens += len(resp)
        return records, tokens, skipped

    def write(self, batch, result) -> None:
        """Append a batch's records (fsynced: a killed run keeps every whole batch)."""
        if result is None:  # through a server: written as they arrived
            return
        records, tokens, skipped = result
        self.skipped += skipped
        if records:
            for rec in records:
                self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.f.flush()
            os.fsync(self.f.fileno())
            self.new_tokens += tokens
            self.new_records += len(records)
        # the static engine counts its prompts as they finish, here only those skipped
        self.bar.update(len(batch) if self.config.engine == "hf" else len(result[2]))
        if records:
            self.bar.set_postfix(
                tok_s=f"{self.new_tokens / max(time.time() - self.t0, 1e-9):.1f}")

    def close(self) -> None:
        self.f.close()

    def merge(self) -> dict[str, Any]:
        ranks, out, meta = self.ranks, self.out, self.meta
        new_records, new_tokens, skipped = self.new_records, self.new_tokens, self.skipped
        if ranks.many:  # every rank's part is complete once all have gathered here
            counts = ranks.gather((new_records, new_tokens, skipped))
            new_records, new_tokens = sum(c[0] for c in counts), sum(c[1] for c in counts)
            skipped = sorted((s for c in counts for s in c[2]), key=self.order.get)
            ranks.on_main(lambda: rankparts.merge_jsonl_parts(out, self.order,
                                                              "conversation record"))
        elapsed = time.time() - self.t0
        meta["records"] += new_records
        meta["skipped_too_long"] = skipped
        meta["last_run"] = {"new_records": new_records,
                            "new_tokens": new_tokens, "seconds": round(elapsed, 2),
                            "tokens_per_s": (round(new_tokens / elapsed, 2) if elapsed > 0
                                             else None)}
        if ranks.main:
            atomic_write_json(self.mpath, meta)
            if meta["skipped_too_long"]:
                print(f"warning: {len(meta['skipped_too_long'])} prompt(s) longer than "
                      f"{self.config.max_prompt_tokens} tokens were skipped: "
                      f"{meta['skipped_too_long'][:5]}")
        return {"out": str(out), "records": meta["records"], "new_records":
                meta["last_run"]["new_records"], "new_tokens": new_tokens,
                "seconds": elapsed, "tokens_per_s": meta["last_run"]["tokens_per_s"]}
