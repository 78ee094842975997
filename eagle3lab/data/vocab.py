"""The draft vocabulary map (d2t offsets, t2d mask), built from what the target really says.

Prevents two silent failures: storing d2t as absolute
ids instead of OFFSETS (SGLang computes hot ids as d2t + arange, so absolute ids point at
the wrong tokens and nothing errors), and a t2d mask that disagrees with d2t. The map is
built from loss-masked token frequencies (the tokens the drafter must predict), sorted by
target id so that d2t + arange is strictly increasing, checked, and saved with its sha256
recorded in the shard manifest so that the drafter and the shards can be matched later.

The counting, the map and the saved bytes are shared with online training
(`eagle3lab.train.online`, which counts a set of conversations with `token_counts` and
saves with `vocab_map_bytes` / `vocab_map_entry`), so a map built online equals the one
`eagle3lab vocab` builds from the same conversations' shards, sha256 included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from eagle3lab.data.foreign import open_shards
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_path, sha256_file
from eagle3lab.data.shards import VOCAB_MAP, ShardSet
from eagle3lab.targets.auxlayers import check_aux_ids

#: Where a vocab map's token counts may come from.
VOCAB_SOURCES = ("counts", "recorded")


def token_counts(shards: ShardSet):
    """Counts of loss-masked target tokens over a shard set (int64 [vocab]); any set with
    `ids_and_masks()` and a manifest naming the target's vocab size (an online set too)."""
    import torch

    counts = torch.zeros(int(shards.manifest["target"]["vocab_size"]), dtype=torch.int64)
    for ids, mask in shards.ids_and_masks():
        counts += torch.bincount(ids[mask], minlength=counts.numel())
    return counts


def _recorded(shards, draft_vocab_size: int):
    """(d2t, t2d, counts or None, what) from what the other tool recorded: SpecForge's
    vocab_mapping.pt as it is, or speculators' token_freq.pt through the same rule as our
    counts (which is speculators' own rule: most frequent first, ties by lower id)."""
    recorded_map = getattr(shards, "recorded_map", lambda: None)()
    if recorded_map is not None:
        d2t, t2d = recorded_map
        check_vocab_map(d2t, t2d, int(shards.manifest["target"]["vocab_size"]))
        if d2t.numel() != draft_vocab_size:
            raise UserError(f"{shards.path}'s recorded vocab map has {d2t.numel()} draft "
                            f"tokens, not --draft-vocab-size {draft_vocab_size}.")
        return d2t, t2d, None, "the vocab map recorded by " + shards.TOOL
    counts = getattr(shards, "recorded_counts", lambda: None)()
    if counts is None:
        raise UserError(f"{shards.path} has no recorded vocab map or token frequencies "
                        f"(SpecForge's vocab_mapping/vocab_mapping.pt, speculators' "
                        f"token_freq.pt); build the map from the loss-masked tokens instead "
                        f"(source 'counts', the default).")
    d2t, t2d = build_vocab_map(counts, draft_vocab_size)
    return d2t, t2d, counts, f"the token frequencies recorded by {shards.TOOL}"


def build_vocab_map(counts, draft_vocab_size: int):
    """Top-`draft_vocab_size` tokens by count (ties: lower id first), sorted by target id.

    Returns (d2t int64 [N] with target_id(i) = i + d2t[i], t2d bool [V]).
    """
    import torch

    vocab = counts.numel()
    if not 0 < draft_vocab_size <= vocab:
        raise UserError(f"draft_vocab_size must be in 1..{vocab} (the target vocab), "
                        f"got {draft_vocab_size}.")
    # Stable sort on -count keeps lower ids first among equal counts: deterministic.
    order = torch.sort(-counts, stable=True).indices[:draft_vocab_size]
    target_ids = torch.sort(order).values
    d2t = target_ids - torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[target_ids] = True
    check_vocab_map(d2t, t2d, vocab)
    return d2t, t2d


def check_vocab_map(d2t, t2d, target_vocab: int) -> None:
    """Raise if d2t/t2d are inconsistent (the same rules the checkpoint doctor applies)."""
    import torch

    n = d2t.numel()
    hot = d2t.to(torch.long) + torch.arange(n)
    problems = []
    if t2d.numel() != target_vocab:
        problems.append(f"t2d has {t2d.numel()} entries, target vocab is {target_vocab}")
    if int(t2d.sum()) != n:
        problems.append(f"t2d marks {int(t2d.sum())} tokens, d2t has {n}")
    if n and (int(hot.min()) < 0 or int(hot.max()) >= target_vocab):
        problems.append("d2t + arange leaves the target vocab")
    if n > 1 and not bool((hot[1:] > hot[:-1]).all()):
        problems.append("d2t + arange is not strictly increasing")
    if not problems and not bool(t2d[hot].all()):
        problems.append("d2t and t2d disagree about which tokens are in the draft vocab")
    if problems:
        raise UserError("Inconsistent draft vocabulary map: " + "; ".join(problems) + ".")


