"""Extraction: shard contents, manifest, resumption byte for byte, refusals, crash safety."""

import json

import pytest
import torch

from testutil import write_conversations
from eagle3lab.errors import UserError
from eagle3lab.data.extract import extract, summary_numbers
from eagle3lab.data.shards import MANIFEST, ShardSet


@pytest.fixture()
def convs(tmp_path, tiny_target):
    return write_conversations(tmp_path / "convs.jsonl", tiny_target.tokenizer, n=10)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_shards_hold_the_captured_states(tiny_target, convs, tmp_path):
    out = tmp_path / "shards"
    s = extract(conversations=convs, out=out, target=tiny_target, samples_per_shard=4,
                max_tokens_per_batch=256, dtype="float32", progress=False)
    assert s["complete"] and s["shards"] == 3 and s["samples"] == 10
    shards = ShardSet(out, verify=True)
    m = shards.manifest
    assert m["aux_layers"]["capture_points"] == [2, 4, 5]
    assert m["aux_layers"]["convention"] == "sglang"
    assert m["target"]["config_sha256"] == tiny_target.config_sha256
    assert [x["samples"] for x in m["shards"]] == [4, 4, 2]
    assert m["totals"]["tokens"] == sum(x["tokens"] for x in m["shards"])
    recs = [json.loads(line) for line in convs.read_text().splitlines()]
    for i in (0, 5, 9):  # each sample equals an unpadded forward of that conversation alone
        sample = shards[i]
        ids = torch.tensor([recs[i]["input_ids"]])
        fused, last = tiny_target.features(ids, None, shards.aux)
        assert sample["input_ids"].tolist() == recs[i]["input_ids"]
        assert sample["loss_mask"].tolist() == [bool(x) for x in recs[i]["loss_mask"]]
        assert torch.allclose(sample["hidden_states"], fused[0], atol=1e-5)
        assert torch.allclose(sample["verifier_last_hidden_states"], last[0], atol=1e-5)


def test_speculators_collate_accepts_shard_samples(tiny_target, convs, tmp_path):
    from speculators.train.data import CollateFn

    out = tmp_path / "shards"
    extract(conversations=convs, out=out, target=tiny_target, progress=False)
    shards = ShardSet(out)
    batch = CollateFn(max_len=512, hidden_size=shards.hidden_size)(
        [shards[i] | {"lengths": torch.tensor([len(shards[i]["input_ids"])]),
                      "position_ids": torch.arange(len(shards[i]["input_ids"]))}
         for i in range(3)])
    assert batch["hidden_states"].shape == (1, 512, 3 * shards.hidden_size)
    assert batch["verifier_last_hidden_states"].shape == (1, 512, shards.hidden_size)


def test_interrupted_extraction_resumes_byte_for_byte(tiny_target, convs, tmp_path):
    kw = dict(conversations=convs, target=tiny_target, samples_per_shard=3, progress=False)
    extract(out=tmp_path / "full", **kw)
    part = extract(out=tmp_path / "resumed", stop_after_shards=2, **kw)
    assert not part["complete"] and part["shards"] == 2
    rest = extract(out=tmp_path / "resumed", **kw)
    assert rest["complete"] and rest["new_shards"] == 2
    assert _files(tmp_path / "full") == _files(tmp_path / "resumed")


