"""Synthesise user prompts with the target itself (Magpie-style self-prompting).

Prevents a drafter that is starved of data: a few hundred hand-written prompts give a few
hundred greedy answers, and sampling many answers per prompt teaches sampled text while the
drafter is judged on greedy text. Fed its chat template up to the start of a user turn, an
instruction-tuned target writes the user's message itself, from its own distribution of
requests; tens of thousands of distinct prompts cost little GPU time and no download.

Every prompt that is kept finished its turn (the first special token it wrote is the
template's end-of-turn token: a sample that ran out of tokens or opened another turn is
dropped), is long enough, is new (normalised duplicates dropped), and neither equals nor
shares an 8-word run with a held-out eval prompt (`exclude`), so acceptance measured on
those stays held out. Raw counts of every reason a sample was dropped are recorded in
`<out>.meta.json` (`classify` is the filter).

Resumable: accepted prompts are appended a batch at a time (fsynced; a torn last line
from a crash is cut off); a re-run with the same parameters continues at the next batch
and never repeats an id or a batch seed; different parameters are refused.

Under torchrun each rank samples its own batches of a round and every rank filters the
gathered samples in batch order, so the file is the one a single process writes.

With `server=URL` a running serving engine samples instead (`eagle3lab.data.remote`: the
same chat-template prefix as token ids, the same stop tokens, row r of batch b seeded
(seed + b) * batch_size + r; the server's model is checked against the target first). Its
sampler is not torch's, so a file is either sampled here or through a server (`sampler`
in the parameters), never both.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from eagle3lab import __version__
from eagle3lab.config import DEFAULT_TARGET
from eagle3lab.distributed import Ranks
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json, check_writable_dir, read_appended_jsonl
from eagle3lab.data import stagerun
from eagle3lab.data.regenerate import meta_path, read_meta  # one <out>.meta.json convention

_SENTINEL = "\u2063EAGLE3LAB_USER_TURN\u2063"
_IDENTITY_KEYS = ("target_config_sha256", "temperature", "top_p", "seed", "max_new_tokens",
                  "batch_size", "system_prompt", "min_words", "exclude_sha256", "sampler")
SHINGLE = 8  # words in a run that, shared with an eval prompt, excludes a prompt


def normalise(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def shingles(text: str, n: int = SHINGLE) -> set[str]:
    words = normalise(text).split()
    return {" ".join(words[i:i + n]) for i in range(max(len(words) - n + 1, 0))}


#: Why a sample was dropped (keys of the meta file's "counts", beside "sampled" and "kept").
DROP_REASONS = ("unfinished", "too_short", "duplicate", "eval_overlap")


def classify(text: str, stop_found: bool, seen: set[str], held_norm: set[str],
             held_shingles: set[str], min_words: int) -> str | None:
    """Why a sampled user turn is dropped (one of DROP_REASONS), or None to keep it.

    stop_found: the turn ended with the end-of-turn token (else it ran out of tokens or
    started another turn); seen: normalised prompts already kept; held_norm / held_shingles:
    normalised eval prompts and their SHINGLE-word runs."""
    if not stop_found:
        return "unfinished"
    key = normalise(text)
    if len(key.split()) < min_words:
        return "too_short"
    if key in seen:
        return "duplicate"
    if key in held_norm or shingles(text) & held_shingles:
        return "eval_overlap"
    return None


def user_turn_prefix(tokenizer, system_prompt: str | None = None) -> tuple[list[int], int]:
    """(ids of the chat up to where the user's words start, the end-of-turn token id)."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("Self-prompting needs a chat template (an instruction-tuned target); "
                        "this tokenizer has none. Use a prompts file instead.")
    msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": _SENTINEL}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    at = text.find(_SENTINEL)
    if at < 0:
        raise UserError("The chat template dropped the user's message; cannot self-prompt.")
    prefix = tokenizer(text[:at], add_special_tokens=False).input_ids
    after = tokenizer(text[at + len(_SENTINEL):], add_special_tokens=False).input_ids
    if not after:
        raise UserError("The chat template puts nothing after the user's message, so a "
                        "finished user turn cannot be recognised.")
    return [int(i) for i in prefix], int(after[0])


