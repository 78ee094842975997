"""Self-prompting: the filters, n distinct loadable prompts, resume without repeats (ids
and batch seeds), torn lines, refusals; the real target's user-turn prefix and prompts.

A random tiny Llama almost never writes the end-of-turn token, so the loop is tested with
the tiny target's model swapped for a scripted one: each row writes one of a fixed list
of user turns, picked with torch's RNG (so the per-batch seed decides, as in sampling).
The real SmolLM2 target checks the positive path end to end (marked real)."""

from __future__ import annotations

import copy
import json

import pytest

from eagle3lab.errors import UserError
from eagle3lab.data.prompts import load_prompts
from eagle3lab.data.selfprompt import (DROP_REASONS, classify, meta_path, normalise, shingles,
                                  synthesize_prompts, user_turn_prefix)

HELD = "Explain the rules of cricket to someone who has never watched a single match"


@pytest.fixture()
def exclude_file(tmp_path):
    p = tmp_path / "held.jsonl"
    p.write_text(json.dumps({"id": "e1", "prompt": HELD}) + "\n"
                 + json.dumps({"id": "e2", "prompt": "Name three colours."}) + "\n")
    return p


class _ScriptedModel:
    """The target's model, except that generate() writes scripted user turns."""

    def __init__(self, model, rows: list[list[int]]):
        self._model, self.rows = model, rows
        self.config, self.generation_config = model.config, model.generation_config

    def parameters(self):
        return self._model.parameters()

    def generate(self, *, input_ids, max_new_tokens, pad_token_id, **_):
        import torch

        pick = torch.randint(len(self.rows), (input_ids.shape[0],)).tolist()
        new = torch.full((input_ids.shape[0], max_new_tokens), pad_token_id, dtype=torch.long)
        for r, i in enumerate(pick):
            ids = self.rows[i][:max_new_tokens]
            new[r, :len(ids)] = torch.tensor(ids)
        return torch.cat([input_ids, new], dim=1)


def _rows(tok, end: int) -> list[list[int]]:
    """40 distinct good turns (so samples repeat some), and several of each bad kind."""
    def ids(text):
        return tok(text, add_special_tokens=False).input_ids

    good = [ids(f"How do I {v} a {n} at home without special tools?") + [end]
            for v in ("clean", "fix", "paint", "build", "move")
            for n in ("chair", "table", "lamp", "door", "window", "shelf", "bike", "clock")]
    start = tok.convert_tokens_to_ids("<|im_start|>")
    bad = [ids("Tell me a story about a dragon who " + "flies " * 80),  # no end: too long
           ids("What is the capital of France?") + [start] + ids("assistant\nParis") + [end],
           ids("Hi there!") + [end],
           ids("Quick one: explain the rules of cricket to someone who has never seen it")
           + [end],
           ids("name three COLOURS") + [end]]  # equals a held-out prompt once normalised
    return good + bad * 6


@pytest.fixture()
def scripted(tiny_target):
    tgt = copy.copy(tiny_target)
    _, end = user_turn_prefix(tgt.tokenizer)
    tgt.model = _ScriptedModel(tiny_target.model, _rows(tgt.tokenizer, end))
    return tgt


