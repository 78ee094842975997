"""eagle3lab.preflight.rendering: the drafter's recorded chat template against what a launch
(SGLang, vLLM) or the target alone (`inspect --target`) renders (`chat-template`), one
planted fault per variant: another template file served, enable_thinking differing, a
reasoning parser on a drafter trained with thinking off, no record (cannot be checked,
never a match), a matching record (no warning), and a template file that does not exist or
does not render.

The target is the tiny config-only one of the preflight fixtures with the default target's
tokenizer beside it (SmolLM2's, read from the GGUF alone: tests/conftest.py
`tokenizer_dir`); drafters are copies of the fixture drafters whose `eagle3lab.json` holds
a `rendering_record` made from that tokenizer, as the data stages write it."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from pfutil import copy_draft, sglang_cmd, vllm_cmd
from planted import planted_problems, plants

from eagle3lab.data.rendering import rendering_record, template_sha256
from eagle3lab.formats.reader import drafter_rendering
from eagle3lab.preflight.rendering import (load_tokenizer, rendering_findings,
                                           served_rendering)
from eagle3lab.preflight.run import preflight

#: a thinking-aware variant of a template: an empty think block when thinking is off
THINK_OFF = ("{% if add_generation_prompt and enable_thinking is defined and not "
             "enable_thinking %}<think>\n\n</think>\n\n{% endif %}")


@pytest.fixture(scope="module")
def rt(pf, tokenizer_dir, tmp_path_factory):
    """target: pf's tiny target config + the default target's tokenizer files; tok: that
    tokenizer; base: its chat template; files: template files (stripped-down, thinking)."""
    root = tmp_path_factory.mktemp("rendering")
    target = root / "target"
    target.mkdir()
    shutil.copy(pf["target"] / "config.json", target)
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, target)
    tok = load_tokenizer(target)
    base = tok.chat_template
    files = {}
    # a stripped-down template: no default system prompt
    files["plain"] = root / "plain.jinja"
    files["plain"].write_text(
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt "
        "%}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    files["think"] = root / "think.jinja"
    files["think"].write_text(base + THINK_OFF)
    return {"root": root, "target": target, "tok": tok, "base": base, "files": files}


def drafter(pf, kind, dst, record):
    """A copy of the fixture drafter `kind` whose eagle3lab.json holds `record` (None: no
    eagle3lab.json at all)."""
    d = copy_draft(pf, kind, dst)
    if record is not None:
        (d / "eagle3lab.json").write_text(json.dumps({"format": "eagle3lab-run",
                                                      "rendering": record}, indent=2))
    return d


def run(argv):
    return preflight(argv, engine_parser=False)


def by_code(report, code):
    return [f for f in report.findings if f.code == code]


@plants("chat-template")
def test_served_with_another_template_file_is_a_warning_naming_both_sides(pf, rt, tmp_path):
    """Trained on the tokenizer's template; SGLang launched with --chat-template of a
    stripped-down file: both sha256s, the fix both ways, and the system prompt setting."""
    d = drafter(pf, "sglang", tmp_path / "d", rendering_record(rt["tok"]))
    r = run(sglang_cmd(rt["target"], d, "--chat-template", str(rt["files"]["plain"])))
    [f] = by_code(r, "chat-template")
    assert f.severity == "warning" and r.ok
    # SGLang's text of a .jinja file: edge newlines stripped, "\\n" made a newline
    plain = template_sha256(rt["files"]["plain"].read_text().strip("\n").replace("\\n", "\n"))
    assert template_sha256(rt["base"])[:12] in f.message and plain[:12] in f.message
    assert "eagle3lab regenerate --chat-template " + str(rt["files"]["plain"]) in f.message
    assert "template's default system prompt" in f.message
    assert "no --chat-template" in f.message  # serve with the one trained on: the tokenizer's


@plants("chat-template")
def test_enable_thinking_differing_is_a_warning_where_the_template_reads_it(pf, rt, tmp_path):
    """Trained with a thinking-aware template file and enable_thinking false; vLLM serves
    the same file with enable_thinking true by default: a warning. The same kwargs: none."""
    think = rt["files"]["think"]
    record = rendering_record(rt["tok"], chat_template=think.read_text(),
                              chat_template_path=str(think),
                              template_kwargs={"enable_thinking": False})
    d = drafter(pf, "spec", tmp_path / "d", record)
    on = run(vllm_cmd(rt["target"], d, "--chat-template", str(think),
                      "--default-chat-template-kwargs", '{"enable_thinking": true}'))
    [f] = by_code(on, "chat-template")
    assert f.severity == "warning"
    assert "enable_thinking: false trained vs true served" in f.message
    assert "--default-chat-template-kwargs '{\"enable_thinking\": false}'" in f.message
    # the rendering flags are read: not listed as arguments preflight does not read
    assert not [g for g in by_code(on, "launch-command") if g.severity == "warning"]
    off = run(vllm_cmd(rt["target"], d, "--chat-template", str(think),
                       "--default_chat_template_kwargs", '{"enable_thinking": false}'))
    [g] = by_code(off, "chat-template")
    assert g.severity == "info" and "matches" in g.message
    # unset on the launch = the template's default (thinking on): renders otherwise
    unset = run(vllm_cmd(rt["target"], d, "--chat-template", str(think)))
    [u] = by_code(unset, "chat-template")
    assert u.severity == "warning" and "unset (the template's default)" in u.message


def test_a_kwarg_the_serving_template_ignores_is_no_warning(pf, rt, tmp_path):
    """SmolLM2's template never reads enable_thinking: the probe chats render the same."""
    record = rendering_record(rt["tok"], template_kwargs={"enable_thinking": False})
    d = drafter(pf, "spec", tmp_path / "d", record)
    [f] = by_code(run(vllm_cmd(rt["target"], d)), "chat-template")
    assert f.severity == "info" and "renders the probe chats the same" in f.message


