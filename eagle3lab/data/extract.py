"""Extract EAGLE-3 training shards: the target's aux hidden states for each conversation.

Prevents wasted GPU hours and silently wrong features: it prints the bytes the shards
will take and refuses to start when the disk cannot hold them; it records the target,
aux capture points and their convention in the manifest (and the conversations'
rendering record from their `.meta.json`, `eagle3lab.data.rendering`: unknown without
one); it writes each shard under a
temporary name and lists it in the manifest only once complete, so an interrupted run
resumes after the last complete shard and produces byte-for-byte the same shards as an
uninterrupted one (same samples per shard, same batches, deterministic forward).

Under torchrun every rank extracts its own contiguous share of the conversations (balanced
by tokens) into its own complete shards, and rank 0 merges one manifest that reads exactly
like a one-process one (`eagle3lab.data.rankparts`); a target larger than one GPU is
spread over several with accelerate's device maps (`device_map`).

The settings are `ExtractConfig`; the run is `eagle3lab.data.stage.Stage`'s order (a unit
is one shard, written in the background while the next is computed).
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from eagle3lab import __version__
from eagle3lab.config import PathStr, cli_group
from eagle3lab.errors import UserError
from eagle3lab.fsutil import check_writable_dir, sha256_file
from eagle3lab.data import rankparts, stagerun
from eagle3lab.data.prompts import check_limit, read_conversations
from eagle3lab.data.regenerate import conversations_rendering
from eagle3lab.data.shards import (FORMAT, FORMAT_VERSION, MANIFEST, offsets_of, read_manifest,
                                   shard_name, write_manifest, write_packed_shard)
from eagle3lab.data.stage import Stage, StageConfig
from eagle3lab.targets.adapter import resolve_dtype
from eagle3lab.targets.auxlayers import AUX_IDS_SYNTAX, AuxIds, resolve_aux_layers

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


class ExtractConfig(StageConfig):
    """`extract`'s settings (`eagle3lab extract`'s options)."""

    WHERE: ClassVar[str] = "extract"

    conversations: PathStr = Field(description="JSONL from `eagle3lab regenerate`",
                                   json_schema_extra=cli_group("data"))
    out: PathStr = Field(description="shard directory", json_schema_extra=cli_group("data"))
    limit: int | None = Field(None, description="use only the first N conversations",
                              json_schema_extra=cli_group("data"))
    aux_ids: AuxIds | None = Field(None, description=f"explicit aux layer ids, "
                                   f"{AUX_IDS_SYNTAX} (None: the engines' default)",
                                   json_schema_extra=cli_group("aux layers", metavar="IDS"))
    aux_convention: Literal["sglang", "vllm"] = Field(
        "sglang", description="how --aux-ids are meant: sglang (id k = output of layer k) "
        "or vllm (id k = input of layer k)", json_schema_extra=cli_group("aux layers"))
    dtype: str = Field("bfloat16", description="storage dtype of the hidden states",
                       json_schema_extra=cli_group("data"))
    model_dtype: str = Field("float32", description="dtype the target runs in")
    samples_per_shard: int = Field(64, description="samples per shard file",
                                   json_schema_extra=cli_group("batching"))
    max_tokens_per_batch: int = Field(4096, description="padded tokens per forward",
                                      json_schema_extra=cli_group("batching"))
    max_seq_len: int = Field(2048, description="longer samples are truncated",
                             json_schema_extra=cli_group("batching"))
    force: bool = Field(False, description="start even if free space looks short",
                        json_schema_extra=cli_group("data"))
    stop_after_shards: int | None = Field(None, description="write at most this many new "
                                          "shards (per rank), then stop as if killed (for "
                                          "tests of resumption)",
                                          json_schema_extra=cli_group("batching"))

    def check(self, where: str) -> None:
        for name in ("samples_per_shard", "max_tokens_per_batch", "max_seq_len"):
            value = getattr(self, name)
            if value < 1:
                raise UserError(f"{name} (--{name.replace('_', '-')}) must be a whole number "
                                f"of at least 1, got {value!r}.")
        check_limit(self.limit)


def extract(config: ExtractConfig | dict[str, Any] | None = None, /, *, target: Any = None,
            progress: bool = True, **options: Any) -> dict[str, Any]:
    """Run the target over each conversation and write shards + manifest.json to `out`.

    config / options: `ExtractConfig` (or its fields as keyword arguments, which override
    a config's). target: preset name, HF dir / hub id, or a loaded `Target`. dtype: storage
    dtype of the hidden states. force: skip the free-space check. stop_after_shards: write
    at most this many new shards (per rank), then return (used to test resumption).
    device_map: accelerate's device map ('auto', ...) spreading the target's layers over
    the visible GPUs (under torchrun: over each rank's equal group of its node's GPUs).
    Under torchrun, rank r extracts its contiguous share of the conversations (balanced by
    tokens) into its own shards; rank 0 merges the manifest once every rank is done
    (`eagle3lab.data.rankparts`); dist_timeout: seconds a rank waits for the others.
    Every rank returns the same summary (tokens_per_s: all ranks' tokens per second).
    """
    return ExtractStage.call(config, target=target, progress=progress, options=options)


class ExtractStage(Stage[ExtractConfig]):
    """plan: the conversations, the target, the aux layers, the manifest this run writes;
    resume: the resume check, the ranks' plan, the free-space check; a unit: one shard,
    computed on the target while the one before is written and hashed in the background,
    listed (in the manifest, or this rank's part file) once complete; merge: rank 0 lists
    the ranks' shards in the one manifest once every range is complete."""

    CONFIG = ExtractConfig

    def plan(self) -> None:
        cfg, ranks = self.config, self.ranks
        self.store_dtype = store_dtype = resolve_dtype(cfg.dtype)
        self.out = check_writable_dir(cfg.out, "shard output directory")
        convs_path = Path(cfg.conversations)
        convs = read_conversations(convs_path)
        if cfg.limit is not None:
            convs = convs[:cfg.limit]
        self.convs = convs
        self.tgt = tgt = stagerun.load_rank_target(self.target, ranks, device=self.device(),
                                                   dtype=cfg.model_dtype,
                                                   device_map=cfg.device_map)
        self.aux = aux = resolve_aux_layers(tgt.num_layers, cfg.aux_ids, cfg.aux_convention)
        for i, c in enumerate(convs):
            bad = [t for t in c["input_ids"] if not 0 <= t < tgt.vocab_size]
            if bad:
                raise UserError(f"{convs_path}, record {i + 1} (id {c.get('id')!r}): token id "
                                f"{bad[0]} is outside the target's vocab (0.."
                                f"{tgt.vocab_size - 1}); these conversations were made with "
                                f"another tokenizer.")

        self.manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "eagle3lab": __version__,
            "target": tgt.describe(), "aux_layers": aux.to_dict(),
            "dtype": str(store_dtype).replace("torch.", ""),
            "tensors": {"hidden_states": f"[T, {len(aux.capture_points)}*{tgt.hidden_size}] "
                        f"aux states (inputs of layers {list(aux.capture_points)}) "
                        f"concatenated",
                        "verifier_last_hidden_states": f"[T, {tgt.hidden_size}] input of the "
                        f"final norm", "input_ids": "int32 [T]", "loss_mask": "uint8 [T]",
                        "offsets": "int64 [n+1]", "sample_index": "int64 [n]"},
            "conversations": {"path": str(convs_path.resolve()),
                              "sha256": sha256_file(convs_path), "records_used": len(convs)},
            # how the conversations' text was rendered, as their meta file recorded it
            "rendering": conversations_rendering(convs_path),
            "params": {"samples_per_shard": cfg.samples_per_shard,
                       "max_seq_len": cfg.max_seq_len,
                       "max_tokens_per_batch": cfg.max_tokens_per_batch, "limit": cfg.limit,
                       "model_dtype": cfg.model_dtype, "target_attention": tgt.attention()},
            "shards": [],
        }
        self.lengths_all = [min(len(c["input_ids"]), cfg.max_seq_len) for c in convs]

    def resume(self) -> dict[str, Any]:
        """Rank 0 (or the one process): resume checks, the plan, the free-space check."""
        cfg, ranks, out, manifest = self.config, self.ranks, self.out, self.manifest
        convs, lengths_all, aux, tgt = self.convs, self.lengths_all, self.aux, self.tgt
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
                                       ranks.world_size, cfg.samples_per_shard)
        parts = rankparts.read_shard_parts(out, plan) if ranks.many else [[]]
        todo = [(a + sum(s["samples"] for s in part), b)
                for part, (a, b) in zip(parts, plan["ranges"])]
        lengths = [x for a, b in todo for x in lengths_all[a:b]]
        truncated = sum(1 for a, b in todo for c in convs[a:b]
                        if len(c["input_ids"]) > cfg.max_seq_len)
        bpt = bytes_per_token(tgt.hidden_size, len(aux.capture_points), self.store_dtype)
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
        if need > free and not cfg.force:
            raise UserError(
                f"Not enough free space in {out}: the shards need about {need / 1e9:.2f} GB "
                f"({bpt} bytes/token x {sum(lengths):,} tokens) but only {free / 1e9:.2f} GB "
                f"is free. Free some space, use --limit, a smaller --dtype, or --force to "
                f"start anyway.")
        if truncated:
            print(f"warning: {truncated} conversation(s) longer than max_seq_len="
                  f"{cfg.max_seq_len} tokens are truncated to it.")
        if ranks.many:
            manifest[rankparts.PLAN_KEY] = plan
        write_manifest(out, manifest)
        return {"manifest": manifest, "plan": plan, "parts": parts}

    def start(self, state: dict[str, Any]) -> None:
        ranks = self.ranks
        self.manifest, self.rank_plan = state["manifest"], state["plan"]
        self.mine = state["parts"][ranks.rank] if ranks.many else self.manifest["shards"]
        a, b = self.rank_plan["ranges"][ranks.rank]
        self.first = a + (sum(s["samples"] for s in self.mine) if ranks.many else 0)
        self.todo, self.lengths = self.convs[self.first:b], self.lengths_all[self.first:b]
        self.tokens_done, self.new_shards = 0, 0
        self.next_index = (self.rank_plan["first_shard"][ranks.rank]
                           + (len(self.mine) if ranks.many else 0))
        self.make_bar(total=sum(self.lengths), unit="tok",
                      desc=f"extract ({ranks})" if ranks.many else "extract")
        # One background writer: shard k is written and hashed while the target computes
        # shard k+1 (at most one write in flight; shards are listed in order, each once
        # complete).
        self.pending = None
        self.buffers = _HostBuffers(pin=str(self.tgt.device).startswith("cuda"))
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer")

    def units(self):
        """The first conversation (in this rank's share) of each new shard."""
        stop = self.config.stop_after_shards
        for s0 in range(0, len(self.todo), self.config.samples_per_shard):
            if stop is not None and self.new_shards >= stop:
                break
            yield s0

    def compute(self, s0: int) -> dict[str, Any]:
        n = self.config.samples_per_shard
        return _compute_chunk(self.tgt, self.aux, self.todo[s0:s0 + n],
                              self.lengths[s0:s0 + n], self.first + s0,
                              self.config.max_tokens_per_batch, self.store_dtype, self.bar,
                              self.buffers)

    def write(self, s0: int, packed: dict[str, Any]) -> None:
        """List the shard before (its write has ended), then write this one in the
        background."""
        if self.pending is not None:
            previous, self.pending = self.pending, None
            self.finish(previous)
        self.pending = self.pool.submit(write_packed_shard,
                                        self.out / shard_name(self.next_index), packed)
        self.next_index += 1
        self.new_shards += 1

    def finish(self, future) -> None:
        """List a shard (in the manifest, or this rank's part file) once its (background)
        write has completed."""
        entry = future.result()
        self.mine.append(entry)
        if self.ranks.many:
            rankparts.write_shard_part(self.out, self.rank_plan, self.ranks.rank, self.mine)
        else:
            write_manifest(self.out, self.manifest)
        self.tokens_done += entry["tokens"]
        self.bar.set_postfix(tok_s=f"{self.tokens_done / max(time.time() - self.t0, 1e-9):,.0f}")

    def close(self) -> None:
        """Interrupted or not, let the write in flight end: a complete shard is listed, a
        failed one is not (its temp file is removed by atomic_path)."""
        try:
            if self.pending is not None:
                self.finish(self.pending)
        finally:
            self.pool.shutdown(wait=True)

    def merge(self) -> dict[str, Any]:
        ranks, out, manifest = self.ranks, self.out, self.manifest
        tokens_done, new_shards = self.tokens_done, self.new_shards
        unmerged: list[dict[str, Any]] = []
        if ranks.many:  # every rank's part is final once all have gathered here
            counts = ranks.gather((tokens_done, new_shards))
            tokens_done, new_shards = (sum(c[0] for c in counts), sum(c[1] for c in counts))
            merged = ranks.on_main(lambda: rankparts.merge_shards(out, manifest,
                                                                  self.rank_plan))
            manifest, unmerged = merged["manifest"], merged["unmerged"]
        elapsed = time.time() - self.t0
        listed = manifest["shards"] + unmerged
        total = {k: sum(s[k] for s in listed) for k in ("samples", "tokens", "bytes")}
        complete = total["samples"] == len(self.convs) and not unmerged
        return {"out": str(out), "complete": complete, "shards": len(listed),
                "new_shards": new_shards, "samples": total["samples"],
                "tokens": total["tokens"], "new_tokens": tokens_done, "seconds": elapsed,
                "tokens_per_s": (tokens_done / elapsed if elapsed > 0 and tokens_done
                                 else None),
                "bytes": total["bytes"],
                "bytes_per_token": (total["bytes"] / total["tokens"] if total["tokens"]
                                    else None),
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
