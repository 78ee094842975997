"""Regeneration with the static engine (`engine="static"`): on the real default target in
fp32 its greedy records are the hf engine's, byte for byte, at batch sizes 1 and 3; a run
killed after its first chunk and re-run writes the file one run writes; sampled records
are seeded per prompt (seed + index), the same in two runs and not the greedy ones; the
engine is part of a file's identity; the CLI passes the engine's class."""

import json

import pytest
import torch

from eagle3lab.data import regenerate as regen_mod
from eagle3lab.data.prompts import read_conversations
from eagle3lab.data.regenerate import RegenerateStage, meta_path, regenerate
from eagle3lab.errors import UserError
from eagle3lab.specdec.batched import BatchedEngine

KW = dict(prompts="eval", limit=6, max_new_tokens=16, progress=False)


def _static(**kw):
    return regenerate(engine="static", engine_class=BatchedEngine, **kw)


@pytest.fixture(scope="module")
def static3(real_target, tmp_path_factory):
    """The static engine's greedy records at batch size 3 in one run (one chunk), made
    once: compared with hf's, the file a killed and resumed run must write, and the greedy
    twin of the sampled records. (path, regenerate's summary)"""
    out = tmp_path_factory.mktemp("static3") / "static3.jsonl"
    return out, _static(target=real_target, out=out, batch_size=3, **KW)


@pytest.mark.real
def test_greedy_static_records_equal_hf_records(real_target, static3, tmp_path):
    regenerate(target=real_target, out=tmp_path / "hf.jsonl", batch_size=3, **KW)
    hf = (tmp_path / "hf.jsonl").read_text()
    static1 = tmp_path / "static1.jsonl"
    s1 = _static(target=real_target, out=static1, batch_size=1, **KW)
    for out, s in ((static1, s1), static3):  # batch sizes 1 and 3
        assert s["new_records"] == 6 and s["new_tokens"] > 0
        assert out.read_text() == hf  # ids, text, finish reasons: every byte
    recs = read_conversations(tmp_path / "hf.jsonl")
    assert {r["finish_reason"] for r in recs} >= {"length"}
    assert all(r["seed"] is None for r in recs)
    meta = json.loads(meta_path(static3[0]).read_text())
    assert meta["params"]["engine"] == "static" and "seeding" not in meta


@pytest.mark.real
def test_killed_after_a_chunk_resumes_to_the_one_run_file(real_target, static3, tmp_path,
                                                           monkeypatch):
    one = static3[0]  # one run, unkilled (the records do not depend on the chunking)
    monkeypatch.setattr(regen_mod, "STATIC_CHUNK_ROWS", 1)  # chunks of 3: two of them
    write = RegenerateStage.write
    calls = []

    def write_then_die(self, unit, result):
        write(self, unit, result)
        calls.append(len(unit))
        raise KeyboardInterrupt

    monkeypatch.setattr(RegenerateStage, "write", write_then_die)
    out = tmp_path / "resumed.jsonl"
    with pytest.raises(KeyboardInterrupt):
        _static(target=real_target, out=out, batch_size=3, **KW)
    assert calls == [3] and len(read_conversations(out)) == 3
    monkeypatch.setattr(RegenerateStage, "write", write)
    s = _static(target=real_target, out=out, batch_size=3, **KW)
    assert s["new_records"] == 3 and s["records"] == 6
    assert out.read_text() == one.read_text()


@pytest.mark.real
def test_sampled_static_is_seeded_per_prompt(real_target, static3, tmp_path):
    kw = dict(KW, target=real_target, batch_size=3, temperature=0.8, seed=11)
    _static(out=tmp_path / "a.jsonl", **kw)
    _static(out=tmp_path / "b.jsonl", **dict(kw, batch_size=2))  # another chunking
    a, b = (read_conversations(tmp_path / f"{n}.jsonl") for n in "ab")
    assert a == b
    assert [r["seed"] for r in a] == [11 + i for i in range(6)]
    meta = json.loads(meta_path(tmp_path / "a.jsonl").read_text())
    assert meta["seeding"] == "per prompt: seed + prompt index"
    greedy = read_conversations(static3[0])
    assert [r["input_ids"] for r in a] != [r["input_ids"] for r in greedy]
    assert [r["input_ids"][:r["prompt_tokens"]] for r in a] == \
        [r["input_ids"][:r["prompt_tokens"]] for r in greedy]


def test_the_engine_is_part_of_a_files_identity(tiny_target, tmp_path):
    out = tmp_path / "r.jsonl"
    kw = dict(target=tiny_target, prompts="eval", limit=2, max_new_tokens=4, progress=False)
    regenerate(out=out, **kw)
    with pytest.raises(UserError, match="engine='hf' now 'static'"):
        _static(out=out, **kw)
    # a file made before the engine was recorded reads as hf: resumed by hf, refused static
    meta = json.loads(meta_path(out).read_text())
    del meta["params"]["engine"]
    meta_path(out).write_text(json.dumps(meta))
    assert regenerate(out=out, **dict(kw, limit=3))["new_records"] == 1
    meta_path(out).write_text(json.dumps(meta))
    with pytest.raises(UserError, match="engine='hf' now 'static'"):
        _static(out=out, **kw)


def test_static_refusals(tiny_target, tmp_path):
    kw = dict(target=tiny_target, out=tmp_path / "r.jsonl", progress=False)
    with pytest.raises(UserError, match="engine_class=eagle3lab.specdec.batched"):
        regenerate(engine="static", **kw)
    with pytest.raises(UserError, match="Drop one of the two"):
        _static(server="http://127.0.0.1:9", **kw)
    assert not (tmp_path / "r.jsonl").exists()


def test_cli_engine_static(tiny_target_dir, tmp_path, capsys):
    from eagle3lab.cli import main

    common = ["--target", str(tiny_target_dir), "--prompts", "eval", "--limit", "3",
              "--max-new-tokens", "5", "--batch-size", "2", "--no-progress"]
    assert main(["regenerate", *common, "--out", str(tmp_path / "s.jsonl"),
                 "--engine", "static"]) == 0
    assert main(["regenerate", *common, "--out", str(tmp_path / "h.jsonl")]) == 0
    assert "3 records" in capsys.readouterr().out
    assert (tmp_path / "s.jsonl").read_text() == (tmp_path / "h.jsonl").read_text()
    assert json.loads(meta_path(tmp_path / "s.jsonl").read_text())["params"]["engine"] == \
        "static"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (device tool)")
def test_static_on_gpu_writes_the_hf_records(tiny_target_dir, tmp_path):
    """On a GPU in fp32, CUDA graphs captured: the records are hf's (the tiny target's
    rounding as in tests/specdec/test_batched.py's GPU test)."""
    from eagle3lab.targets.adapter import load_target

    tgt = load_target(str(tiny_target_dir), device="cuda")
    kw = dict(target=tgt, prompts="eval", limit=20, max_new_tokens=16, batch_size=8,
              progress=False)
    regenerate(out=tmp_path / "hf.jsonl", **kw)
    _static(out=tmp_path / "static.jsonl", **kw)
    assert (tmp_path / "static.jsonl").read_text() == (tmp_path / "hf.jsonl").read_text()
