"""How text was rendered: the one renderer (template file, system prompt None vs "",
template kwargs), its record in every data artifact (self-prompt's and regenerate's meta
files, the shard manifest), unknown for data without one, refused resumes, one-line errors
for a template that does not render.

The tiny target carries SmolLM2's real tokenizer and chat template (tests/conftest.py), so
the template behaviour checked here is the default target's; the real default target runs
regenerate once (marked real)."""

from __future__ import annotations

import copy
import json
import os

import pytest

from testutil import write_conversations
from eagle3lab.errors import UserError
from eagle3lab.data import rendering
from eagle3lab.data.extract import extract
from eagle3lab.data.prompts import chat_prompt_ids, read_conversations
from eagle3lab.data.regenerate import conversations_rendering, meta_path, regenerate
from eagle3lab.data.rendering import (Renderer, is_unknown, load_render_settings,
                                      parse_template_kwargs, same_rendering)
from eagle3lab.data.selfprompt import synthesize_prompts, user_turn_prefix
from eagle3lab.data.shards import MANIFEST, ShardSet

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
#: ChatML without SmolLM2's default system block, and with a thinking switch.
THINKING = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
            "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and not "
            "enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}")


@pytest.fixture()
def thinking_template(tmp_path):
    p = tmp_path / "thinking.jinja"
    p.write_text(THINKING)
    return p


@pytest.fixture()
def prompts_file(tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in
                         enumerate(["What is 2+2?", "Name a colour.", "Say hello."])))
    return p


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


# --- the renderer --------------------------------------------------------------------------
def test_empty_system_prompt_is_not_none(tiny_target):
    tok = tiny_target.tokenizer
    none, empty = Renderer(tok), Renderer(tok, system_prompt="")
    t_none = none.render_text(none.messages("hi"))
    t_empty = empty.render_text(empty.messages("hi"))
    assert DEFAULT_SYSTEM in t_none  # SmolLM2's template injects its default
    assert t_empty.startswith("<|im_start|>system\n<|im_end|>\n") and DEFAULT_SYSTEM not in t_empty
    assert chat_prompt_ids(tok, "hi") != chat_prompt_ids(tok, "hi", "")
    assert tok.decode(chat_prompt_ids(tok, "hi", "")) == t_empty
    r_none, r_empty = none.record(), empty.record()
    assert r_none["system_prompt"] is None and r_empty["system_prompt"] == ""
    assert r_none["chat_template"] == r_empty["chat_template"]
    assert r_none["chat_template"]["source"] == "tokenizer"
    assert not same_rendering(r_none, r_empty) and same_rendering(r_none, Renderer(tok).record())
    # chat_prompt_ids without a renderer is the renderer with the tokenizer's template
    assert chat_prompt_ids(tok, "hi") == none.prompt_ids("hi")


def test_template_file_and_kwargs_reach_the_template(tiny_target, thinking_template):
    tok = tiny_target.tokenizer
    on = Renderer(tok, chat_template=thinking_template)
    off = Renderer(tok, chat_template=thinking_template,
                   template_kwargs='{"enable_thinking": false}')
    assert tok.decode(on.prompt_ids("hi")) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(off.prompt_ids("hi")).endswith("assistant\n<think>\n\n</think>\n\n")
    rec = off.record()
    assert rec["template_kwargs"] == {"enable_thinking": False}
    assert rec["chat_template"] == {"sha256": rendering.template_sha256(THINKING),
                                    "source": "file", "path": str(thinking_template)}
    assert rec["tokenizer_sha256"] == rendering.tokenizer_sha256(tok)
    assert not same_rendering(on.record(), rec)


def test_template_kwargs_are_checked():
    assert parse_template_kwargs(None) == {} and parse_template_kwargs(" ") == {}
    assert parse_template_kwargs('{"a": 1}') == {"a": 1}
    for bad, why in (("{nope", "not valid JSON"), ("[1]", "expected a JSON object"),
                     ('{"add_generation_prompt": true}', "set by the renderer")):
        with pytest.raises(UserError, match=why) as e:
            parse_template_kwargs(bad, "--template-kwargs")
        assert _one_line(e).startswith("--template-kwargs")


@pytest.mark.parametrize("text, error", [
    ("{% for m in messages %}{{ m['content'] }", "TemplateSyntaxError"),
    ("{{ raise_exception('system role not supported') }}", "system role not supported"),
    ("{{ messages[0]['content'] + 1 }}", "TypeError")])
def test_a_template_that_does_not_render_is_one_line(tiny_target, tmp_path, text, error):
    bad = tmp_path / "bad.jinja"
    bad.write_text(text)
    with pytest.raises(UserError) as e:
        Renderer(tiny_target.tokenizer, chat_template=bad)
    msg = _one_line(e)
    assert f"chat template file {bad} does not render" in msg and error in msg
    with pytest.raises(UserError, match="does not exist"):
        Renderer(tiny_target.tokenizer, chat_template=tmp_path / "missing.jinja")


