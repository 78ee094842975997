"""Training data: speculators' pairing, packing and order over a subset of a ShardSet.

Prevents training on data that is not what the run says it is:
- shards from another target: the target's config sha256 is checked against the manifest,
  the eval shards against the training shards, and a resumed run's shards against the
  ones it started on (`compare_identity`), each refusal naming both values;
- a resumed run that replays another order: batches come from speculators' multipack
  sampler, whose order depends only on seed + epoch (and the micro-batches per step);
- held-out samples leaking into training: one permutation by data_seed puts them first,
  and data fractions take nested prefixes of the rest (`split_samples`).

The set may be a ShardSet or anything with its interface: an online set
(train/online.py), whose `samples(batch)` computes a batch's states together, is read
through the same packing, pairing and identity checks (its identity adds the conversations'
sha256 and the states' dtype).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eagle3lab.data.foreign import open_shards
from eagle3lab.errors import UserError
from eagle3lab.targets.adapter import config_sha256
from eagle3lab.train.config import TrainConfig


class PackedData:
    """Samples `indices` of `shards` packed into batches of <= max_tokens by speculators'
    multipack sampler (its order depends only on seed + epoch, so a resumed run replays
    it), paired by `shift_batch` and collated by `CollateFn` exactly as its trainer does."""

    def __init__(self, shards, indices, max_tokens: int, *, pad: bool = False):
        import numpy as np

        self.shards, self.max_tokens, self.pad = shards, max_tokens, pad
        self.indices = np.asarray(indices, dtype=np.int64)
        all_lengths = np.asarray(shards.lengths(), dtype=np.int64)
        self.lengths = all_lengths[self.indices]
        self._length_of = dict(zip(self.indices.tolist(), self.lengths.tolist()))
        self._cache_key: tuple[int, int, int] | None = None
        self._cache: dict[int, list] = {}

    def batches(self, seed: int, epoch: int, *, slot: int = 0, slots: int = 1) -> list:
        """Micro-batch `slot` of each optimizer step when a step packs `slots` micro-batches
        (speculators' sampler with num_replicas=slots, rank=slot; one process: 0 of 1)."""
        import warnings

        from speculators.train.distributed_batch_sampler import (
            MultipackDistributedBatchSamplerV2)

        if self._cache_key != (seed, epoch, slots):
            self._cache_key, self._cache = (seed, epoch, slots), {}
        if slot not in self._cache:
            with warnings.catch_warnings():  # "samples longer than max ... truncated"
                warnings.simplefilter("ignore")
                s = MultipackDistributedBatchSamplerV2(
                    batch_max_length=self.max_tokens, lengths=self.lengths,
                    num_replicas=slots, rank=slot, seed=seed)
                self._cache[slot] = [self.indices[b] for b in s._generate_batches(epoch)]
        return self._cache[slot]

    def steps(self, seed: int, epoch: int, *, rank: int = 0, world_size: int = 1,
              grad_accum: int = 1) -> list[list]:
        """This rank's micro-batches of each optimizer step of an epoch.

        One optimizer step = world_size x grad_accum micro-batches, packed together by
        speculators' sampler (one per "replica"); rank r's micro-step k takes slot
        k * world_size + r. So the data of a step depends only on world_size x grad_accum:
        2 ranks x 1 and 1 process x 2 train on the same micro-batches. Across all slots an
        epoch holds every sample once, except that the sampler drops the last
        < world_size x grad_accum samples of the epoch's permutation (as speculators'
        trainer does; a different few each epoch). One process, grad_accum 1: the batches
        of `batches(seed, epoch)`, one per step."""
        n = world_size * grad_accum
        mine = [self.batches(seed, epoch, slot=k * world_size + rank, slots=n)
                for k in range(grad_accum)]
        if n > 1 and not mine[0]:
            raise UserError(f"{len(self.indices)} training samples cannot fill {n} "
                            f"micro-batches per step (world size {world_size} x grad_accum "
                            f"{grad_accum}); use fewer ranks, a smaller grad_accum or more data.")
        return [list(step) for step in zip(*mine)]

    def batch_tokens(self, batch) -> int:
        """Positions trained on: each sample loses one token to the shift."""
        n = sum(max(min(self._length_of[int(i)], self.max_tokens) - 1, 0) for i in batch)
        return min(n, self.max_tokens)

    def loader(self, steps: list[list], dtype, *, workers: int = 0, pin: bool = False):
        """The collated micro-batches of each optimizer step of `steps`, in order. workers
        > 0: read and collated by that many torch DataLoader processes while the device
        computes the steps before (pinned with pin=True, so the copy to the GPU is
        asynchronous); 0: here, one step at a time, when asked for. The same tensors
        either way."""
        if workers <= 0:
            return ([self.collate(ids, dtype) for ids in step] for step in steps)
        from torch.utils.data import DataLoader

        return iter(DataLoader(_CollatedSteps(self, steps, dtype), batch_size=None,
                               num_workers=workers, pin_memory=pin, prefetch_factor=2))

    def collate(self, batch, dtype) -> dict[str, Any]:
        import torch
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.data import CollateFn

        samples = []
        together = getattr(self.shards, "samples", None)  # an online set: one forward
        for s in (together([int(i) for i in batch]) if together is not None
                  else (self.shards[int(i)] for i in batch)):
            n = int(s["input_ids"].shape[0])
            s["lengths"] = torch.tensor([n], dtype=torch.long)
            s["position_ids"] = torch.arange(n, dtype=torch.long)
            samples.append(s)
        hidden = int(samples[0]["verifier_last_hidden_states"].shape[-1])
        width = self.max_tokens if self.pad else max(self.batch_tokens(batch), 1)
        out = CollateFn(width, hidden, int(samples[0]["hidden_states"].shape[-1]) // hidden,
                        dtype=dtype, preprocess=shift_batch)(samples)
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


class _CollatedSteps:
    """A map-style dataset over optimizer steps: item k = step k's collated micro-batches."""

    def __init__(self, data: PackedData, steps: list[list], dtype):
        self.data, self.steps, self.dtype = data, steps, dtype

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, k: int) -> list[dict[str, Any]]:
        return [self.data.collate(ids, self.dtype) for ids in self.steps[k]]


