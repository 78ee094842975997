"""Shard verification before use: every recorded sha256 is checked (train and vocab do it
first), a re-check of unchanged shards is served from sha256-cache.json by size and mtime,
a changed byte is named with both hashes, and --no-verify / verify=False skips it."""

import json
import os
import shutil
import struct

import pytest

from eagle3lab.cli import main
from eagle3lab.data.shards import VERIFY_CACHE, ShardSet
from eagle3lab.data.vocab import build_shard_vocab
from eagle3lab.errors import UserError
from eagle3lab.fsutil import sha256_file

HOUR_NS = 3600 * 10**9


@pytest.fixture()
def shards(tmp_path, sharp_data):
    """A copy of the sharp train shards, written (as far as the cache can tell) an hour ago."""
    d = shutil.copytree(sharp_data["train"], tmp_path / "train")
    for p in d.glob("shard-*.safetensors"):
        t = p.stat().st_mtime_ns - HOUR_NS
        os.utime(p, ns=(t, t))
    return d


def _flip_a_hidden_state_byte(shard):
    """Change one byte inside the hidden_states data: the file stays a readable shard."""
    data = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    begin, end = json.loads(data[8:8 + n])["hidden_states"]["data_offsets"]
    data[8 + n + (begin + end) // 2] ^= 0x01
    st = shard.stat()
    shard.write_bytes(bytes(data))
    return st


def test_verify_hashes_once_then_trusts_size_and_mtime(shards):
    n = len(list(shards.glob("shard-*.safetensors")))
    assert ShardSet(shards).verify() == {"shards": n, "hashed": n, "cached": 0}
    cache = json.loads((shards / VERIFY_CACHE).read_text())
    assert sorted(cache["files"]) == sorted(p.name for p in shards.glob("shard-*"))
    entry = cache["files"]["shard-00000.safetensors"]
    st = (shards / "shard-00000.safetensors").stat()
    assert (entry["bytes"], entry["mtime_ns"]) == (st.st_size, st.st_mtime_ns)
    assert ShardSet(shards).verify() == {"shards": n, "hashed": 0, "cached": n}
    assert not list(shards.glob(".*.tmp")), "the cache is written atomically"


def test_a_changed_byte_is_named_with_both_hashes(shards):
    ShardSet(shards).verify()  # cached
    shard = shards / "shard-00000.safetensors"
    recorded = ShardSet(shards).shards[0]["sha256"]
    _flip_a_hidden_state_byte(shard)  # a new mtime: the cache no longer vouches for it
    with pytest.raises(UserError) as e:
        ShardSet(shards, verify=True)
    msg = str(e.value)
    assert f"Shard {shard} is corrupt" in msg
    assert f"sha256 {sha256_file(shard)}, the manifest recorded {recorded}" in msg


def test_the_cache_keys_on_size_and_mtime_only(shards):
    """What the cache trades: a change that keeps size and mtime is found only by a full
    check (cache=False), which is what proves the cached run did not hash the file."""
    ShardSet(shards).verify()
    shard = shards / "shard-00000.safetensors"
    st = _flip_a_hidden_state_byte(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ShardSet(shards).verify()["cached"] >= 1
    with pytest.raises(UserError, match="is corrupt"):
        ShardSet(shards).verify(cache=False)


def test_just_written_shards_are_not_cached(tmp_path, sharp_data):
    """A file modified within 2 s of hashing could change again without a new mtime."""
    d = shutil.copytree(sharp_data["train"], tmp_path / "fresh")
    for p in d.glob("shard-*.safetensors"):
        os.utime(p)  # now
    r = ShardSet(d).verify()
    assert r["hashed"] == r["shards"] and r["cached"] == 0
    assert ShardSet(d).verify()["hashed"] == r["shards"]


def test_a_damaged_cache_means_hashing_again(shards):
    (shards / VERIFY_CACHE).write_text("{not json")
    r = ShardSet(shards).verify()
    assert r["hashed"] == r["shards"]
    assert json.loads((shards / VERIFY_CACHE).read_text())["files"]


def test_vocab_verifies_unless_told_not_to(shards, capsys):
    _flip_a_hidden_state_byte(shards / "shard-00000.safetensors")
    with pytest.raises(UserError, match="shard-00000.safetensors is corrupt"):
        build_shard_vocab(data=shards, draft_vocab_size=64, force=True)
    assert build_shard_vocab(data=shards, draft_vocab_size=64, force=True,
                             verify=False)["draft_vocab_size"] == 64
    assert main(["vocab", "--data", str(shards), "--draft-vocab-size", "32"]) == 1
    err = capsys.readouterr().err
    assert "shard-00000.safetensors is corrupt" in err and "Traceback" not in err
    assert main(["vocab", "--data", str(shards), "--draft-vocab-size", "32",
                 "--no-verify"]) == 0


def test_train_verifies_unless_told_not_to(shards, sharp_data, tmp_path, capsys):
    from eagle3lab.train import train

    _flip_a_hidden_state_byte(shards / "shard-00000.safetensors")
    kw = dict(data=str(shards), eval_data=sharp_data["eval"], max_steps=1,
              eval_at_start=False, progress=False)
    with pytest.raises(UserError, match="shard-00000.safetensors is corrupt"):
        train(out=str(tmp_path / "a"), **kw)
    assert not (tmp_path / "a" / "run.json").exists(), "refused before training"
    assert train(out=str(tmp_path / "b"), verify=False, **kw)["steps"] == 1
    args = ["train", "--data", str(shards), "--eval-data", sharp_data["eval"],
            "--max-steps", "1", "--no-eval-at-start", "--no-progress"]
    assert main(args + ["--out", str(tmp_path / "c")]) == 1
    assert "shard-00000.safetensors is corrupt" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "d"), "--no-verify"]) == 0
    assert json.loads((tmp_path / "d" / "run.json").read_text())["status"] == "done"
