"""Extract EAGLE-3 training shards: the target's aux hidden states for each conversation.

Prevents wasted GPU hours and silently wrong features: it prints the bytes the shards
will take and refuses to start when the disk cannot hold them; it records the target,
aux capture points and their convention in the manifest; it writes each shard under a
temporary name and lists it in the manifest only once complete, so an interrupted run
resumes after the last complete shard and produces byte-for-byte the same shards as an
uninterrupted one (same samples per shard, same batches, deterministic forward).

Under torchrun every rank extracts its own contiguous share of the conversations (balanced
by tokens) into its own complete shards, and rank 0 merges one manifest that reads exactly
like a one-process one (`eagle3lab.data.rankparts`); a target larger than one GPU is
spread over several with accelerate's device maps (`device_map`).
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eagle3lab import __version__
from eagle3lab.config import DEFAULT_TARGET
from eagle3lab.distributed import Ranks
from eagle3lab.errors import UserError
from eagle3lab.fsutil import check_writable_dir, sha256_file
from eagle3lab.data import rankparts, stagerun
from eagle3lab.data.prompts import check_limit, read_conversations
from eagle3lab.data.shards import (FORMAT, FORMAT_VERSION, MANIFEST, read_manifest, shard_name,
                                   write_manifest, write_packed_shard)
from eagle3lab.target.auxlayers import resolve_aux_layers

#: Manifest fields that must match for a run to resume into an existing shard set.
_RESUME_KEYS = ("target.config_sha256", "aux_layers.capture_points", "dtype",
                "conversations.sha256", "params.samples_per_shard", "params.max_seq_len",
                "params.max_tokens_per_batch")


def bytes_per_token(hidden_size: int, num_aux: int, dtype) -> int:
    """On-disk bytes per token: aux states + last hidden state + ids (int32) + mask (uint8)."""
    import torch

    elem = torch.empty((), dtype=dtype).element_size()
    return (num_aux + 1) * hidden_size * elem + 4 + 1


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else {}
    return d


def _batches(lengths: list[int], max_tokens: int) -> list[tuple[int, int]]:
    """Consecutive [a, b) groups whose padded size (count x longest) fits max_tokens."""
    out, a = [], 0
    while a < len(lengths):
        b, longest = a, 0
        while b < len(lengths):
            longest2 = max(longest, lengths[b])
            if b > a and longest2 * (b - a + 1) > max_tokens:
                break
            longest, b = longest2, b + 1
        out.append((a, b))
        a = b
    return out


class _HostBuffers:
    """Two reusable host buffers (pinned when the target is on a GPU) that hold one shard's
    packed states each: the rows of every batch are copied from the device straight into
    the shard's layout (no padding copied, no per-shard allocation and concatenation),
    while the background writer saves the other buffer. Fresh host memory is what bounds
    extraction on a fast GPU (each page faulted in, several copies per shard), more so
    with several ranks on one host."""

    def __init__(self, pin: bool):
        self.pin, self.sets, self.turn = pin, [None, None], 0

    def take(self, tokens: int, widths: tuple[int, int], dtype):
        import torch

        k, self.turn = self.turn, 1 - self.turn
        have = self.sets[k]
        if have is None or have[0].shape[0] < tokens or have[0].dtype != dtype:
            self.sets[k] = None  # free before allocating the larger one
            self.sets[k] = tuple(torch.empty((tokens, w), dtype=dtype, pin_memory=self.pin)
                                 for w in widths)
        return tuple(t[:tokens] for t in self.sets[k])


def _compute_chunk(tgt, aux, chunk, chunk_lens, first_index, max_tokens_per_batch,
                   store_dtype, bar, buffers: _HostBuffers) -> dict[str, Any]:
    """Run the target over one shard's conversations (padded batches by token budget) and
    return the shard's packed tensors (`write_packed_shard`'s layout)."""
    import torch

    from eagle3lab.data.shards import offsets_of

    offsets = offsets_of(chunk_lens)
    n_aux, hidden = len(aux.capture_points), tgt.hidden_size
    fused_buf, last_buf = buffers.take(int(offsets[-1]), (n_aux * hidden, hidden),
                                       store_dtype)
    ids_all, mask_all = [], []
    for a, b in _batches(chunk_lens, max_tokens_per_batch):
        width = max(chunk_lens[a:b])
        ids = torch.zeros((b - a, width), dtype=torch.long)
        attn = torch.zeros_like(ids)
        for r in range(b - a):
            n = chunk_lens[a + r]
            ids[r, :n] = torch.tensor(chunk[a + r]["input_ids"][:n])
            attn[r, :n] = 1
        fused, last = tgt.features(ids.to(tgt.device), attn.to(tgt.device), aux)
        # cast on the device, then each sample's rows into its place in the shard
        fused, last = fused.to(store_dtype), last.to(store_dtype)
        for r in range(b - a):
            n, o = chunk_lens[a + r], int(offsets[a + r])
            fused_buf[o:o + n].copy_(fused[r, :n], non_blocking=buffers.pin)
            last_buf[o:o + n].copy_(last[r, :n], non_blocking=buffers.pin)
            ids_all.append(ids[r, :n])
            mask_all.append(torch.tensor(chunk[a + r]["loss_mask"][:n], dtype=torch.uint8))
        bar.update(sum(chunk_lens[a:b]))
    if buffers.pin and chunk_lens:  # the copies were queued on the states' device
        torch.cuda.synchronize(fused.device)
    return {"input_ids": torch.cat(ids_all).to(torch.int32), "loss_mask": torch.cat(mask_all),
            "hidden_states": fused_buf, "verifier_last_hidden_states": last_buf,
            "offsets": offsets,
            "sample_index": torch.arange(first_index, first_index + len(chunk_lens),
                                         dtype=torch.int64)}


def extract(
    *, conversations: str | os.PathLike, out: str | os.PathLike, target: Any = DEFAULT_TARGET,
    aux_ids: list[int] | None = None, aux_convention: str = "sglang", dtype: str = "bfloat16",
    model_dtype: str = "float32", device: str = "auto", device_map: str | None = None,
    samples_per_shard: int = 64, max_tokens_per_batch: int = 4096, max_seq_len: int = 2048,
    limit: int | None = None, force: bool = False, progress: bool = True,
    stop_after_shards: int | None = None,
    dist_timeout: float = stagerun.DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Run the target over each conversation and write shards + manifest.json to `out`.

    target: preset name, HF dir / hub id, or a loaded `Target`. dtype: storage dtype of
    the hidden states. force: skip the free-space check. stop_after_shards: write at most
    this many new shards (per rank), then return (used to test resumption).
    device_map: accelerate's device map ('auto', ...) spreading the target's layers over
    the visible GPUs (under torchrun: over each rank's equal group of its node's GPUs).
    Under torchrun, rank r extracts its contiguous share of the conversations (balanced by
    tokens) into its own shards; rank 0 merges the manifest once every rank is done
    (`eagle3lab.data.rankparts`); dist_timeout: seconds a rank waits for the others.
    Every rank returns the same summary (tokens_per_s: all ranks' tokens per second).
    """
    return stagerun.run_stage(_extract, locals())  # every argument above