@plants("chat-template")
def test_reasoning_parser_on_a_drafter_trained_with_thinking_off(pf, rt, tmp_path):
    record = rendering_record(rt["tok"], template_kwargs={"enable_thinking": False})
    d = drafter(pf, "sglang", tmp_path / "d", record)
    r = run(sglang_cmd(rt["target"], d, "--reasoning-parser", "qwen3"))
    [f] = by_code(r, "chat-template")
    assert f.severity == "warning" and "--reasoning-parser qwen3" in f.message
    assert "enable_thinking false" in f.message
    kept_off = run(sglang_cmd(rt["target"], d, "--reasoning-parser", "qwen3",
                              "--default-chat-template-kwargs", '{"enable_thinking": false}'))
    [k] = by_code(kept_off, "chat-template")
    assert k.severity == "info" and "keep thinking off as trained" in k.message


@plants("chat-template")
def test_no_record_cannot_be_checked_and_is_never_a_match(pf, rt, tmp_path):
    """An old drafter (no eagle3lab.json) and one whose record says unknown: an info that
    says so, never "matches"; its template is not rendered (no tokenizer loaded)."""
    for name, record in (("old", None), ("foreign", {"format": "eagle3lab-rendering",
                                                     "version": 1, "unknown": True,
                                                     "why": "a SpecForge set"})):
        d = drafter(pf, "spec", tmp_path / name, record)
        [f] = by_code(run(vllm_cmd(rt["target"], d)), "chat-template")
        assert f.severity == "info" and "cannot be checked" in f.message, f.message
        assert "not a match" in f.message and "matches" not in f.message
    assert "a SpecForge set" in f.message
    served = served_rendering(target_dir=rt["target"], load=False)
    assert served.tokenizer is None and served.template is None


@plants("chat-template")
def test_matching_record_is_no_warning(pf, rt, tmp_path):
    """The tokenizer's template, no kwargs: an info saying it matches, with the trained
    system-prompt setting (a launch cannot know what clients send)."""
    record = rendering_record(rt["tok"], system_prompt="You are terse.")
    d = drafter(pf, "sglang", tmp_path / "d", record)
    r = run(sglang_cmd(rt["target"], d))
    [f] = by_code(r, "chat-template")
    assert f.severity == "info" and "matches" in f.message and r.ok
    assert "'You are terse.'" in f.message and "clients must send exactly" in f.message
    assert drafter_rendering(d) == record


