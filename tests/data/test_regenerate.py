"""Regeneration: records and loss masks, resumption without duplicates, refusals."""

import json

import pytest

from eagle3lab.errors import UserError
from eagle3lab.data.prompts import read_conversations
from eagle3lab.data.regenerate import made_with_engine, meta_path, regenerate


@pytest.fixture()
def prompts_file(tmp_path):
    p = tmp_path / "prompts.jsonl"
    lines = [{"id": f"p{i}", "prompt": t} for i, t in enumerate(
        ["What is 2+2?", "Name a colour.", "Say hello.", "Count to three.", "Why is the sky "
         "blue?", "Write one word."])]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def _ids(path):
    return [r["id"] for r in read_conversations(path)]


def test_records_and_loss_mask(tiny_target, prompts_file, tmp_path):
    out = tmp_path / "r.jsonl"
    s = regenerate(target=tiny_target, prompts=prompts_file, out=out, max_new_tokens=6,
                   batch_size=4, progress=False)
    assert s["records"] == 6 and s["new_records"] == 6
    tok = tiny_target.tokenizer
    for rec in read_conversations(out):
        n_p, n_r = rec["prompt_tokens"], rec["response_tokens"]
        assert len(rec["input_ids"]) == len(rec["loss_mask"]) == n_p + n_r
        assert rec["loss_mask"] == [0] * n_p + [1] * n_r
        assert 1 <= n_r <= 6
        # the stored prompt ids are exactly the chat-templated prompt
        assert tok.decode(rec["input_ids"][:n_p]).endswith("<|im_start|>assistant\n")
    meta = json.loads(meta_path(out).read_text())
    assert meta["target"]["config_sha256"] == tiny_target.config_sha256
    assert meta["params"]["max_new_tokens"] == 6


def test_resume_never_duplicates(tiny_target, prompts_file, tmp_path):
    out = tmp_path / "r.jsonl"
    regenerate(target=tiny_target, prompts=prompts_file, out=out, limit=2, max_new_tokens=4,
               batch_size=4, progress=False)
    # a crash mid-write leaves a torn last line
    with open(out, "a") as f:
        f.write('{"id": "p2", "prompt": "Say hel')
    s = regenerate(target=tiny_target, prompts=prompts_file, out=out, max_new_tokens=4,
                   batch_size=4, progress=False)
    assert s["new_records"] == 4
    assert _ids(out) == [f"p{i}" for i in range(6)]
    s = regenerate(target=tiny_target, prompts=prompts_file, out=out, max_new_tokens=4,
                   progress=False)
    assert s["new_records"] == 0 and _ids(out) == [f"p{i}" for i in range(6)]
    # a bad line with good ones after it is not a torn write: refused, nothing cut
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2] + ["garbage\n"] + lines[2:]))
    with pytest.raises(UserError, match="line 3"):
        regenerate(target=tiny_target, prompts=prompts_file, out=out, max_new_tokens=4,
                   progress=False)
    assert len(out.read_text().splitlines()) == 7


def test_sampling_is_seeded(tiny_target, prompts_file, tmp_path):
    kw = dict(target=tiny_target, prompts=prompts_file, max_new_tokens=8, batch_size=3,
              temperature=1.0, seed=7, progress=False)
    regenerate(out=tmp_path / "a.jsonl", **kw)
    regenerate(out=tmp_path / "b.jsonl", **kw)
    a, b = read_conversations(tmp_path / "a.jsonl"), read_conversations(tmp_path / "b.jsonl")
    assert [r["input_ids"] for r in a] == [r["input_ids"] for r in b]
    assert {r["seed"] for r in a} == {7, 10}


def test_changed_parameters_refused(tiny_target, prompts_file, tmp_path):
    out = tmp_path / "r.jsonl"
    regenerate(target=tiny_target, prompts=prompts_file, out=out, limit=1, max_new_tokens=4,
               progress=False)
    with pytest.raises(UserError, match="max_new_tokens=4 now 8"):
        regenerate(target=tiny_target, prompts=prompts_file, out=out, max_new_tokens=8,
                   progress=False)


def test_made_with_engine_reads_the_meta_and_older_files_as_hf(tiny_target, prompts_file,
                                                                tmp_path):
    out = tmp_path / "r.jsonl"
    assert made_with_engine(out) is None  # nothing there yet
    regenerate(target=tiny_target, prompts=prompts_file, out=out, limit=1, max_new_tokens=4,
               progress=False)
    assert made_with_engine(out) == "hf"
    meta = json.loads(meta_path(out).read_text())
    meta["params"]["engine"] = "static"
    meta_path(out).write_text(json.dumps(meta))
    assert made_with_engine(out) == "static"
    del meta["params"]["engine"]  # made before the engine was recorded
    meta_path(out).write_text(json.dumps(meta))
    assert made_with_engine(out) == "hf"


def test_malformed_prompt_line_named(tiny_target, tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "ok"}\n{"prompt": "missing brace"\n')
    with pytest.raises(UserError, match=r"bad.jsonl, line 2: not valid JSON"):
        regenerate(target=tiny_target, prompts=p, out=tmp_path / "r.jsonl", progress=False)


def test_unwritable_output(tiny_target, prompts_file, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="not writable"):
        regenerate(target=tiny_target, prompts=prompts_file, out=blocker / "sub" / "r.jsonl",
                   progress=False)


@pytest.mark.real
def test_real_target_resumes_without_duplicates(real_target, tmp_path):
    tgt = real_target
    out = tmp_path / "r.jsonl"
    regenerate(target=tgt, prompts="eval", out=out, limit=2, max_new_tokens=12,
               batch_size=2, progress=False)
    first = read_conversations(out)
    s = regenerate(target=tgt, prompts="eval", out=out, limit=4, max_new_tokens=12,
                   batch_size=2, progress=False)
    recs = read_conversations(out)
    assert s["new_records"] == 2
    assert [r["id"] for r in recs] == [r["id"] for r in recs[:4]] and len(recs) == 4
    assert len({r["id"] for r in recs}) == 4
    assert recs[:2] == first
    # a real model answers in words: the response decodes to non-empty text
    assert all(r["response"].strip() for r in recs)


def test_several_samples_per_prompt(tiny_target, prompts_file, tmp_path):
    out = tmp_path / "r.jsonl"
    with pytest.raises(UserError, match="needs temperature > 0"):
        regenerate(target=tiny_target, prompts=prompts_file, out=out, samples=2,
                   progress=False)
    s = regenerate(target=tiny_target, prompts=prompts_file, out=out, limit=2, samples=3,
                   temperature=1.0, max_new_tokens=4, batch_size=4, progress=False)
    assert s["records"] == 6
    assert sorted(_ids(out)) == sorted(f"p{i}#{k}" for i in range(2) for k in range(3))