def synthesize_prompts(
    *, target: Any = DEFAULT_TARGET, out: str | os.PathLike, n: int = 1000,
    temperature: float = 1.0, top_p: float = 0.95, max_new_tokens: int = 96,
    batch_size: int = 64, seed: int = 0, min_words: int = 4,
    exclude: str | os.PathLike | None = "eval", system_prompt: str | None = None,
    max_batches: int | None = None, device: str = "auto", dtype: str = "float32",
    progress: bool = True, device_map: str | None = None,
    dist_timeout: float = stagerun.DEFAULT_TIMEOUT_S, server: str | None = None,
    api: str = "sglang", concurrency: int = 8, server_model: str | None = None,
    retries: int = 5,
) -> dict[str, Any]:
    """Have the target write `n` distinct user prompts; append them to `out` (JSONL).

    target: a preset name, an HF directory / hub id, or an already loaded `Target`.
    Batch b is sampled with seed + b. Stops once `out` holds n prompts, or once
    `max_batches` batches were sampled in all (counting those of earlier runs; default:
    enough for n at a 25% keep rate), whichever comes first. exclude: held-out prompts
    ('eval', a prompts file, or None) that no kept prompt may repeat or share an
    8-word run with. Returns a summary with the raw counts and the keep rate.
    device_map: accelerate's device map for a target larger than one GPU.
    Under torchrun rank r samples batches b + r of each round of world-size batches; the
    samples are gathered and every rank filters them in batch order (the filter is
    sequential: duplicates, the n-th prompt), so rank 0 writes what one process writes.
    server / api / concurrency / server_model / retries: a running server samples instead
    (as `regenerate`'s; one process).
    """
    if server is not None and device_map is None:
        device = "cpu"  # nothing is loaded on a device here; the server samples
    return stagerun.run_stage(_synthesize, locals())  # every argument above