def _extract(ranks: Ranks, *, conversations, out, target, aux_ids, aux_convention,
             dtype, model_dtype, device, device_map, samples_per_shard, max_tokens_per_batch,
             max_seq_len, limit, force, progress, stop_after_shards) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from eagle3lab.target.adapter import resolve_dtype

    for name, value in (("samples_per_shard", samples_per_shard),
                        ("max_tokens_per_batch", max_tokens_per_batch),
                        ("max_seq_len", max_seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} (--{name.replace('_', '-')}) must be a whole number of at "
                            f"least 1, got {value!r}.")
    check_limit(limit)
    store_dtype = resolve_dtype(dtype)
    out = check_writable_dir(out, "shard output directory")
    convs_path = Path(conversations)
    convs = read_conversations(convs_path)
    if limit is not None:
        convs = convs[:limit]
    tgt = stagerun.load_rank_target(target, ranks, device=device, dtype=model_dtype,
                                    device_map=device_map)
    aux = resolve_aux_layers(tgt.num_layers, aux_ids, aux_convention)
    for i, c in enumerate(convs):
        bad = [t for t in c["input_ids"] if not 0 <= t < tgt.vocab_size]
        if bad:
            raise UserError(f"{convs_path}, record {i + 1} (id {c.get('id')!r}): token id "
                            f"{bad[0]} is outside the target's vocab (0..{tgt.vocab_size - 1}); "
                            f"these conversations were made with another tokenizer.")

    manifest = {
        "format": FORMAT, "version": FORMAT_VERSION, "eagle3lab": __version__,
        "target": tgt.describe(), "aux_layers": aux.to_dict(),
        "dtype": str(store_dtype).replace("torch.", ""),
        "tensors": {"hidden_states": f"[T, {len(aux.capture_points)}*{tgt.hidden_size}] aux "
                    f"states (inputs of layers {list(aux.capture_points)}) concatenated",
                    "verifier_last_hidden_states": f"[T, {tgt.hidden_size}] input of the "
                    f"final norm", "input_ids": "int32 [T]", "loss_mask": "uint8 [T]",
                    "offsets": "int64 [n+1]", "sample_index": "int64 [n]"},
        "conversations": {"path": str(convs_path.resolve()), "sha256": sha256_file(convs_path),
                          "records_used": len(convs)},
        "params": {"samples_per_shard": samples_per_shard, "max_seq_len": max_seq_len,
                   "max_tokens_per_batch": max_tokens_per_batch, "limit": limit,
                   "model_dtype": model_dtype},
        "shards": [],
    }
    lengths_all = [min(len(c["input_ids"]), max_seq_len) for c in convs]

    def prepare() -> dict[str, Any]:
        """Rank 0 (or the one process): resume checks, the plan, the free-space check."""
        plan = None
        if (out / MANIFEST).exists():
            old = read_manifest(out)
            diff = [k for k in _RESUME_KEYS if _get(old, k) != _get(manifest, k)]
            if diff:
                raise UserError(
                    f"{out} already holds shards made differently ("
                    + "; ".join(f"{k}: existing {_get(old, k)!r}, now {_get(manifest, k)!r}"
                                for k in diff)
                    + "). Use a new output directory, or delete this one to start over.")
            manifest["shards"] = old["shards"]
            if old.get("vocab_map"):
                manifest["vocab_map"] = old["vocab_map"]
            plan = rankparts.resume_plan(old, out, sum(s["samples"] for s in old["shards"]),
                                          len(convs), ranks)
        for stray in out.glob(".shard-*.tmp"):  # temp files of a killed run: never complete
            stray.unlink()
        done = sum(s["samples"] for s in manifest["shards"])
        if plan is None:
            rankparts.remove_shard_parts(out)  # a killed merge's leftovers
            plan = rankparts.make_plan(lengths_all[done:], done, len(manifest["shards"]),
                                        ranks.world_size, samples_per_shard)
        parts = rankparts.read_shard_parts(out, plan) if ranks.many else [[]]
        todo = [(a + sum(s["samples"] for s in part), b)
                for part, (a, b) in zip(parts, plan["ranges"])]
        lengths = [x for a, b in todo for x in lengths_all[a:b]]
        truncated = sum(1 for a, b in todo for c in convs[a:b]
                        if len(c["input_ids"]) > max_seq_len)
        bpt = bytes_per_token(tgt.hidden_size, len(aux.capture_points), store_dtype)
        need = bpt * sum(lengths)
        free = shutil.disk_usage(out).free
        on = (f" on {ranks.world_size} ranks (by tokens: "
              + " / ".join(f"{sum(lengths_all[a:b]):,}" for a, b in todo) + ")"
              if ranks.many else "")
        print(f"extract: {len(lengths)} conversation(s) to go ({len(convs) - len(lengths)} "
              f"already in complete shards){on}, "
              f"{sum(lengths):,} tokens x {bpt:,} bytes/token = {need / 1e6:,.1f} MB on disk "
              f"(free: {free / 1e9:,.1f} GB); aux capture points {list(aux.capture_points)} "
              f"({aux.convention} convention), stored as {manifest['dtype']}.")
        if need > free and not force:
            raise UserError(
                f"Not enough free space in {out}: the shards need about {need / 1e9:.2f} GB "
                f"({bpt} bytes/token x {sum(lengths):,} tokens) but only {free / 1e9:.2f} GB "
                f"is free. Free some space, use --limit, a smaller --dtype, or --force to "
                f"start anyway.")
        if truncated:
            print(f"warning: {truncated} conversation(s) longer than max_seq_len={max_seq_len} "
                  f"tokens are truncated to it.")
        if ranks.many:
            manifest[rankparts.PLAN_KEY] = plan
        write_manifest(out, manifest)
        return {"manifest": manifest, "plan": plan, "parts": parts}

    state = ranks.on_main(prepare)
    manifest, plan = state["manifest"], state["plan"]
    mine = state["parts"][ranks.rank] if ranks.many else manifest["shards"]
    a, b = plan["ranges"][ranks.rank]
    a += sum(s["samples"] for s in mine) if ranks.many else 0
    todo, lengths = convs[a:b], lengths_all[a:b]

    t0 = time.time()
    tokens_done, new_shards = 0, 0
    next_index = plan["first_shard"][ranks.rank] + (len(mine) if ranks.many else 0)
    desc = f"extract ({ranks})" if ranks.many else "extract"
    bar = tqdm(total=sum(lengths), desc=desc, unit="tok", disable=not (progress and ranks.main))

    def finish(future) -> None:
        """List a shard (in the manifest, or this rank's part file) once its (background)
        write has completed."""
        nonlocal tokens_done
        entry = future.result()
        mine.append(entry)
        if ranks.many:
            rankparts.write_shard_part(out, plan, ranks.rank, mine)
        else:
            write_manifest(out, manifest)
        tokens_done += entry["tokens"]
        bar.set_postfix(tok_s=f"{tokens_done / max(time.time() - t0, 1e-9):,.0f}")

    # One background writer: shard k is written and hashed while the target computes shard
    # k+1 (at most one write in flight; shards are listed in order, each once complete).
    pending = None
    buffers = _HostBuffers(pin=str(tgt.device).startswith("cuda"))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer") as pool:
        try:
            for s0 in range(0, len(todo), samples_per_shard):
                if stop_after_shards is not None and new_shards >= stop_after_shards:
                    break
                packed = _compute_chunk(tgt, aux, todo[s0:s0 + samples_per_shard],
                                        lengths[s0:s0 + samples_per_shard], a + s0,
                                        max_tokens_per_batch, store_dtype, bar, buffers)
                if pending is not None:
                    previous, pending = pending, None
                    finish(previous)
                pending = pool.submit(write_packed_shard, out / shard_name(next_index),
                                      packed)
                next_index += 1
                new_shards += 1
        finally:
            # Interrupted or not, let the write in flight end: a complete shard is listed,
            # a failed one is not (its temp file is removed by atomic_path).
            if pending is not None:
                finish(pending)
    bar.close()
    unmerged: list[dict[str, Any]] = []
    if ranks.many:  # every rank's part is final once all have gathered here
        counts = ranks.gather((tokens_done, new_shards))
        tokens_done, new_shards = (sum(c[0] for c in counts), sum(c[1] for c in counts))
        merged = ranks.on_main(lambda: rankparts.merge_shards(out, manifest, plan))
        manifest, unmerged = merged["manifest"], merged["unmerged"]
    elapsed = time.time() - t0
    listed = manifest["shards"] + unmerged
    total = {k: sum(s[k] for s in listed) for k in ("samples", "tokens", "bytes")}
    complete = total["samples"] == len(convs) and not unmerged
    return {"out": str(out), "complete": complete, "shards": len(listed),
            "new_shards": new_shards, "samples": total["samples"], "tokens": total["tokens"],
            "new_tokens": tokens_done, "seconds": elapsed,
            "tokens_per_s": tokens_done / elapsed if elapsed > 0 and tokens_done else None,
            "bytes": total["bytes"],
            "bytes_per_token": total["bytes"] / total["tokens"] if total["tokens"] else None,
            "world_size": ranks.world_size}


def summary_numbers(*, regenerated: dict[str, Any], extracted: dict[str, Any],
                    capture_points: list[int]) -> dict[str, Any]:
    """The extract notebook's key numbers for the batch report, from `regenerate`'s and
    `extract`'s results: shard totals, this run's throughputs (regeneration's only when
    this run generated tokens), bytes per token, the aux capture points, and whether both
    stages were reused from an earlier run (then no throughput was measured here)."""
    return {
        "samples": extracted["samples"], "tokens": extracted["tokens"],
        "shards": extracted["shards"],
        "regenerate_tokens_per_s": (regenerated["tokens_per_s"] if regenerated["new_tokens"]
                                    else None),
        "extract_tokens_per_s": extracted["tokens_per_s"],
        "bytes_per_token": extracted["bytes_per_token"],
        "aux_capture_points": list(capture_points),
        "reused": not (regenerated["new_tokens"] or extracted["new_tokens"]),
    }
