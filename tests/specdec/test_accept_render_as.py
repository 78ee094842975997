"""`accept --render-as`: the eval prompts rendered as serving will (a preset, a settings
file, a Jinja template), the rendering recorded in the result; a bad value is one line
before anything is loaded. Tiny target (SmolLM2's tokenizer and template), tiny drafter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3lab.data.rendering import Renderer
from eagle3lab.errors import UserError
from eagle3lab.specdec.accept import measure_acceptance, prompt_ids, rendering_of

STRIPPED = Path(__file__).resolve().parents[2] / "data" / "templates" / \
    "chatml-no-default-system.jinja"
KW = dict(limit=2, max_new_tokens=4, steps=2, progress=False)


def test_prompts_are_rendered_as_asked(tiny_target):
    tok = tiny_target.tokenizer
    ids = {name: [x for _, x in prompt_ids(tok, "eval", 1, 4096, r)] for name, r in (
        ("default", None), ("empty", Renderer(tok, system_prompt="")),
        ("stripped", Renderer(tok, chat_template=STRIPPED)))}
    text = {k: tok.decode(v[0]) for k, v in ids.items()}
    assert text["default"].startswith("<|im_start|>system\nYou are a helpful AI assistant")
    assert text["empty"].startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n")
    assert text["stripped"].startswith("<|im_start|>user\n")
    # the three differ only in the system block: the user turn and the answer's start agree
    tails = {t[t.index("<|im_start|>user"):] for t in text.values()}
    assert len(tails) == 1


@pytest.mark.parametrize("render_as, system, source", [
    (None, None, "tokenizer"), ("empty-system", "", "tokenizer"),
    (str(STRIPPED), None, "file")])
def test_the_rendering_is_recorded(tiny_target, tiny_draft, render_as, system, source):
    r = measure_acceptance(target=tiny_target, draft=str(tiny_draft), render_as=render_as, **KW)
    rec = r["rendering"]
    assert rec["system_prompt"] == system and rec["chat_template"]["source"] == source
    assert rec == Renderer.from_settings(tiny_target.tokenizer, render_as).record()
    assert rec == rendering_of(tiny_target.tokenizer, render_as)  # known before decoding
    assert r["arms"][0]["matches_plain"] == 2


def test_cli_render_as_a_settings_file(tiny_target_dir, tiny_draft, tmp_path, capsys):
    from eagle3lab.cli import main

    f = tmp_path / "serve.json"
    f.write_text(json.dumps({"chat_template": str(STRIPPED), "system_prompt": "Be brief.",
                             "template_kwargs": {"enable_thinking": False}}))
    rc = main(["accept", "--target", str(tiny_target_dir), "--draft", str(tiny_draft),
               "--limit", "1", "--max-new-tokens", "4", "--steps", "2", "--render-as",
               str(f), "--json"])
    assert rc == 0
    rec = json.loads(capsys.readouterr().out)["rendering"]
    assert rec["system_prompt"] == "Be brief." and rec["chat_template"]["path"] == str(STRIPPED)
    assert rec["template_kwargs"] == {"enable_thinking": False}


def test_a_bad_render_as_is_one_line_before_loading(tiny_draft, tmp_path, monkeypatch,
                                                   capsys):
    import eagle3lab.targets.adapter as adapter
    from eagle3lab.cli import main

    def no_loading(*a, **k):
        raise AssertionError("the target was loaded before the bad value was refused")

    monkeypatch.setattr(adapter, "load_target", no_loading)
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    for value, why in (("no-such-preset", "neither a preset"), (str(bad), "does not render")):
        with pytest.raises(UserError, match=why):
            measure_acceptance(target="x", draft=str(tiny_draft), render_as=value, **KW)
        rc = main(["accept", "--target", "x", "--draft", str(tiny_draft), "--render-as",
                   value, "--json"])
        err = capsys.readouterr().err.strip()
        assert rc == 1 and len(err.splitlines()) == 1 and why in err


def test_render_as_trained_follows_the_drafters_record(tiny_target, tiny_draft, tmp_path):
    import shutil

    from eagle3lab.data.rendering import template_sha256

    draft = tmp_path / "draft"
    shutil.copytree(tiny_draft, draft)
    with pytest.raises(UserError, match="records no rendering") as e:  # no record: unknown
        measure_acceptance(target=tiny_target, draft=str(draft), render_as="trained", **KW)
    assert "\n" not in str(e.value)
    rec = Renderer(tiny_target.tokenizer, chat_template=STRIPPED, system_prompt="").record()
    (draft / "eagle3lab.json").write_text(json.dumps({"format": "eagle3lab-run",
                                                      "rendering": rec}))
    r = measure_acceptance(target=tiny_target, draft=str(draft), render_as="trained", **KW)
    assert r["rendering"] == rec == rendering_of(tiny_target.tokenizer, "trained",
                                                 draft=str(draft))
    with pytest.raises(UserError, match="needs a drafter"):
        rendering_of(tiny_target.tokenizer, "trained")
    # trained with the tokenizer's template of another version: not reproducible here
    other = {**Renderer(tiny_target.tokenizer).record()}
    other["chat_template"] = {**other["chat_template"], "sha256": template_sha256("v0")}
    (draft / "eagle3lab.json").write_text(json.dumps({"rendering": other}))
    with pytest.raises(UserError, match="another template or tokenizer"):
        measure_acceptance(target=tiny_target, draft=str(draft), render_as="trained", **KW)
