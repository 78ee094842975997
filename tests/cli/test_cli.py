"""The `eagle3lab` command: help for every subcommand, one-paragraph errors, exit codes."""

import subprocess
import sys

import pytest
from pydantic_core import PydanticUndefined

from eagle3lab.cli import build_parser, main


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


def test_help_lists_the_pipeline(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("prepare-target", "regenerate", "extract", "vocab", "demo"):
        assert cmd in out


@pytest.mark.parametrize("cmd", _subcommands())
def test_every_subcommand_explains_itself(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert len(capsys.readouterr().out) > 300


def _option(cmd: str, flag: str):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[cmd]
    return next(a for a in sub._actions if flag in a.option_strings)


@pytest.mark.parametrize("flag, cmds", [
    ("--target", ["accept", "extract", "regenerate", "self-prompt", "serve"]),
    ("--device", ["accept", "extract", "regenerate", "self-prompt", "serve"]),
    ("--dtype", ["accept", "regenerate", "self-prompt"]),
    ("--no-progress", ["extract", "regenerate", "self-prompt", "report", "demo"]),
    ("--json", ["accept", "inspect", "logs", "preflight"]),
    ("--system-prompt", ["regenerate", "self-prompt"]),
])
def test_shared_options_are_one_definition(flag, cmds):
    """Each shared option comes from one parent parser: the same action kind and default
    everywhere, and the same help up to a command's own note."""
    from eagle3lab.cli.common import TARGET_HELP

    actions = [_option(c, flag) for c in cmds]
    assert len({(type(a), a.default, a.type, a.dest) for a in actions}) == 1
    assert all(a.help for a in actions)
    if flag == "--target":
        assert all(a.help.startswith(TARGET_HELP) for a in actions)
        assert _option("extract", flag).help.endswith("(must be the model that wrote the "
                                                      "conversations)")
    if flag == "--device":  # one help, up to a command's own note in parentheses
        assert len({a.help.split(" (")[0] for a in actions}) == 1
    if flag == "--system-prompt":
        assert len({a.help for a in actions}) == 1


def test_train_help_explains_every_trainconfig_field(capsys):
    """`eagle3lab train --help` is generated from TrainConfig: every field is an option
    with its description and its default; types and choices come from the annotations."""
    from eagle3lab.train import TrainConfig

    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    text = "".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for name, field in TrainConfig.model_fields.items():
        assert field.description, f"TrainConfig.{name} has no description"
        assert "--" + name.replace("_", "-") in text
        assert "".join(field.description.split()) in text, name
        if field.default not in (None, PydanticUndefined):
            assert f"(default:{field.default})" in text, name
    assert _option("train", "--schedule").choices == ["constant", "cosine", "linear"]
    args = build_parser().parse_args(["train", "--data", "d", "--eval-at-tokens", "10", "20",
                                      "--no-progress", "--lr", "0.1", "--max-steps", "3"])
    assert (args.eval_at_tokens, args.progress, args.lr, args.max_steps) == ([10, 20], False,
                                                                             0.1, 3)
    assert not hasattr(args, "epochs")  # unset options fall back to --config, then defaults


def test_train_help_groups_its_options_and_words_the_profiles(capsys):
    """`train --help` lists each TrainConfig field under the group it names (data, model,
    optimiser, schedule, checkpoints, distributed) and says ENGINE_PROFILES in words, not
    as a JSON dict."""
    from eagle3lab.train import ENGINE_PROFILES, TrainConfig
    from eagle3lab.train.config import OPTION_GROUPS

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    head, body = capsys.readouterr().out.split("\noptions:\n")
    sections, title = {"options": ""}, "options"
    for line in body.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            title = line[:-1]
        else:
            sections[title] = sections.get(title, "") + line + "\n"
    assert list(sections) == ["options", *OPTION_GROUPS]
    for name, field in TrainConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert [t for t, text in sections.items() if f"  {flag} " in text or
                f"  {flag}," in text or f"  {flag}\n" in text] == \
            [field.json_schema_extra["group"]], name
    description = head.split("\n\n")[1]
    assert "{" not in description and "true" not in description.lower()
    flat = " ".join(description.split())
    for engine, flags in ENGINE_PROFILES.items():
        said = flat.split(f"{engine} sets ")[1].split(";")[0]
        on, _, off = said.partition("(")
        for flag, value in flags.items():
            assert flag in (on if value else off), (engine, flag)


def test_bad_input_is_one_paragraph_and_exit_1(tmp_path, capsys):
    rc = main(["extract", "--conversations", str(tmp_path / "missing.jsonl"),
               "--out", str(tmp_path / "s"), "--target", str(tmp_path / "nope")])
    assert rc == 1
    err = capsys.readouterr().err
    assert err.startswith("eagle3lab extract: error: ") and "Traceback" not in err
    assert "does not exist" in err


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "eagle3lab", "vocab", "--data", "/nonexistent"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Data directory '/nonexistent' does not exist" in r.stderr