def split_samples(n: int, *, eval_fraction: float | None, data_fraction: float,
                  data_seed: int):
    """(train indices, held-out indices). One permutation by data_seed: the held-out part
    comes first, and data fractions take a prefix of the rest, so smaller fractions are
    subsets of larger ones and never touch the held-out samples."""
    import numpy as np

    perm = np.random.default_rng(data_seed).permutation(n)
    k = max(1, round(n * eval_fraction)) if eval_fraction else 0
    pool = perm[k:]
    m = max(1, math.ceil(len(pool) * data_fraction))
    return np.sort(pool[:m]), np.sort(perm[:k])


def shard_identity(shards) -> dict[str, Any]:
    """What a run records about a shard set, and what must match to resume into it."""
    m = shards.manifest
    ident = {"path": str(Path(shards.path).resolve()), "format": getattr(shards, "TOOL", None)
             or "eagle3lab", "final_state": m.get("final_state", "pre_norm"),
             "target": m["target"],
             "aux_layers": m["aux_layers"], "dtype": m.get("dtype"),
             "conversations_sha256": m.get("conversations", {}).get("sha256"),
             "vocab_map_sha256": (m.get("vocab_map") or {}).get("sha256"),
             "samples": len(shards), "tokens": shards.num_tokens}
    if m.get("source"):  # an online set: "online"
        ident["source"] = m["source"]
    attention = (m.get("params") or {}).get("target_attention")
    if attention:  # what computed the target's attention (the states depend on it)
        ident["target_attention"] = attention
    return ident


_IDENTITY_CHECKS = (("hidden size", ("target", "hidden_size")),
                    ("target vocab size", ("target", "vocab_size")),
                    ("target config sha256", ("target", "config_sha256")),
                    ("aux capture points", ("aux_layers", "capture_points")),
                    ("vocab map sha256", ("vocab_map_sha256",)))
#: What an online run's data must match too: the same conversations, states in one dtype.
_ONLINE_CHECKS = (("data source", ("source",)),
                  ("conversations sha256", ("conversations_sha256",)),
                  ("states dtype", ("dtype",)))


