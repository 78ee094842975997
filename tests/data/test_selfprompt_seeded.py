"""Self-prompting seeded by prompts (`--seed-prompts`, e.g. weak spots exported by
`eagle3lab weak-spots --export`): each batch's prefix shows a few of them, drawn with the
batch's seed, before the user turn; a copy of a seed is dropped as a duplicate; the seed
file is recorded and resume-checked. The tiny target's model is swapped for one that
records its input and writes scripted user turns (a random tiny Llama never ends a turn)."""

from __future__ import annotations

import copy
import json

import pytest

from eagle3lab.data.prompts import load_prompts
from eagle3lab.data.selfprompt import (meta_path, seeded_system, synthesize_prompts,
                                       user_turn_prefix)
from eagle3lab.errors import UserError

SEEDS = ["Write a Python function that reverses a linked list.",
         "Fix this SQL query: SELECT * FROM users WHERE id = ;",
         "How do I clean a chair at home without special tools?",
         "Explain big-O notation with a code example."]


class _Recording:
    """generate() records the prefix it was given and writes one of `rows` per row."""

    def __init__(self, model, rows):
        self._model, self.rows, self.prefixes = model, rows, []
        self.config, self.generation_config = model.config, model.generation_config

    def parameters(self):
        return self._model.parameters()

    def generate(self, *, input_ids, max_new_tokens, pad_token_id, **_):
        import torch

        self.prefixes.append(input_ids[0].tolist())
        pick = torch.randint(len(self.rows), (input_ids.shape[0],)).tolist()
        new = torch.full((input_ids.shape[0], max_new_tokens), pad_token_id, dtype=torch.long)
        for r, i in enumerate(pick):
            new[r, :len(self.rows[i])] = torch.tensor(self.rows[i][:max_new_tokens])
        return torch.cat([input_ids, new], dim=1)


@pytest.fixture()
def recording(tiny_target):
    tgt = copy.copy(tiny_target)
    tok = tgt.tokenizer
    _, end = user_turn_prefix(tok)
    texts = [f"How do I {v} a {n} at home without special tools?"
             for v in ("clean", "fix", "paint") for n in ("chair", "table", "lamp", "door")]
    tgt.model = _Recording(tiny_target.model,
                           [tok(t, add_special_tokens=False).input_ids + [end] for t in texts])
    return tgt


@pytest.fixture()
def seed_file(tmp_path):
    p = tmp_path / "weak.jsonl"
    p.write_text("".join(json.dumps({"id": f"weak-{i}", "prompt": t, "category": "code"})
                         + "\n" for i, t in enumerate(SEEDS)))
    return p


KW = dict(batch_size=6, max_new_tokens=24, progress=False, exclude="none")


def test_each_batch_shows_seed_prompts_before_the_user_turn(recording, seed_file, tmp_path):
    out = tmp_path / "p.jsonl"
    s = synthesize_prompts(target=recording, out=out, n=8, seed_prompts=str(seed_file),
                           seed_examples=2, **KW)
    assert s["prompts"] == 8
    tok = recording.tokenizer
    shown_sets = set()
    for prefix in recording.model.prefixes:
        text = tok.decode(prefix)
        assert "Users of this assistant write messages like these:" in text
        shown = [t for t in SEEDS if t in text]
        assert len(shown) == 2
        shown_sets.add(tuple(shown))
        assert text.rstrip().endswith("user")  # the examples sit before the user turn
    assert len(shown_sets) > 1, "batches draw their own examples (seed + batch)"
    kept = [p.prompt for p in load_prompts(out)]
    assert SEEDS[2] not in kept  # a copy of a seed prompt is a duplicate
    params = json.loads(meta_path(out).read_text())["params"]
    assert params["seed_prompts_sha256"] and params["seed_examples"] == 2
    # the same batch gets the same examples again: the prefix is a function of the seed
    again = synthesize_prompts(target=recording, out=tmp_path / "q.jsonl", n=8,
                               seed_prompts=str(seed_file), seed_examples=2, **KW)
    assert again["prompts"] == 8
    n = len(recording.model.prefixes) // 2
    assert recording.model.prefixes[:n] == recording.model.prefixes[n:]


def test_resume_with_other_seeds_is_refused_and_unseeded_files_still_resume(
        recording, seed_file, tmp_path):
    out = tmp_path / "p.jsonl"
    synthesize_prompts(target=recording, out=out, n=4, **KW)  # no seeds: as before
    assert json.loads(meta_path(out).read_text())["params"]["seed_prompts_sha256"] is None
    assert synthesize_prompts(target=recording, out=out, n=6, **KW)["prompts"] == 6
    with pytest.raises(UserError, match="seed_prompts_sha256"):
        synthesize_prompts(target=recording, out=out, n=8, seed_prompts=str(seed_file), **KW)


def test_seeded_system_message():
    s = seeded_system("Be brief.", ["a  b\nc", "d"])
    assert s.startswith("Be brief.\n\n") and s.endswith("- a b c\n- d")
    assert seeded_system(None, ["x"]).startswith("Users of this assistant")