def build_shard_vocab(*, data: str | os.PathLike, draft_vocab_size: int = 8192,
                      force: bool = False, verify: bool = True, data_format: str = "auto",
                      target: str | None = None, aux_ids: list[int] | None = None,
                      source: str = "counts") -> dict[str, Any]:
    """Build the map from a shard set's loss-masked tokens; save it next to the shards and
    record file, sha256 and coverage in the manifest. Returns the manifest entry.

    An equal map that is already there (same size, same tokens, file intact) is kept.
    verify: check the shards' recorded sha256s before counting (cached by size and mtime,
    see `ShardSet.verify`). data_format / target / aux_ids: a SpecForge or speculators set
    (`eagle3lab.data.foreign.open_shards`; target and aux ids are recorded on first use;
    aux_ids as every entry point reads them: `eagle3lab.targets.auxlayers.parse_aux_ids`).
    source: 'counts' (the loss-masked tokens of the set) or 'recorded' (what the other
    tool recorded: SpecForge's vocab_mapping.pt, speculators' token_freq.pt)."""
    if source not in VOCAB_SOURCES:
        raise UserError(f"Unknown vocab map source {source!r}; use one of "
                        f"{', '.join(VOCAB_SOURCES)}.")
    aux_ids = check_aux_ids(aux_ids, "aux_ids (--aux-ids)")
    shards = open_shards(data, data_format=data_format, target=target, aux_ids=aux_ids)
    existing = shards.manifest.get("vocab_map")
    kept = shards.path / (existing or {}).get("file", VOCAB_MAP)
    if existing and not force and existing.get("draft_vocab_size") == draft_vocab_size \
            and existing.get("built_from_tokens") == shards.num_tokens \
            and existing.get("source_kind", "counts") == source \
            and kept.is_file() and sha256_file(kept) == existing.get("sha256"):
        return existing
    if verify:
        shards.verify()
    what = "loss-masked token frequencies of this shard set"
    if source == "recorded":
        if not hasattr(shards, "TOOL"):
            raise UserError(f"{shards.path} is an eagle3lab shard set: nothing else recorded "
                            f"a vocab map for it; use source 'counts'.")
        d2t, t2d, counts, what = _recorded(shards, draft_vocab_size)
        if counts is None:
            counts = token_counts(shards)
    else:
        counts = token_counts(shards)
        d2t, t2d = build_vocab_map(counts, draft_vocab_size)
    path = Path(data) / VOCAB_MAP
    with atomic_path(path) as tmp:
        tmp.write_bytes(vocab_map_bytes(d2t, t2d))
    entry = vocab_map_entry(counts, t2d, sha256=sha256_file(path),
                            draft_vocab_size=draft_vocab_size, source=what, source_kind=source,
                            built_from_tokens=shards.num_tokens)
    shards.record("vocab_map", entry)
    return entry


def vocab_map_bytes(d2t, t2d) -> bytes:
    """vocab_map.safetensors' bytes (one metadata key: the same bytes for the same map)."""
    from safetensors.torch import save

    return save({"d2t": d2t.contiguous(), "t2d": t2d.contiguous()},
                metadata={"convention": "d2t offsets: target_id = i + d2t[i]"})


def vocab_map_entry(counts, t2d, *, sha256: str, draft_vocab_size: int, source: str,
                    source_kind: str, built_from_tokens: int,
                    file: str = VOCAB_MAP) -> dict[str, Any]:
    """What a manifest records of a vocab map: file, sha256, sizes, where the counts came
    from, and the share of the loss-masked tokens the draft vocabulary covers."""
    total = int(counts.sum())
    return {
        "file": file,
        "sha256": sha256,
        "draft_vocab_size": draft_vocab_size,
        "target_vocab_size": int(counts.numel()),
        "convention": "d2t[i] = target_id(i) - i (offsets); t2d bool mask over target vocab",
        "source": source,
        "source_kind": source_kind,
        "built_from_tokens": built_from_tokens,
        "loss_tokens": total,
        "distinct_loss_tokens": int((counts > 0).sum()),
        "coverage": (float(counts[t2d].sum()) / total) if total else None,
    }