@plants("chat-template")
def test_template_file_missing_or_not_rendering_is_one_error_line(pf, rt, tmp_path):
    d = drafter(pf, "sglang", tmp_path / "d", rendering_record(rt["tok"]))
    missing = run(sglang_cmd(rt["target"], d, "--chat-template", str(tmp_path / "no.jinja")))
    [f] = by_code(missing, "chat-template")
    assert f.severity == "error" and not missing.ok and "does not exist" in f.message
    assert "\n" not in f.message
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }")  # unclosed
    [g] = by_code(run(sglang_cmd(rt["target"], d, "--chat-template", str(broken))), "chat-template")
    assert g.severity == "error" and "does not render a chat (TemplateSyntaxError" in g.message
    # a target without tokenizer files: the file is still compiled
    [n] = by_code(run(sglang_cmd(pf["target"], d, "--chat-template", str(broken))),
                  "chat-template")
    assert n.severity == "error" and "not a Jinja template that compiles (line 1" in n.message
    raises = tmp_path / "raises.jinja"
    raises.write_text("{{ raise_exception('only user turns') }}")
    [h] = by_code(run(vllm_cmd(rt["target"], d, "--chat-template", str(raises))), "chat-template")
    assert h.severity == "error" and "does not render a chat" in h.message
    assert "only user turns" in h.message
    bad_json = run(sglang_cmd(rt["target"], d, "--default-chat-template-kwargs",
                              "{enable_thinking: false}"))
    [j] = by_code(bad_json, "chat-template")
    assert j.severity == "error" and "is not valid JSON" in j.message
    # SGLang reads a file not ending in .jinja as a JSON conversation template
    txt = tmp_path / "template.txt"
    txt.write_text(rt["base"])
    [t] = by_code(run(sglang_cmd(rt["target"], d, "--chat-template", str(txt))), "chat-template")
    assert t.severity == "error" and ".jinja" in t.message


def test_sglang_strips_the_file_and_it_still_renders_the_same(pf, rt, tmp_path):
    """SGLang strips a .jinja file's edge newlines on load: trained on the file as written
    (29-A's record), served by SGLang: its sha differs, its renderings do not."""
    f = tmp_path / "nl.jinja"
    f.write_text(rt["base"] + "\n")
    record = rendering_record(rt["tok"], chat_template=f.read_text(), chat_template_path=str(f))
    d = drafter(pf, "sglang", tmp_path / "d", record)
    [g] = by_code(run(sglang_cmd(rt["target"], d, "--chat-template", str(f))), "chat-template")
    assert g.severity == "info" and "strips the template file's edge newlines" in g.message
    [v] = by_code(run(vllm_cmd(rt["target"], drafter(pf, "spec", tmp_path / "v", record),
                            "--chat-template", str(f))), "chat-template")
    assert v.severity == "info" and "matches" in v.message  # vLLM reads it verbatim


def test_named_template_cannot_be_checked_but_kwargs_still_are(pf, rt, tmp_path):
    record = rendering_record(rt["tok"])
    d = drafter(pf, "sglang", tmp_path / "d", record)
    [f] = by_code(run(sglang_cmd(rt["target"], d, "--chat-template", "chatml")), "chat-template")
    assert f.severity == "info" and "cannot be checked: named template chatml" in f.message
    [g] = by_code(run(sglang_cmd(rt["target"], d, "--chat-template", "chatml",
                              "--default-chat-template-kwargs", '{"x": 1}')), "chat-template")
    assert g.severity == "warning" and "x: unset (the template's default) trained vs 1" \
        in g.message


def test_eagle3lab_serve_engine_args_are_read(pf, rt, tmp_path):
    """`eagle3lab serve --engine sglang ... -- --chat-template F`: the engine's argv."""
    d = drafter(pf, "sglang", tmp_path / "d", rendering_record(rt["tok"]))
    r = run(["eagle3lab", "serve", "--engine", "sglang", "--target", str(rt["target"]),
             "--draft", str(d), "--", "--chat-template", str(rt["files"]["plain"])])
    assert [f.severity for f in by_code(r, "chat-template")] == ["warning"]


def test_inspect_target_compares_with_the_targets_own_template(pf, rt, tmp_path, capsys):
    """`inspect --target`: no launch, so the target's tokenizer template with no kwargs."""
    from eagle3lab.cli import main as cli

    think = rt["files"]["think"]
    record = rendering_record(rt["tok"], chat_template=think.read_text(),
                              chat_template_path=str(think))
    d = drafter(pf, "spec", tmp_path / "d", record)
    assert cli(["inspect", str(d), "--target", str(rt["target"]), "--json",
                "--no-values"]) == 0
    out = json.loads(capsys.readouterr().out)
    [f] = [f for f in out["findings"] if f["code"] == "chat-template"]
    assert f["severity"] == "warning" and f"--chat-template {think}" in f["message"]
    same = drafter(pf, "spec", tmp_path / "same", rendering_record(rt["tok"]))
    assert not [f for f in rendering_findings(same, target_dir=rt["target"])
                if f.severity != "info"]


def test_chat_template_has_planted_fault_tests():
    """The `chat-template` code's planted-fault tests live here (tests/planted.py);
    tests/preflight/test_preflight_checks.py checks the other launch codes."""
    assert planted_problems(sys.modules[__name__], ["chat-template"]) == []
