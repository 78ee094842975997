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
ones is refused instead of mixing two kinds of responses in one file.

Under torchrun the batches are dealt to the ranks and their answers merged into one file
in the prompts' order, the same file one process writes (`eagle3lab.data.rankparts`).

With `server=URL` a serving engine generates instead (`eagle3lab.data.remote`): the chat
template is still applied here (token ids go out, so the loss mask is exact), the server's
model must be the target (checked before anything is written), N requests are in flight,
failed ones are retried with backoff; greedy records equal in-process ones token for
token where both round alike (fp32; a bf16 engine's kernels part from transformers' after
a near-tie: docs/vllm.md). The target's weights are not loaded then (tokenizer and config
only).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from eagle3lab import __version__
from eagle3lab.config import DEFAULT_TARGET
from eagle3lab.distributed import Ranks
from eagle3lab.errors import UserError
from eagle3lab.fsutil import (atomic_write_json, check_writable_dir, read_appended_jsonl,
                              read_json_object)
from eagle3lab.data import rankparts, stagerun
from eagle3lab.data.prompts import chat_prompt_ids, conversation_record, load_prompts, prompts_fingerprint

#: Parameters that change what a response is; a resumed run must use the same ones.
_IDENTITY_KEYS = ("target_config_sha256", "prompts_sha256", "max_new_tokens", "temperature",
                  "top_p", "seed", "system_prompt", "samples")


def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


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


def regenerate(
    *, target: Any = DEFAULT_TARGET, prompts: str | os.PathLike = "train",
    out: str | os.PathLike, limit: int | None = None, max_new_tokens: int = 256,
    batch_size: int = 16, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
    system_prompt: str | None = None, max_prompt_tokens: int = 1024, samples: int = 1,
    device: str = "auto", dtype: str = "float32", progress: bool = True,
    device_map: str | None = None, dist_timeout: float = stagerun.DEFAULT_TIMEOUT_S,
    server: str | None = None, api: str = "sglang", concurrency: int = 8,
    server_model: str | None = None, retries: int = 5,
) -> dict[str, Any]:
    """Have the target answer `prompts`; append JSONL records to `out`. Returns a summary.

    target: a preset name, an HF directory / hub id, or an already loaded `Target`.
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
    """
    if server is not None and device_map is None:
        device = "cpu"  # nothing is loaded on a device here; the server generates
    return stagerun.run_stage(_regenerate, locals())  # every argument above


