"""Online training: the target computes the aux states inside the training loop, from
conversations, instead of reading shards from disk (no bytes of states written).

Prevents online training silently drifting from offline training on the same
conversations. `OnlineSet` is a ShardSet over a conversations JSONL whose states the
target computes when a micro-batch is collated:
- the capture is `extract`'s: `Target.features` (the same hooks, the input of the final
  norm as the last state), aux ids resolved by `resolve_aux_layers` with the same
  convention, the states cast to the storage dtype on the device (`states_dtype`: what a
  shard set stores), conversations truncated to `max_seq_len`, token ids checked against
  the target's vocab with extract's message;
- the set has the ShardSet interface (lengths, manifest, samples, vocab map, checks), so
  `PackedData` packs and pairs it, `evaluate` evaluates it, and the run records it
  (`shard_identity`: target, aux layers, dtype, conversations sha256, vocab-map sha256,
  plus `"source": "online"`) and resumes onto it (`compare_identity`: other conversations,
  target, aux layers or states dtype are refused naming both values) exactly as shards;
- the draft vocabulary is `eagle3lab vocab`'s: `token_counts` over the set (the code that
  counts shards) and `build_vocab_map`, saved as the same bytes (`RUN/vocab_map.safetensors`,
  the same sha256 as the map of the conversations' shards);
- conversations written by another target are refused (regenerate's `.meta.json`);
- a resumed run with `states_cache` fills its cache again in the order the run filled it
  (`warm_cache`), so it continues exactly as an uninterrupted run.

A micro-batch's uncached conversations run through the target together, longest first, in
padded forwards of at most `forward_tokens` tokens (extract's grouping rule, `_batches`).
In floating point a state depends, by rounding only, on the padded width of its forward, so
online and offline states are bit-equal where each conversation's forward has the same
width in both: one conversation per forward (`forward_tokens` 1, extract's
`max_tokens_per_batch` 1) is the tested case (tests/train/test_online.py); otherwise they
differ as two extractions batched differently do.

Under torchrun every rank loads its own copy of the target on its own device and computes
the states of its own micro-batches (`PackedData.steps`). No DataLoader workers: the target
runs in this process, on the training device.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

from eagle3lab import __version__
from eagle3lab.data.extract import _batches
from eagle3lab.data.prompts import read_conversations
from eagle3lab.data.regenerate import conversations_rendering, meta_path, read_meta
from eagle3lab.data.shards import VOCAB_MAP, ShardSet
from eagle3lab.data.vocab import (build_vocab_map, check_vocab_map, token_counts,
                                  vocab_map_bytes, vocab_map_entry)
from eagle3lab.distributed import Ranks
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_path, check_writable_dir, sha256_bytes, sha256_file
from eagle3lab.targets.adapter import Target, load_target, resolve_dtype
from eagle3lab.targets.auxlayers import AuxLayers, resolve_aux_layers
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.data import PackedData, compare_identity, packed_splits, shard_identity

#: The manifest format an online set synthesises (never written: recorded in the run).
ONLINE_FORMAT = "eagle3lab-online"
#: torch.compile's backend for `target_compile` (tests: "eager", dynamo's capture only)
TARGET_COMPILE_BACKEND = "inductor"


def check_conversations_target(path: Path, target: Target) -> None:
    """Refuse conversations that regenerate's `.meta.json` says another target wrote (a
    drafter learns the target that answers; the check is skipped where no meta exists)."""
    meta = read_meta(path, "eagle3lab-conversations")
    if meta is None:
        return
    made = ((meta.get("params") or {}).get("target_config_sha256")
            or (meta.get("target") or {}).get("config_sha256"))
    if made and made != target.config_sha256:
        by = (meta.get("target") or {}).get("path") or "another target"
        raise UserError(f"{path} was written by {by} (config sha256 {made[:12]}..., "
                        f"{meta_path(path).name}), not by the target {target.path} (config "
                        f"sha256 {target.config_sha256[:12]}...): train with the target that "
                        f"answered them (--target), or regenerate them with this one.")


class OnlineSet(ShardSet):
    """A ShardSet over a conversations JSONL whose states `target` computes on demand.

    `samples(batch)` is what `PackedData.collate` calls: the batch's conversations that
    have no states yet run through the target together; with `cache`, each sample's states
    are kept (on the target's device) after that, and a hit returns the very tensors first
    computed. `self[i]` is `samples([i])[0]`. records: the file's records, when already
    read (`read_conversations`)."""

    def __init__(self, conversations: str | os.PathLike, *, target: Target, aux: AuxLayers,
                 states_dtype: str = "bfloat16", model_dtype: str = "float32",
                 max_seq_len: int = 2048, forward_tokens: int = 16384, cache: bool = False,
                 records: list[dict[str, Any]] | None = None):
        # ShardSet.__init__ is not called: there is no shard manifest to read.
        import numpy as np
        import torch

        self.path = path = Path(conversations)
        convs = records if records is not None else read_conversations(path)
        check_conversations_target(path, target)
        for i, c in enumerate(convs):  # extract's check and message
            if c["input_ids"] and not 0 <= min(c["input_ids"]) <= max(c["input_ids"]) \
                    < target.vocab_size:
                bad = next(t for t in c["input_ids"] if not 0 <= t < target.vocab_size)
                raise UserError(f"{path}, record {i + 1} (id {c.get('id')!r}): token id {bad} "
                                f"is outside the target's vocab (0..{target.vocab_size - 1}); "
                                f"these conversations were made with another tokenizer.")
        self.target, self.aux_layers, self.cache = target, aux, cache
        self.store_dtype = resolve_dtype(states_dtype)
        self.forward_tokens = forward_tokens
        self._lengths = [min(len(c["input_ids"]), max_seq_len) for c in convs]
        self._offsets = np.zeros(len(convs) + 1, dtype=np.int64)
        self._offsets[1:] = np.cumsum(self._lengths)
        total = int(self._offsets[-1])
        self._ids = torch.from_numpy(np.fromiter(
            (t for c in convs for t in c["input_ids"][:max_seq_len]), np.int64, total))
        self._mask = torch.from_numpy(np.fromiter(
            (m for c in convs for m in c["loss_mask"][:max_seq_len]), np.int64, total)).bool()
        del convs
        self._states: dict[int, tuple[Any, Any]] = {}  # sample -> (aux states, last state)
        self._vocab: tuple[Any, Any] | None = None
        self.forwards = 0  # target forwards run (a cache hit runs none)
        self.computed = 0  # samples whose states were computed
        self.shards, self._handles, self._starts = [], {}, []
        self.num_samples = len(self._lengths)
        self.manifest: dict[str, Any] = {
            "format": ONLINE_FORMAT, "version": 1, "eagle3lab": __version__,
            "source": "online", "target": target.describe(), "aux_layers": aux.to_dict(),
            "dtype": states_dtype, "final_state": "pre_norm",
            "conversations": {"path": str(path.resolve()), "sha256": sha256_file(path),
                              "records_used": self.num_samples},
            "rendering": conversations_rendering(path),  # as their meta file recorded it
            "params": {"max_seq_len": max_seq_len, "model_dtype": model_dtype,
                       "forward_tokens": forward_tokens, "states_cache": cache,
                       "target_attention": target.attention()},
            "totals": {"samples": self.num_samples, "tokens": total,
                       "loss_tokens": int(self._mask.sum())},
        }

    # --- facts -----------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self._offsets[-1])

    def lengths(self) -> list[int]:
        return list(self._lengths)

    def verify(self, *, cache: bool = True) -> dict[str, int]:
        """Nothing stored to verify: the conversations' sha256 is recorded instead."""
        return {"shards": 0, "hashed": 0, "cached": 0}

    def record(self, key: str, value: Any) -> None:
        self.manifest[key] = value

    def ids_and_masks(self) -> Iterator[tuple[Any, Any]]:
        """(input_ids, loss_mask as bool) of every sample at once, as stored (truncated)."""
        yield self._ids, self._mask

    def set_vocab_map(self, d2t, t2d, entry: dict[str, Any]) -> None:
        self._vocab = (d2t, t2d)
        self.record("vocab_map", entry)

    def vocab_map(self):
        if self._vocab is None:
            raise UserError(f"{self.path}: no draft vocab map was built for these "
                            f"conversations (they are held out).")
        return self._vocab

    # --- samples ---------------------------------------------------------------------
    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.num_samples:
            raise IndexError(i)
        return self.samples([i])[0]

    def samples(self, batch: list[int]) -> list[dict[str, Any]]:
        """Speculators' sample dicts of `batch`, in order; the states of those not cached
        are computed together (see the module docstring)."""
        need = [i for i in dict.fromkeys(batch) if i not in self._states]
        fresh = self._compute(need)
        if self.cache:
            self._states.update(fresh)
        out = []
        for i in batch:
            aux, last = self._states[i] if i in self._states else fresh[i]
            a, b = int(self._offsets[i]), int(self._offsets[i + 1])
            out.append({"hidden_states": aux, "input_ids": self._ids[a:b].clone(),
                        "verifier_last_hidden_states": last,
                        "loss_mask": self._mask[a:b].clone()})
        return out

    def _compute(self, need: list[int]) -> dict[int, tuple[Any, Any]]:
        """The states of samples `need`: longest first, in padded forwards of at most
        forward_tokens tokens (extract's `_batches`), cast to the storage dtype on the
        device as extract casts them."""
        import torch

        order = sorted(need, key=lambda i: (-self._lengths[i], i))
        lens = [self._lengths[i] for i in order]
        tgt, out = self.target, {}
        for a, b in _batches(lens, self.forward_tokens):
            width = lens[a]
            ids = torch.zeros((b - a, width), dtype=torch.long)
            attn = torch.zeros_like(ids)
            for r, i in enumerate(order[a:b]):
                o = int(self._offsets[i])
                ids[r, :lens[a + r]] = self._ids[o:o + lens[a + r]]
                attn[r, :lens[a + r]] = 1
            fused, last = tgt.features(ids.to(tgt.device), attn.to(tgt.device),
                                       self.aux_layers)
            fused, last = fused.to(self.store_dtype), last.to(self.store_dtype)
            for r, i in enumerate(order[a:b]):
                n = lens[a + r]
                # a cached state is a copy of its rows (not a view keeping the whole batch)
                out[i] = ((fused[r, :n].clone(), last[r, :n].clone()) if self.cache
                          else (fused[r, :n], last[r, :n]))
            self.forwards += 1
        self.computed += len(order)
        return out


def _vocab(cfg: TrainConfig, train_set: OnlineSet):
    """(d2t, t2d, manifest entry, bytes to write in the run or None): the map given
    (vocab_map), or `eagle3lab vocab`'s map of the train conversations."""
    from safetensors.torch import load_file

    vocab = int(train_set.manifest["target"]["vocab_size"])
    if cfg.vocab_map:
        p = Path(cfg.vocab_map)
        if not p.is_file():
            raise UserError(f"vocab_map (--vocab-map) {str(p)!r} does not exist; pass a "
                            f"vocab_map.safetensors (`eagle3lab vocab`), or leave it out to "
                            f"build one from the conversations.")
        try:
            t = load_file(str(p))
            d2t, t2d = t["d2t"], t["t2d"]
        except Exception as e:  # noqa: BLE001 (not safetensors, or no d2t/t2d)
            raise UserError(f"vocab_map (--vocab-map) {p} is not a vocab map (safetensors "
                            f"with d2t and t2d): {type(e).__name__}: {e}") from None
        try:
            check_vocab_map(d2t, t2d, vocab)
        except UserError as e:
            raise UserError(f"vocab_map (--vocab-map) {p} does not fit the target "
                            f"{train_set.target.name} (vocab {vocab}): {e}") from None
        counts = token_counts(train_set)
        entry = vocab_map_entry(counts, t2d, sha256=sha256_file(p),
                                draft_vocab_size=int(d2t.numel()),
                                source=f"given: {p.resolve()}", source_kind="given",
                                built_from_tokens=train_set.num_tokens, file=str(p.resolve()))
        return d2t, t2d, entry, None
    counts = token_counts(train_set)
    d2t, t2d = build_vocab_map(counts, cfg.draft_vocab_size)
    blob = vocab_map_bytes(d2t, t2d)
    entry = vocab_map_entry(counts, t2d, sha256=sha256_bytes(blob),
                            draft_vocab_size=cfg.draft_vocab_size,
                            source="loss-masked token frequencies of the train conversations",
                            source_kind="counts", built_from_tokens=train_set.num_tokens)
    return d2t, t2d, entry, blob


def prepare_online(cfg: TrainConfig, *, dist: Ranks, verbose: bool = True,
                   previous: dict[str, Any] | None = None):
    """`prepare_data`'s answer for an online run: (train OnlineSet, train PackedData, eval
    PackedData, eval note, d2t, t2d, target path). The target is loaded on this rank's
    device (`dist.device`); `previous` (a resumed run's run.json) is checked against the
    set before RUN/vocab_map.safetensors is written (rank 0)."""
    d = dist
    # the files first: a bad line is named before the target loads
    records = {p: read_conversations(p) for p in (cfg.conversations, cfg.eval_conversations)
               if p}
    tgt = load_target(cfg.target, device=d.device, dtype=cfg.model_dtype)
    aux = resolve_aux_layers(tgt.num_layers, cfg.aux_ids, cfg.aux_convention)
    if cfg.target_compile:  # before the sets: their manifests record it
        tgt.compile(aux, backend=TARGET_COMPILE_BACKEND)
    kw = dict(target=tgt, aux=aux, states_dtype=cfg.states_dtype, model_dtype=cfg.model_dtype,
              max_seq_len=cfg.max_seq_len, forward_tokens=cfg.forward_tokens,
              cache=cfg.states_cache)
    train_set = OnlineSet(cfg.conversations, records=records.pop(cfg.conversations), **kw)
    d2t, t2d, entry, blob = _vocab(cfg, train_set)
    train_set.set_vocab_map(d2t, t2d, entry)
    out = check_writable_dir(cfg.out, "run directory")
    if previous:
        compare_identity(previous["data"]["train"], shard_identity(train_set),
                         f"the run in {out}", train_set.path)
    if blob is not None:  # the map built here is kept in the run directory
        dst = out / VOCAB_MAP
        entry["file"] = str(dst)
        if d.main and not (dst.is_file() and sha256_file(dst) == entry["sha256"]):
            with atomic_path(dst) as tmp:
                tmp.write_bytes(blob)
    if verbose:
        print(f"train --online: {tgt.name} on {tgt.device} ({cfg.model_dtype}) computes the "
              f"states of {len(train_set)} conversations ({train_set.num_tokens:,} tokens) "
              f"at capture points {list(aux.capture_points)} ({aux.convention} convention), "
              f"as {cfg.states_dtype}; draft vocab {int(d2t.numel())}"
              + ("; states kept after first use" if cfg.states_cache else "")
              + ("; its forward compiled" if cfg.target_compile else "") + ".")
    ev = (OnlineSet(cfg.eval_conversations, records=records.get(cfg.eval_conversations), **kw)
          if cfg.eval_conversations else None)
    train_data, eval_data, note = packed_splits(cfg, train_set, ev, unit="conversations",
                                                eval_option="eval_conversations",
                                                verbose=verbose)
    return train_set, train_data, eval_data, note, d2t, t2d, tgt.path


def warm_cache(data: PackedData, cfg: TrainConfig, d: Ranks, state: dict[str, Any]) -> int:
    """A resumed run's states cache filled as the run filled it up to `state` (its
    micro-batches, in order: each computes the samples it met first, grouped as then), so
    the states it trains on equal the uninterrupted run's. Returns the samples computed."""
    before = data.shards.computed
    for epoch in range(state["epoch"] + 1):
        steps = data.steps(cfg.seed, epoch, rank=d.rank, world_size=d.world_size,
                           grad_accum=cfg.grad_accum)
        for step in steps[:state["batch"]] if epoch == state["epoch"] else steps:
            for micro in step:
                data.shards.samples([int(i) for i in micro])
    return data.shards.computed - before