def compare_identity(old: dict, new: dict, what: str, path) -> None:
    """Refuse shards (identity `new`) that differ from those `what` recorded (`old`)."""
    def get(d, keys):
        for k in keys:
            d = (d or {}).get(k)
        return d

    online = "online" in (old.get("source"), new.get("source"))
    noun = "conversations" if online else "shards"
    checks = _IDENTITY_CHECKS + (_ONLINE_CHECKS if online else ())
    diff = [f"{name}: {what} {get(old, ks)}, {noun} {get(new, ks)}"
            for name, ks in checks if get(old, ks) != get(new, ks)]
    if diff:
        raise UserError(f"The {noun} in {path} do not match {what}: " + "; ".join(diff)
                        + f". Resume with the {noun} the run was started on, or start a new "
                        "run directory.")


def prepare_data(cfg: TrainConfig, *, verify: bool = True, verbose: bool = True):
    """Open and cross-check the shards (verify: their recorded sha256s too, first); return
    (train ShardSet, train PackedData, eval PackedData, eval note, d2t, t2d, target path).
    verbose=False: no printed note (ranks other than 0)."""
    from transformers import AutoConfig

    shards = open_shards(cfg.data, verify=verify, data_format=cfg.data_format,
                         target=cfg.target)
    d2t, t2d = shards.vocab_map()
    t = shards.manifest["target"]
    target_path = cfg.target or t["path"]
    if not (Path(target_path) / "config.json").is_file():
        raise UserError(f"The target these shards were extracted from ({t['path']}) has no "
                        f"config.json; pass target=<its directory> (--target) if it moved.")
    got = config_sha256(AutoConfig.from_pretrained(target_path).to_dict())
    if got != t["config_sha256"]:
        raise UserError(f"The target at {target_path} is not the one the shards in "
                        f"{shards.path} were extracted from: config sha256 {got[:12]}..., "
                        f"manifest {t['config_sha256'][:12]}.... Pass the right --target.")
    if cfg.eval_data:
        ev = open_shards(cfg.eval_data, verify=verify, target=cfg.target)
        final = (shards.manifest.get("final_state", "pre_norm"),
                 ev.manifest.get("final_state", "pre_norm"))
        if final[0] != final[1]:
            raise UserError(f"The training data ({shards.path}) holds the {final[0]} final "
                            f"state, the eval data ({ev.path}) the {final[1]} one: a drafter "
                            f"computes its targets one way. Use eval data of the same tool.")
        ev.check_against(hidden_size=t["hidden_size"], aux=shards.aux,
                         vocab_size=t["vocab_size"], config_sha256=t["config_sha256"],
                         what=f"the training shards ({shards.path})")
    else:
        ev = None
    train_data, eval_data, note = packed_splits(cfg, shards, ev, verbose=verbose)
    return shards, train_data, eval_data, note, d2t, t2d, target_path


def packed_splits(cfg: TrainConfig, train_set, eval_set=None, *, unit: str = "samples",
                  eval_option: str = "eval_data", verbose: bool = True):
    """(train PackedData, eval PackedData, eval note): the held-out set given, or
    eval_fraction of the train set held out; the data_fraction subset of the rest
    (`split_samples`). unit / eval_option: what the note calls a sample and the held-out
    option (online: conversations, eval_conversations)."""
    if eval_set is not None:
        train_idx, _ = split_samples(len(train_set), eval_fraction=None,
                                     data_fraction=cfg.data_fraction, data_seed=cfg.data_seed)
        eval_data = PackedData(eval_set, range(len(eval_set)), cfg.max_tokens_per_batch)
        note = f"eval split: {eval_set.path} ({len(eval_set)} {unit})"
    else:
        train_idx, eval_idx = split_samples(len(train_set), eval_fraction=cfg.eval_fraction,
                                            data_fraction=cfg.data_fraction,
                                            data_seed=cfg.data_seed)
        eval_data = PackedData(train_set, eval_idx, cfg.max_tokens_per_batch)
        note = (f"warning: no {eval_option} given; holding out {len(eval_idx)} of "
                f"{len(train_set)} training {unit} (eval_fraction={cfg.eval_fraction}). "
                f"Held-out prompts (`--{eval_option.replace('_', '-')}`) measure "
                f"generalisation better.")
        if verbose:
            print(note)
    train_data = PackedData(train_set, train_idx, cfg.max_tokens_per_batch,
                            pad=cfg.pad_batches)
    return train_data, eval_data, note