def test_crash_mid_shard_leaves_nothing_marked_complete(tiny_target, convs, tmp_path,
                                                         monkeypatch):
    import safetensors.torch as st

    out = tmp_path / "shards"
    real_save = st.save  # shards are serialised in memory, then written to a temp file
    calls = {"n": 0}

    def flaky_save(tensors, metadata=None):
        calls["n"] += 1
        if calls["n"] == 2:  # die while the second shard's temp file exists
            assert len(list(out.glob(".shard-00001.safetensors.*.tmp"))) == 1
            raise KeyboardInterrupt
        return real_save(tensors, metadata=metadata)

    monkeypatch.setattr(st, "save", flaky_save)
    with pytest.raises(KeyboardInterrupt):
        extract(conversations=convs, out=out, target=tiny_target, samples_per_shard=4,
                progress=False)
    m = json.loads((out / MANIFEST).read_text())
    assert [x["file"] for x in m["shards"]] == ["shard-00000.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "shard-00000.safetensors"]
    monkeypatch.setattr(st, "save", real_save)
    s = extract(conversations=convs, out=out, target=tiny_target, samples_per_shard=4,
                progress=False)
    assert s["complete"] and s["new_shards"] == 2
    ShardSet(out, verify=True)


def test_refuses_when_disk_is_too_small(tiny_target, convs, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(UserError, match="Not enough free space .* --force"):
        extract(conversations=convs, out=tmp_path / "s", target=tiny_target, progress=False)
    assert not list((tmp_path / "s").glob("shard-*"))
    s = extract(conversations=convs, out=tmp_path / "s", target=tiny_target, force=True,
                progress=False)
    assert s["complete"]


def test_resume_with_other_aux_layers_refused(tiny_target, convs, tmp_path):
    out = tmp_path / "s"
    extract(conversations=convs, out=out, target=tiny_target, progress=False)
    with pytest.raises(UserError, match="aux_layers.capture_points: existing \\[2, 4, 5\\]"):
        extract(conversations=convs, out=out, target=tiny_target, aux_ids=[1, 2, 3],
                progress=False)


def test_check_against_names_both_values(tiny_target, convs, tmp_path):
    out = tmp_path / "s"
    extract(conversations=convs, out=out, target=tiny_target, progress=False)
    shards = ShardSet(out)
    shards.check_against(hidden_size=64, aux=shards.aux, vocab_size=49152)
    with pytest.raises(UserError, match="hidden size: shards 64, the target 576"):
        shards.check_against(hidden_size=576, what="the target")


def test_bad_inputs(tiny_target, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        extract(conversations=tmp_path / "none.jsonl", out=tmp_path / "s", target=tiny_target)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "input_ids": [1, 99999], "loss_mask": [0, 1]}) + "\n")
    with pytest.raises(UserError, match="token id 99999 is outside the target's vocab"):
        extract(conversations=bad, out=tmp_path / "s", target=tiny_target)
    bad.write_text(json.dumps({"id": "x", "input_ids": [1, 2], "loss_mask": [0]}) + "\n")
    with pytest.raises(UserError, match="line 1: needs 'input_ids' and 'loss_mask'"):
        extract(conversations=bad, out=tmp_path / "s", target=tiny_target)


def test_corrupt_shard_detected(tiny_target, convs, tmp_path):
    out = tmp_path / "s"
    extract(conversations=convs, out=out, target=tiny_target, progress=False)
    shard = out / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match="is corrupt"):
        ShardSet(out, verify=True)


@pytest.mark.real
def test_real_target_interrupted_resume_is_identical(real_target, tmp_path):
    tgt = real_target
    convs = write_conversations(tmp_path / "c.jsonl", tgt.tokenizer, n=6)
    kw = dict(conversations=convs, target=tgt, samples_per_shard=2, progress=False)
    extract(out=tmp_path / "full", **kw)
    extract(out=tmp_path / "resumed", stop_after_shards=1, **kw)
    extract(out=tmp_path / "resumed", **kw)
    assert _files(tmp_path / "full") == _files(tmp_path / "resumed")
    m = ShardSet(tmp_path / "full", verify=True).manifest
    assert m["aux_layers"]["capture_points"] == [2, 15, 27]
    assert m["dtype"] == "bfloat16"
    assert m["totals"]["bytes"] / m["totals"]["tokens"] < (4 * 576 * 2 + 5) * 1.1


def test_summary_numbers_of_a_run_and_of_a_reused_one(tiny_target, tmp_path):
    """The notebook's flow: regenerate held-out answers, extract them; run again: reused."""
    from eagle3lab.data.regenerate import regenerate

    def run():
        regen = regenerate(target=tiny_target, prompts="eval", out=tmp_path / "r.jsonl",
                           limit=3, max_new_tokens=4, batch_size=3, progress=False)
        ext = extract(conversations=tmp_path / "r.jsonl", out=tmp_path / "s",
                      target=tiny_target, samples_per_shard=2, progress=False)
        return summary_numbers(regenerated=regen, extracted=ext,
                               capture_points=tiny_target.aux_layers().capture_points)

    first = run()
    manifest = json.loads((tmp_path / "s" / MANIFEST).read_text())
    assert (first["samples"], first["shards"]) == (3, 2)
    assert first["tokens"] == manifest["totals"]["tokens"]
    assert first["bytes_per_token"] == manifest["totals"]["bytes"] / manifest["totals"]["tokens"]
    assert first["regenerate_tokens_per_s"] > 0 and first["extract_tokens_per_s"] > 0
    assert first["aux_capture_points"] == list(tiny_target.aux_layers().capture_points)
    assert first["reused"] is False
    again = run()
    assert again["reused"] is True and again["regenerate_tokens_per_s"] is None
    assert again["extract_tokens_per_s"] is None and again["tokens"] == first["tokens"]
