"""Options generated from a config (`cli.common.add_config_options`): a field added to a
config is an option of its command, in its group; the data stages' commands with no
options give the library's defaults (shared options included); their values reach the
config unchanged."""

from __future__ import annotations

import argparse

import pytest
from pydantic import Field

from eagle3lab.cli import build_parser
from eagle3lab.cli.common import add_config_options, config_from_args
from eagle3lab.data.extract import ExtractConfig
from eagle3lab.data.regenerate import RegenerateConfig
from eagle3lab.data.selfprompt import SelfPromptConfig
from eagle3lab.data.stage import STAGE_GROUPS

#: command, its config, the options it needs
COMMANDS = [
    ("extract", ExtractConfig, ["--conversations", "c.jsonl", "--out", "s"]),
    ("regenerate", RegenerateConfig, ["--out", "r.jsonl"]),
    ("self-prompt", SelfPromptConfig, ["--out", "p.jsonl"]),
]


def _sub(cmd: str) -> argparse.ArgumentParser:
    parser = build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices[cmd]


def _sections(help_text: str) -> dict[str, str]:
    """Help text per section ("options", then each group's title)."""
    out, title = {}, None
    for line in help_text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            title = line[:-1]
            out[title] = ""
        elif title:
            out[title] += line + "\n"
    return out


def test_a_field_added_to_a_config_is_an_option_in_its_group():
    class Wider(ExtractConfig):
        new_knob: int = Field(7, ge=1, description="a knob added for this test (100% new)",
                              json_schema_extra={"group": "batching"})

    p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_options(p, Wider, groups=STAGE_GROUPS)
    sections = _sections(p.format_help())
    assert "--new-knob" in sections["batching"] and "100% new" in sections["batching"]
    assert "(default: 7)" in " ".join(sections["batching"].split())
    assert "--new-knob" not in sections["options"]
    args = p.parse_args(["--conversations", "c", "--out", "o", "--new-knob", "3"])
    cfg = config_from_args(Wider, args, "extract")
    assert cfg.new_knob == 3 and cfg.conversations == "c"
    assert config_from_args(Wider, p.parse_args(["--conversations", "c", "--out", "o"]),
                            "extract").new_knob == 7
    with pytest.raises(SystemExit):  # a required field is a required option
        p.parse_args(["--out", "o"])


def test_a_group_not_offered_is_refused():
    class Stray(ExtractConfig):
        knob: int = Field(1, description="x", json_schema_extra={"group": "nowhere"})

    with pytest.raises(ValueError, match="'nowhere'"):
        add_config_options(argparse.ArgumentParser(), Stray, groups=STAGE_GROUPS)


@pytest.mark.parametrize("cmd, cls, needed", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_field_is_an_option_and_no_options_give_the_library_defaults(cmd, cls, needed):
    sub = _sub(cmd)
    dests = {a.dest for a in sub._actions}
    assert set(cls.model_fields) <= dests, set(cls.model_fields) - dests
    args = build_parser().parse_args([cmd, *needed])
    from_cli = config_from_args(cls, args, cmd)
    from_library = cls.from_dict({k: v for k, v in vars(from_cli).items()
                                  if cls.model_fields[k].is_required()})
    assert from_cli == from_library  # every default, shared options' included
    for action in sub._actions:  # each generated option's help is its field's description
        if action.dest in cls.model_fields and cls.model_fields[action.dest].json_schema_extra:
            want = cls.model_fields[action.dest].description.replace("%", "%%")
            assert action.help == want, action.dest


def test_option_values_reach_the_config():
    parse = build_parser().parse_args
    a = config_from_args(ExtractConfig, parse(
        ["extract", "--conversations", "c", "--out", "s", "--aux-ids", "1,14,26",
         "--aux-convention", "vllm", "--force", "--device-map", "auto"]), "extract")
    b = config_from_args(ExtractConfig, parse(
        ["extract", "--conversations", "c", "--out", "s", "--aux-ids", "1", "14", "26"]),
        "extract")
    assert a.aux_ids == b.aux_ids == [1, 14, 26]
    assert (a.aux_convention, a.force, a.device_map) == ("vllm", True, "auto")
    s = config_from_args(SelfPromptConfig, parse(
        ["self-prompt", "--out", "p", "--num-prompts", "5", "--exclude", "none",
         "--server", "http://h:1", "--api", "openai", "--dist-timeout", "60"]), "self-prompt")
    assert (s.n, s.exclude, s.server, s.api, s.dist_timeout) == (5, None, "http://h:1",
                                                                 "openai", 60.0)
    assert config_from_args(SelfPromptConfig, parse(["self-prompt", "--out", "p", "--n", "9"]),
                            "self-prompt").n == 9
    r = config_from_args(RegenerateConfig, parse(
        ["regenerate", "--out", "r", "--samples", "2", "--temperature", "0.7",
         "--system-prompt", "be brief"]), "regenerate")
    assert (r.samples, r.temperature, r.system_prompt) == (2, 0.7, "be brief")


def test_a_bad_option_value_is_one_line_naming_the_field(tmp_path, capsys):
    from eagle3lab.cli import main

    rc = main(["regenerate", "--out", str(tmp_path / "r.jsonl"), "--samples", "2",
               "--target", str(tmp_path / "no-target")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert "samples > 1 needs temperature > 0" in err
    rc = main(["self-prompt", "--out", str(tmp_path / "p.jsonl"), "--concurrency", "0",
               "--target", str(tmp_path / "no-target")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert "eagle3lab self-prompt options: field 'concurrency' has value 0" in err