def _regenerate(ranks: Ranks, *, target, prompts, out, limit, max_new_tokens,
                batch_size, temperature, top_p, seed, system_prompt, max_prompt_tokens,
                samples, device, dtype, progress, device_map, server, api, concurrency,
                server_model, retries) -> dict[str, Any]:
    import torch
    from tqdm.auto import tqdm

    if batch_size < 1 or max_new_tokens < 1:
        raise UserError("batch_size and max_new_tokens must be at least 1.")
    out = Path(out)
    check_writable_dir(out.parent)
    plist = load_prompts(prompts, limit=limit)
    old = read_meta(out, "eagle3lab-conversations")
    if samples > 1:
        if temperature <= 0:
            raise UserError("samples > 1 needs temperature > 0 (greedy answers would repeat).")
        plist = [dataclasses.replace(p, id=f"{p.id}#{k}") for k in range(samples) for p in plist]
    gen = ident = None
    if server is not None:
        from eagle3lab.data import remote

        tgt, gen, ident = remote.connect(target, server, many_ranks=ranks.many, api=api,
                                      concurrency=concurrency, retries=retries,
                                      server_model=server_model)  # checked before writing
    else:
        tgt = stagerun.load_rank_target(target, ranks, device=device, dtype=dtype,
                                        device_map=device_map)
    fp = prompts_fingerprint(prompts)
    params = {
        "target_config_sha256": tgt.config_sha256, "prompts_sha256": fp["sha256"],
        "max_new_tokens": max_new_tokens, "temperature": float(temperature),
        "top_p": float(top_p), "seed": seed, "system_prompt": system_prompt,
        "samples": samples,
    }
    mpath = meta_path(out)
    known = {p.id for p in plist}
    order = {p.id: i for i, p in enumerate(plist)}

    def prepare() -> dict[str, Any]:
        """Rank 0 (or the one process): parameter check, leftover parts, what is done."""
        if old is not None:
            old_params = {"samples": 1, **old.get("params", {})}  # files made before `samples`
            diff = [k for k in _IDENTITY_KEYS if old_params.get(k) != params[k]]
            if diff:
                raise UserError(
                    f"{out} was made with different parameters ({', '.join(diff)}: "
                    + ", ".join(f"{k}={old_params.get(k)!r} now {params[k]!r}" for k in diff)
                    + "). Resuming would mix two kinds of responses; choose a new --out or "
                    f"delete {out} and {mpath}.")
        rankparts.merge_jsonl_parts(out, order, "conversation record")  # of a killed run
        done = set(read_appended_jsonl(out, lambda r: "id" in r, "conversation record",
                                       keep=lambda r: r["id"]))
        meta = {
            "kind": "eagle3lab-conversations", "eagle3lab": __version__,
            "target": tgt.describe(), "prompts": fp, "params": params,
            "batch_size": batch_size, "limit": limit,
            "records": len(done & known), "skipped_too_long": [],
        }
        atomic_write_json(mpath, meta)
        return {"done": done, "meta": meta}

    state = ranks.on_main(prepare)
    done, meta = state["done"], state["meta"]
    pending = [(i, p) for i, p in enumerate(plist) if p.id not in done]
    # the batches one process forms (so the same padding and seeds), dealt to the ranks
    batches = [pending[b:b + batch_size] for b in range(0, len(pending), batch_size)]
    mine = batches[ranks.rank::ranks.world_size]
    dest = rankparts.jsonl_part_path(out, ranks.rank) if ranks.many else out

    tok = tgt.tokenizer
    new_tokens, new_records, skipped = 0, 0, []
    t0 = time.time()
    bar = tqdm(total=sum(len(b) for b in mine), desc="regenerate", unit="prompt",
               disable=not (progress and ranks.main))
    if gen is not None:
        from eagle3lab.data import remote

        def encode(p):
            ids = chat_prompt_ids(tok, p.prompt, system_prompt)
            return None if len(ids) > max_prompt_tokens else ids

        with open(dest, "a", encoding="utf-8") as f:
            new_records, new_tokens, skipped = remote.regenerate_through_server(
                gen, tgt, mine, f=f, encode=encode, record=conversation_record,
                params={"max_new_tokens": max_new_tokens, "temperature": float(temperature),
                        "top_p": float(top_p), "seed": seed}, progress=bar.update)
        meta["server"] = remote.server_summary(gen, ident, t0)
        mine = []
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos_ids = tgt.model.generation_config.eos_token_id if mine else None
    eos_set = set(eos_ids if isinstance(eos_ids, list) else [eos_ids or tok.eos_token_id])
    with open(dest, "a", encoding="utf-8") as f:
        for batch in mine:
            encoded, kept = [], []
            for idx, p in batch:
                ids = chat_prompt_ids(tok, p.prompt, system_prompt)
                if len(ids) > max_prompt_tokens:
                    skipped.append(p.id)
                    continue
                encoded.append(ids)
                kept.append((idx, p))
            if not kept:
                bar.update(len(batch))
                continue
            width = max(len(e) for e in encoded)
            input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
            attn = torch.zeros_like(input_ids)
            for r, e in enumerate(encoded):  # left padding: all answers start at `width`
                input_ids[r, width - len(e):] = torch.tensor(e)
                attn[r, width - len(e):] = 1
            batch_seed = seed + kept[0][0]
            gen_kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens,
                                          "pad_token_id": pad_id, "eos_token_id": list(eos_set)}
            if temperature > 0:
                torch.manual_seed(batch_seed)
                gen_kwargs.update(do_sample=True, temperature=temperature, top_p=top_p,
                                  top_k=0)
            else:
                gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            with torch.inference_mode():
                gen = tgt.model.generate(input_ids=input_ids.to(tgt.device),
                                         attention_mask=attn.to(tgt.device), **gen_kwargs)
            for r, (idx, p) in enumerate(kept):
                resp = gen[r, width:].tolist()
                stop = next((k for k, t in enumerate(resp) if t in eos_set), None)
                finish = "stop" if stop is not None else "length"
                resp = resp[:stop + 1] if stop is not None else resp
                text = tok.decode(resp, skip_special_tokens=True)
                rec = conversation_record(p, encoded[r], resp, text, finish,
                                          batch_seed if temperature > 0 else None)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                new_tokens += len(resp)
            f.flush()
            os.fsync(f.fileno())
            new_records += len(kept)
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{new_tokens / max(time.time() - t0, 1e-9):.1f}")
    bar.close()
    if ranks.many:  # every rank's part is complete once all have gathered here
        counts = ranks.gather((new_records, new_tokens, skipped))
        new_records, new_tokens = sum(c[0] for c in counts), sum(c[1] for c in counts)
        skipped = sorted((s for c in counts for s in c[2]), key=order.get)
        ranks.on_main(lambda: rankparts.merge_jsonl_parts(out, order,
                                                          "conversation record"))
    elapsed = time.time() - t0
    meta["records"] += new_records
    meta["skipped_too_long"] = skipped
    meta["last_run"] = {"new_records": new_records,
                        "new_tokens": new_tokens, "seconds": round(elapsed, 2),
                        "tokens_per_s": round(new_tokens / elapsed, 2) if elapsed > 0 else None}
    if ranks.main:
        atomic_write_json(mpath, meta)
        if meta["skipped_too_long"]:
            print(f"warning: {len(meta['skipped_too_long'])} prompt(s) longer than "
                  f"{max_prompt_tokens} tokens were skipped: {meta['skipped_too_long'][:5]}")
    return {"out": str(out), "records": meta["records"], "new_records":
            meta["last_run"]["new_records"], "new_tokens": new_tokens,
            "seconds": elapsed, "tokens_per_s": meta["last_run"]["tokens_per_s"]}
