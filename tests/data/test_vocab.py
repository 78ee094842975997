"""Draft vocabulary map: offsets convention, consistency checks, manifest record."""

import pytest
import torch

from testutil import write_conversations
from eagle3lab.errors import UserError
from eagle3lab.data.extract import extract
from eagle3lab.fsutil import sha256_file
from eagle3lab.data.shards import ShardSet
from eagle3lab.data.vocab import build_shard_vocab, build_vocab_map, check_vocab_map


def test_top_tokens_as_offsets():
    counts = torch.tensor([0, 5, 1, 9, 0, 3, 3, 0])
    d2t, t2d = build_vocab_map(counts, 4)
    hot = d2t + torch.arange(4)
    assert hot.tolist() == [1, 3, 5, 6]  # top-4 by count, sorted by target id
    assert d2t.tolist() == [1, 2, 3, 3]  # OFFSETS, not absolute ids
    assert t2d.tolist() == [False, True, False, True, False, True, True, False]


def test_ties_and_unseen_tokens_are_deterministic():
    counts = torch.tensor([0, 2, 0, 2, 0])
    d2t, _ = build_vocab_map(counts, 3)
    assert (d2t + torch.arange(3)).tolist() == [0, 1, 3]


@pytest.mark.parametrize("d2t,t2d,msg", [
    ([3, 0], [False, True, False, True, False], "not strictly increasing"),
    ([0, 2], [False, True, False, True, False], "disagree about which tokens"),
    ([1, 1, 1], [False, True, False, True, False], "t2d marks 2 tokens, d2t has 3"),
    ([4, 4], [False, False, False, True, True], "leaves the target vocab"),
])
def test_inconsistent_maps_refused(d2t, t2d, msg):
    with pytest.raises(UserError, match=msg):
        check_vocab_map(torch.tensor(d2t), torch.tensor(t2d), 5)


def test_shard_vocab_recorded_in_manifest(tiny_target, tmp_path):
    convs = write_conversations(tmp_path / "c.jsonl", tiny_target.tokenizer, n=8)
    out = tmp_path / "s"
    extract(conversations=convs, out=out, target=tiny_target, progress=False)
    entry = build_shard_vocab(data=out, draft_vocab_size=32)
    shards = ShardSet(out)
    assert shards.manifest["vocab_map"] == entry
    assert entry["sha256"] == sha256_file(out / "vocab_map.safetensors")
    d2t, t2d = shards.vocab_map()
    check_vocab_map(d2t, t2d, 49152)
    # every loss-masked token is among the 32 kept (the synthetic answers use few words)
    masked = torch.cat([s["input_ids"][s["loss_mask"]] for s in shards]).unique()
    assert entry["distinct_loss_tokens"] == masked.numel() <= 32
    assert bool(t2d[masked].all()) and entry["coverage"] == 1.0
    (out / "vocab_map.safetensors").write_bytes(b"tampered")
    with pytest.raises(UserError, match="does not match the sha256"):
        shards.vocab_map()
