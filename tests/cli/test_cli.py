"""The `eagle3lab` command: help for every subcommand, one-paragraph errors, exit codes."""

import subprocess
import sys

import pytest

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
    assert r.returncode == 1 and "Shard directory '/nonexistent' does not exist" in r.stderr