def _synthesize(ranks: Ranks, *, target, out, n, temperature, top_p,
                max_new_tokens, batch_size, seed, min_words, exclude, system_prompt,
                max_batches, device, dtype, progress, device_map, server, api, concurrency,
                server_model, retries) -> dict[str, Any]:
    import contextlib

    import torch
    from tqdm.auto import tqdm

    from eagle3lab.data.prompts import load_prompts, prompts_fingerprint

    if n < 1 or batch_size < 1 or max_new_tokens < 4:
        raise UserError("n and batch_size must be >= 1 and max_new_tokens >= 4.")
    if temperature <= 0:
        raise UserError("Self-prompting samples (temperature > 0); greedy would write one "
                        "prompt over and over.")
    out = Path(out)
    check_writable_dir(out.parent)
    old_meta = read_meta(out, "eagle3lab-prompts")
    if old_meta is not None and not isinstance(old_meta.get("counts"), dict):
        raise UserError(f"The meta file {meta_path(out)} has no 'counts' object; delete both "
                        f"{out} and {meta_path(out)} to start over, or choose a new --out.")
    held_shingles: set[str] = set()
    held_norm: set[str] = set()
    exclude_fp = None
    if exclude is not None:
        exclude_fp = prompts_fingerprint(exclude)
        for p in load_prompts(exclude):
            held_shingles |= shingles(p.prompt)
            held_norm.add(normalise(p.prompt))
    gen = None
    if server is not None:
        from eagle3lab.data import remote

        tgt, gen, _ = remote.connect(target, server, many_ranks=ranks.many, api=api,
                                      concurrency=concurrency, retries=retries,
                                      server_model=server_model)  # checked before writing
        eos = tgt.eos_ids
    else:
        tgt = stagerun.load_rank_target(target, ranks, device=device, dtype=dtype,
                                        device_map=device_map)
        eos = tgt.model.generation_config.eos_token_id
    tok = tgt.tokenizer
    prefix, end_id = user_turn_prefix(tok, system_prompt)
    stop_ids = ({end_id} | set(eos if isinstance(eos, list) else [eos])) - {None}
    # a turn is finished when the first special token it writes is a stop token
    special = stop_ids | set(tok.all_special_ids)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else end_id

    params = {"target_config_sha256": tgt.config_sha256, "temperature": float(temperature),
              "top_p": float(top_p), "seed": seed, "max_new_tokens": max_new_tokens,
              "batch_size": batch_size, "system_prompt": system_prompt,
              "min_words": min_words,
              "exclude_sha256": exclude_fp["sha256"] if exclude_fp else None,
              "sampler": "server" if gen is not None else None}
    mpath = meta_path(out)

    def prepare() -> dict[str, Any]:
        """Rank 0 (or the one process): parameter check, what is done, the next batch."""
        if old_meta:
            old = old_meta.get("params", {})
            diff = [k for k in _IDENTITY_KEYS if old.get(k) != params[k]]
            if diff:
                raise UserError(
                    f"{out} was made with different parameters ("
                    + ", ".join(f"{k}={old.get(k)!r} now {params[k]!r}" for k in diff)
                    + f"); continuing would mix two kinds of prompts. Choose a new --out or "
                    f"delete {out} and {mpath}.")
        done = read_appended_jsonl(
            out, lambda r: isinstance(r.get("prompt"), str) and "id" in r, "prompt record")
        if old_meta:
            meta = old_meta
        elif done:
            raise UserError(f"{out} exists without {mpath.name}; it was not written by "
                            f"synthesize_prompts. Choose a new --out.")
        else:
            meta = {"kind": "eagle3lab-prompts", "method": "self-prompt (Magpie)",
                    "eagle3lab": __version__, "target": tgt.describe(), "params": params,
                    "exclude": exclude_fp, "batches_done": 0,
                    "counts": {"sampled": 0, "kept": 0, **{r: 0 for r in DROP_REASONS}}}
        counts = meta["counts"]
        # The file is the truth: batches it holds prompts of are done even if the meta file
        # missed them (a crash between the two writes). The meta count also covers batches
        # that kept nothing, so it is used while it agrees with the file on the prompts kept.
        from_file = max((int(r.get("batch", -1)) + 1 for r in done), default=0)
        b = max(from_file, meta.get("batches_done", 0)) if counts.get("kept") == len(done) \
            else from_file
        meta["batches_done"] = b
        counts["kept"] = len(done)
        atomic_write_json(mpath, meta)
        return {"done": done, "meta": meta}

    state = ranks.on_main(prepare)
    done, meta = state["done"], state["meta"]
    counts, b = meta["counts"], meta["batches_done"]
    seen = {normalise(r["prompt"]) for r in done}
    max_batches = max_batches or max(4, -(-4 * n // batch_size))

    def generate_rows(batch: int) -> list[list[int]]:
        """Batch `batch`'s sampled ids after the prefix, one list per row."""
        if gen is not None:
            rows: list[list[int]] = [[] for _ in range(batch_size)]
            sp = {"max_new_tokens": max_new_tokens, "temperature": float(temperature),
                  "top_p": float(top_p), "stop_token_ids": sorted(stop_ids)}
            gen.generate_ordered(
                [(f"batch {batch} row {r}", prefix,
                  {**sp, "seed": (seed + batch) * batch_size + r})
                 for r in range(batch_size)],
                lambda i, ids, finish: rows.__setitem__(i, ids))
            return rows
        start = torch.tensor([prefix], dtype=torch.long, device=tgt.device).repeat(
            batch_size, 1)
        torch.manual_seed(seed + batch)
        with torch.inference_mode():
            out = tgt.model.generate(
                input_ids=start, attention_mask=torch.ones_like(start), do_sample=True,
                temperature=temperature, top_p=top_p, top_k=0,
                max_new_tokens=max_new_tokens, eos_token_id=sorted(stop_ids),
                pad_token_id=pad_id)
        return out[:, len(prefix):].tolist()

    def sample(batch: int) -> list[tuple[str, bool]]:
        """Batch `batch`'s user turns: (text, finished) per row."""
        rows = []
        for row in generate_rows(batch):
            stop = next((k for k, t in enumerate(row) if t in special), None)
            finished = stop is not None and row[stop] in stop_ids
            rows.append((tok.decode(row[:stop], skip_special_tokens=True).strip()
                         if finished else "", finished))
        return rows

    t0 = time.time()
    bar = tqdm(total=n, initial=min(len(done), n), desc="self-prompt", unit="prompt",
               disable=not (progress and ranks.main))
    with (open(out, "a", encoding="utf-8") if ranks.main else contextlib.nullcontext()) as f:
        while len(done) < n and b < max_batches:
            # a round: rank r samples batch b + r; all are filtered in batch order
            mine = b + ranks.rank
            for rows in ranks.gather(sample(mine) if mine < max_batches else None):
                if rows is None or len(done) >= n:
                    break
                new = []
                for text, finished in rows:
                    if len(done) + len(new) >= n:
                        break  # the rest of the batch is neither kept nor counted
                    counts["sampled"] += 1
                    reason = classify(text, finished, seen, held_norm, held_shingles,
                                      min_words)
                    if reason:
                        counts[reason] += 1
                        continue
                    seen.add(normalise(text))
                    new.append({"id": f"self-{len(done) + len(new):06d}", "prompt": text,
                                "category": "self", "batch": b, "seed": seed + b})
                done.extend(new)
                b += 1
                meta["batches_done"] = b
                counts["kept"] = len(done)
                if ranks.main:
                    for rec in new:
                        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                    atomic_write_json(mpath, meta)
                bar.update(len(new))
    bar.close()
    elapsed = time.time() - t0
    if len(done) < n and ranks.main:
        print(f"warning: only {len(done)} of {n} prompts kept after {b} batches "
              f"({counts}); raise max_batches or temperature.")
    meta["last_run"] = {"seconds": round(elapsed, 2)}
    if ranks.main:
        atomic_write_json(mpath, meta)
    return {"out": str(out), "prompts": len(done), "batches": b, "counts": dict(counts),
            "seconds": elapsed,
            "keep_rate": counts["kept"] / counts["sampled"] if counts["sampled"] else None}