def _recs(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


KW = dict(batch_size=8, max_new_tokens=40, progress=False)


# --- the filter ----------------------------------------------------------------------------
def test_normalise_and_shingles():
    assert normalise("  Hello, WORLD!\n2+2? ") == "hello world 2 2"
    assert shingles("one two three", n=2) == {"one two", "two three"}
    assert shingles("too short", n=8) == set()
    assert len(shingles(HELD)) == len(HELD.split()) - 7


def test_classify():
    held_norm, held_sh = {normalise(HELD)}, shingles(HELD)

    def c(text, stop=True, seen=()):
        return classify(text, stop, set(seen), held_norm, held_sh, 4)

    assert c("How do I fix a chair at home?") is None
    assert c("How do I fix a chair at home?", stop=False) == "unfinished"
    assert c("Hi there!") == "too_short" and c("one two three four") is None
    assert c("HOW do I fix a chair, at home", seen={"how do i fix a chair at home"}) \
        == "duplicate"
    assert c(HELD.upper() + "!") == "eval_overlap"
    # one shared 8-word run is enough; 7 words are not
    assert c("So: explain the rules of cricket to someone who knows") == "eval_overlap"
    assert c("So: explain the rules of cricket to someone please") is None
    assert set(DROP_REASONS) == {"unfinished", "too_short", "duplicate", "eval_overlap"}


def test_no_chat_template_is_refused(tiny_target, tmp_path):
    assert tiny_target.tokenizer.chat_template  # the tiny target has SmolLM2's template
    tgt = copy.copy(tiny_target)
    tgt.tokenizer = copy.copy(tiny_target.tokenizer)
    tgt.tokenizer.chat_template = None
    with pytest.raises(UserError, match="needs a chat template"):
        synthesize_prompts(target=tgt, out=tmp_path / "p.jsonl", n=2, **KW)
    with pytest.raises(UserError, match="temperature > 0"):
        synthesize_prompts(target=tiny_target, out=tmp_path / "p.jsonl", n=2,
                           temperature=0, **KW)


# --- the loop (scripted model) ---------------------------------------------------------------
def test_writes_n_distinct_loadable_prompts(scripted, exclude_file, tmp_path):
    out = tmp_path / "p.jsonl"
    s = synthesize_prompts(target=scripted, out=out, n=20, exclude=exclude_file, **KW)
    assert s["prompts"] == 20
    recs = _recs(out)
    assert [r["id"] for r in recs] == [f"self-{i:06d}" for i in range(20)]
    assert len({normalise(r["prompt"]) for r in recs}) == 20
    assert all(r["prompt"].startswith("How do I ") and r["category"] == "self"
               and r["seed"] == r["batch"] for r in recs)
    assert [p.id for p in load_prompts(out)] == [r["id"] for r in recs]
    c = s["counts"]
    assert all(c[r] > 0 for r in DROP_REASONS), c
    assert c["sampled"] == c["kept"] + sum(c[r] for r in DROP_REASONS)
    assert s["keep_rate"] == pytest.approx(20 / c["sampled"])
    meta = json.loads(meta_path(out).read_text())
    assert meta["counts"] == c and meta["batches_done"] == s["batches"]
    assert meta["params"]["exclude_sha256"] and meta["target"]["name"]


def test_resume_appends_without_repeats(scripted, exclude_file, tmp_path):
    out = tmp_path / "p.jsonl"
    first = synthesize_prompts(target=scripted, out=out, n=6, exclude=exclude_file, **KW)
    with open(out, "a") as f:  # a crash mid-write leaves a torn last line
        f.write('{"id": "self-000006", "prompt": "How do I')
    s = synthesize_prompts(target=scripted, out=out, n=12, exclude=exclude_file, **KW)
    recs = _recs(out)
    assert s["prompts"] == 12 and [r["id"] for r in recs] == [f"self-{i:06d}"
                                                              for i in range(12)]
    assert len({normalise(r["prompt"]) for r in recs}) == 12
    batches = [r["batch"] for r in recs]
    assert batches == sorted(batches) and batches[6] >= first["batches"]  # new batch seeds
    # complete: a third run samples nothing
    assert synthesize_prompts(target=scripted, out=out, n=12, exclude=exclude_file,
                              **KW)["batches"] == s["batches"]
    with pytest.raises(UserError, match=r"temperature=1\.0 now 0\.7"):
        synthesize_prompts(target=scripted, out=out, n=20, exclude=exclude_file,
                           temperature=0.7, **KW)
    with pytest.raises(UserError, match="exclude_sha256"):
        synthesize_prompts(target=scripted, out=out, n=20, exclude=None, **KW)
    # a bad line that is not the last one is not a torn write: refused, nothing cut
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3] + ["garbage\n"] + lines[3:]))
    with pytest.raises(UserError, match="line 4"):
        synthesize_prompts(target=scripted, out=out, n=20, exclude=exclude_file, **KW)
    assert len(out.read_text().splitlines()) == 13