def test_a_bad_template_file_on_the_command_line_is_one_line(tiny_target_dir, tmp_path,
                                                            prompts_file, capsys):
    from eagle3lab.cli import main

    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    rc = main(["regenerate", "--target", str(tiny_target_dir), "--device", "cpu", "--prompts",
               str(prompts_file), "--out", str(tmp_path / "r.jsonl"), "--chat-template",
               str(bad), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1
    assert str(bad) in err and "TemplateSyntaxError" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_render_settings_presets_and_files(tmp_path, thinking_template):
    assert load_render_settings(None).system_prompt is None
    assert load_render_settings("empty-system").system_prompt == ""
    assert load_render_settings(str(thinking_template)).chat_template == str(thinking_template)
    f = tmp_path / "serve.json"
    f.write_text(json.dumps({"chat_template": thinking_template.name, "system_prompt": None,
                             "template_kwargs": {"enable_thinking": False}}))
    s = load_render_settings(str(f))  # a relative template path: beside the settings file
    assert s.chat_template == str(tmp_path / "thinking.jinja")
    assert s.template_kwargs == {"enable_thinking": False}
    f.write_text(json.dumps({"chat_templat": None}))
    with pytest.raises(UserError, match="chat_templat") as e:
        load_render_settings(str(f))
    with pytest.raises(UserError, match="neither a preset") as e:
        load_render_settings("no-such-preset")
    _one_line(e)


# --- records in the artifacts --------------------------------------------------------------
def test_regenerate_and_extract_record_the_rendering(tiny_target, prompts_file,
                                                     thinking_template, tmp_path):
    out = tmp_path / "r.jsonl"
    regenerate(target=tiny_target, prompts=prompts_file, out=out, max_new_tokens=3,
               chat_template=str(thinking_template), system_prompt="",
               template_kwargs='{"enable_thinking": false}', progress=False)
    meta = json.loads(meta_path(out).read_text())
    rec = meta["rendering"]
    assert rec == Renderer(tiny_target.tokenizer, chat_template=thinking_template,
                           system_prompt="", template_kwargs={"enable_thinking": False}).record()
    assert meta["params"]["chat_template_sha256"] == rendering.template_sha256(THINKING)
    assert meta["params"]["template_kwargs"] == {"enable_thinking": False}
    tok = tiny_target.tokenizer
    for c in read_conversations(out):  # what was recorded is what was rendered
        assert tok.decode(c["input_ids"][:c["prompt_tokens"]]) == (
            f"<|im_start|>system\n<|im_end|>\n<|im_start|>user\n{c['prompt']}<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert conversations_rendering(out) == rec
    shards = tmp_path / "shards"
    extract(conversations=out, out=shards, target=tiny_target, progress=False)
    assert json.loads((shards / MANIFEST).read_text())["rendering"] == rec
    assert ShardSet(shards).rendering == rec


def test_a_resume_with_other_rendering_is_refused(tiny_target, prompts_file,
                                                  thinking_template, tmp_path):
    out = tmp_path / "r.jsonl"
    kw = dict(target=tiny_target, prompts=prompts_file, out=out, max_new_tokens=2,
              progress=False)
    regenerate(limit=1, **kw)
    for change, key in (({"system_prompt": ""}, "system_prompt"),
                        ({"chat_template": str(thinking_template)}, "chat_template_sha256"),
                        ({"template_kwargs": {"enable_thinking": False}}, "template_kwargs")):
        with pytest.raises(UserError, match=key) as e:
            regenerate(**kw, **change)
        _one_line(e)
    # a file made before rendering was recorded resumes with the tokenizer's template
    meta = json.loads(meta_path(out).read_text())
    for k in ("chat_template_sha256", "template_kwargs"):
        del meta["params"][k]
    del meta["rendering"]
    meta_path(out).write_text(json.dumps(meta))
    assert is_unknown(conversations_rendering(out))
    assert regenerate(**kw)["new_records"] == 2
    assert conversations_rendering(out) == Renderer(tiny_target.tokenizer).record()


def test_data_without_a_record_reads_as_unknown(tiny_target, tmp_path):
    convs = write_conversations(tmp_path / "c.jsonl", tiny_target.tokenizer, n=3)
    rec = conversations_rendering(convs)
    assert is_unknown(rec) and "no c.jsonl.meta.json" in rec["why"]
    extract(conversations=convs, out=tmp_path / "s", target=tiny_target, progress=False)
    assert is_unknown(ShardSet(tmp_path / "s").rendering)
    m = json.loads((tmp_path / "s" / MANIFEST).read_text())
    del m["rendering"]  # shards extracted before the record existed
    (tmp_path / "s" / MANIFEST).write_text(json.dumps(m))
    assert "records no rendering" in ShardSet(tmp_path / "s").rendering["why"]
    assert not same_rendering(rec, rec)  # unknown never matches, not even itself


def test_foreign_sets_are_unknown_naming_the_reader(tiny_target, tmp_path):
    from eagle3lab.data.foreign import open_shards
    from eagle3lab.data.foreign.write import write_as

    convs = write_conversations(tmp_path / "c.jsonl", tiny_target.tokenizer, n=3)
    extract(conversations=convs, out=tmp_path / "s", target=tiny_target, progress=False)
    environ = os.environ
    for tool, reader in (("specforge", "foreign.specforge"),
                         ("speculators", "foreign.speculators")):
        write_as(tool, shards=tmp_path / "s", out=tmp_path / tool,
                 target=str(tiny_target.path))
        # datasets' map swaps os.environ for a copy: the writer puts the process's back
        # (else this test's EAGLE3LAB_DATA outlived it and broke later real-target tests)
        assert os.environ is environ
        rec = open_shards(tmp_path / tool, target=str(tiny_target.path)).rendering
        assert is_unknown(rec) and reader in rec["why"]


def test_self_prompt_records_the_rendering(tiny_target, tmp_path):
    """Through the tiny (random) target nothing finishes, but the meta file is written
    before sampling; its prefix is the rendered user turn."""
    out = tmp_path / "p.jsonl"
    synthesize_prompts(target=tiny_target, out=out, n=1, batch_size=2, max_new_tokens=4,
                       max_batches=1, system_prompt="", exclude=None, progress=False)
    rec = json.loads(meta_path(out).read_text())["rendering"]
    r = Renderer(tiny_target.tokenizer, system_prompt="", add_generation_prompt=False)
    assert rec == r.record() and rec["add_generation_prompt"] is False
    prefix, _ = user_turn_prefix(tiny_target.tokenizer, renderer=r)
    assert tiny_target.tokenizer.decode(prefix) == \
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n"
    with pytest.raises(UserError, match="system_prompt"):
        synthesize_prompts(target=tiny_target, out=out, n=1, batch_size=2, max_new_tokens=4,
                           max_batches=1, exclude=None, progress=False)


# --- the real default target ---------------------------------------------------------------
@pytest.mark.real
def test_real_target_regenerate_records_and_renders_none_vs_empty(real_target, prompts_file,
                                                                  tmp_path):
    tok = real_target.tokenizer
    recs = {}
    for name, sp in (("none", None), ("empty", "")):
        out = tmp_path / f"{name}.jsonl"
        regenerate(target=real_target, prompts=prompts_file, out=out, limit=1,
                   max_new_tokens=2, system_prompt=sp, progress=False)
        c = read_conversations(out)[0]
        recs[name] = (tok.decode(c["input_ids"][:c["prompt_tokens"]]),
                      json.loads(meta_path(out).read_text())["rendering"])
    assert DEFAULT_SYSTEM in recs["none"][0] and DEFAULT_SYSTEM not in recs["empty"][0]
    assert recs["none"][1]["system_prompt"] is None and recs["empty"][1]["system_prompt"] == ""
    assert recs["none"][1]["chat_template"]["sha256"] == rendering.template_sha256(
        tok.chat_template)
    assert recs["none"][1]["tokenizer_sha256"] == rendering.tokenizer_sha256(tok)


def test_drafter_rendering_and_settings_from_a_record(tiny_target, thinking_template, tmp_path):
    from eagle3lab.data.rendering import settings_from_record
    from eagle3lab.formats.reader import drafter_rendering

    d = tmp_path / "drafter"
    d.mkdir()
    assert is_unknown(drafter_rendering(d))
    rec = Renderer(tiny_target.tokenizer, chat_template=thinking_template,
                   template_kwargs={"enable_thinking": False}).record()
    (d / "config.json").write_text(json.dumps({"eagle3lab": {"rendering": rec}}))
    assert drafter_rendering(d) == rec  # a converted drafter: config.json's eagle3lab block
    (d / "eagle3lab.json").write_text(json.dumps({"rendering": rec}))
    s = settings_from_record(drafter_rendering(d / "model.safetensors"))
    assert s.chat_template == str(thinking_template) and s.system_prompt is None
    assert s.template_kwargs == {"enable_thinking": False}
    assert Renderer.from_settings(tiny_target.tokenizer, rec).record() == rec
    thinking_template.write_text(THINKING + " ")  # the file changed since training
    with pytest.raises(UserError, match="not here or has changed") as e:
        settings_from_record(rec)
    _one_line(e)