def test_batches_that_keep_nothing_are_not_resampled(tiny_target, tmp_path):
    tgt = copy.copy(tiny_target)
    _, end = user_turn_prefix(tgt.tokenizer)
    tgt.model = _ScriptedModel(tiny_target.model, [tgt.tokenizer("Hi!").input_ids + [end]])
    out = tmp_path / "p.jsonl"
    s = synthesize_prompts(target=tgt, out=out, n=4, max_batches=2, exclude=None, **KW)
    assert s["prompts"] == 0 and s["batches"] == 2 and s["counts"]["too_short"] == 16
    s = synthesize_prompts(target=tgt, out=out, n=4, max_batches=3, exclude=None, **KW)
    assert s["batches"] == 3 and s["counts"]["sampled"] == 24


def test_cli_self_prompt(scripted, exclude_file, tmp_path, monkeypatch, capsys):
    import eagle3lab.targets.adapter
    from eagle3lab.cli import main

    monkeypatch.setattr(eagle3lab.targets.adapter, "load_target", lambda *a, **k: scripted)
    out = tmp_path / "p.jsonl"
    rc = main(["self-prompt", "--out", str(out), "--n", "5", "--batch-size", "8",
               "--exclude", str(exclude_file), "--no-progress"])
    assert rc == 0 and len(load_prompts(out)) == 5
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{out}: 5 prompts after ") and "keep rate" in line
    assert all(f"{r} " in line for r in DROP_REASONS)
    rc = main(["self-prompt", "--out", str(out), "--n", "6", "--seed", "1", "--exclude",
               str(exclude_file), "--no-progress"])
    assert rc == 1 and "seed=0 now 1" in capsys.readouterr().err


# --- the real target -------------------------------------------------------------------------
@pytest.mark.real
def test_real_user_turn_prefix(default_target_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(default_target_dir))
    prefix, end = user_turn_prefix(tok)
    assert tok.decode(prefix) == ("<|im_start|>system\nYou are a helpful AI assistant named "
                                  "SmolLM, trained by Hugging Face<|im_end|>\n"
                                  "<|im_start|>user\n")
    assert tok.convert_ids_to_tokens(end) == "<|im_end|>"
    prefix, _ = user_turn_prefix(tok, "Be brief.")
    assert tok.decode(prefix) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"


@pytest.mark.real
@pytest.mark.slow
def test_real_target_writes_prompts_and_resumes(real_target, tmp_path):
    tgt = real_target
    out = tmp_path / "p.jsonl"
    kw = dict(target=tgt, out=out, batch_size=8, max_new_tokens=48, progress=False)
    first = synthesize_prompts(n=3, **kw)
    s = synthesize_prompts(n=6, **kw)
    plist = load_prompts(out)
    assert first["prompts"] == 3 and s["prompts"] == 6 and len(plist) == 6
    assert len({p.id for p in plist}) == 6 and len({normalise(p.prompt) for p in plist}) == 6
    assert all(len(normalise(p.prompt).split()) >= 4 for p in plist)
    assert all("<|im_" not in p.prompt for p in plist)
    recs = _recs(out)
    assert recs[3]["batch"] >= first["batches"]
    evals = load_prompts("eval")
    held = set().union(*(shingles(p.prompt) for p in evals))
    assert not any(shingles(p.prompt) & held for p in plist)


def test_two_ranks_write_what_one_process_writes(scripted, exclude_file, tmp_path):
    """Two ranks forked with torchrun's variables (testutil.fork_ranks), each with the
    scripted model."""
    from testutil import fork_ranks

    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    s = synthesize_prompts(target=scripted, out=one, n=20, exclude=exclude_file, **KW)
    # rounds of 2 batches (rank r samples batch 2k + r): an odd count means the 20th prompt
    # came in a round's first batch, and its second was sampled but neither kept nor counted
    assert s["batches"] % 2 == 1 and s["counts"]["sampled"] < 8 * s["batches"]
    fork_ranks(lambda rank: synthesize_prompts(target=scripted, out=two, n=20,
                                               exclude=exclude_file, **KW))
    assert two.read_text() == one.read_text()
    m1, m2 = (json.loads(meta_path(p).read_text()) for p in (one, two))
    assert m2["counts"] == m1["counts"] == s["counts"]
    assert m2["batches_done"] == m1["batches_done"] == s["batches"]
