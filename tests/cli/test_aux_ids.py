"""Explicit aux layer ids are one type with one syntax: `extract --aux-ids`, `vocab
--aux-ids`, `preflight --trained-aux-layers`, ExtractConfig's and PipelineConfig's
`aux_ids` and `build_shard_vocab(aux_ids=...)` accept the same values and refuse the same
ones with the same sentence (one line, naming the option or field); the report pipeline
hands its ids to extract."""

from __future__ import annotations

import json

import pytest

from eagle3lab.cli import main
from eagle3lab.data.extract import ExtractConfig
from eagle3lab.data.vocab import build_shard_vocab
from eagle3lab.errors import UserError
from eagle3lab.report.pipeline import PipelineConfig
from eagle3lab.targets.auxlayers import parse_aux_ids

GOOD = [("1,14,26", [1, 14, 26]), ("1, 14,26", [1, 14, 26]), ("0", [0]),
        ([3, 1, 2], [3, 1, 2])]
BAD = ["1,x", "2,2", "-1,4", "1.5", "", [1, 1], [True, 2], [-3]]


def _reason(value) -> str:
    with pytest.raises(ValueError) as e:
        parse_aux_ids(value)
    return str(e.value)


@pytest.mark.parametrize("value, ids", GOOD)
def test_the_library_entry_points_accept_alike(value, ids, tmp_path):
    assert parse_aux_ids(value) == ids
    assert ExtractConfig(conversations="c", out="o", aux_ids=value).aux_ids == ids
    assert PipelineConfig.from_dict({"aux_ids": value}).aux_ids == ids
    assert PipelineConfig.from_dict({}).aux_ids is None  # the target's default


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_the_library_entry_points_refuse_alike(value, tmp_path):
    reason = _reason(value)
    for build, where in ((lambda: ExtractConfig(conversations="c", out="o", aux_ids=value),
                          "extract: field 'aux_ids'"),
                         (lambda: PipelineConfig.from_dict({"aux_ids": value}),
                          "pipeline: field 'aux_ids'"),
                         (lambda: build_shard_vocab(data=tmp_path / "none", aux_ids=value),
                          "aux_ids (--aux-ids)")):
        with pytest.raises(UserError) as e:
            build()
        msg = str(e.value)
        assert msg.startswith(where) and reason in msg and "\n" not in msg, msg


@pytest.mark.parametrize("value", ["1,x", "2,2", "-1,4"])
def test_the_commands_refuse_alike_in_one_line(value, tmp_path, capsys):
    reason = _reason(value)
    # OPTION=VALUE: argparse would read a value starting with '-' as an option
    convs = tmp_path / "c.jsonl"
    convs.write_text(json.dumps({"id": "x", "input_ids": [1, 2], "loss_mask": [0, 1]}) + "\n")
    runs = [
        (["extract", "--conversations", convs, "--out", tmp_path / "s", "--target",
          tmp_path / "no-target", f"--aux-ids={value}"], 1, "eagle3lab extract: error: "),
        (["vocab", "--data", tmp_path, f"--aux-ids={value}"], 1, "eagle3lab vocab: error: "),
        (["preflight", f"--trained-aux-layers={value}", "--", "vllm", "serve", "T"], 2,
         "eagle3lab preflight: error: --trained-aux-layers: "),
    ]
    for argv, code, head in runs:
        assert main([str(a) for a in argv]) == code
        err = capsys.readouterr().err
        assert err.startswith(head) and reason in err and err.count("\n") == 1, err
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_space_separated_ids_read_as_the_comma_form():
    from eagle3lab.cli import build_parser

    parse = build_parser().parse_args
    a = parse(["vocab", "--data", "d", "--aux-ids", "1", "14", "26"])
    b = parse(["vocab", "--data", "d", "--aux-ids", "1,14,26"])
    assert parse_aux_ids(a.aux_ids) == parse_aux_ids(b.aux_ids) == [1, 14, 26]


def test_the_pipeline_hands_its_aux_ids_to_extract(tiny_target_dir, tmp_path):
    from eagle3lab.report.pipeline import stage_data
    from eagle3lab.workdir import WorkDir

    cfg = PipelineConfig.from_dict({
        "work_dir": str(tmp_path / "work"), "target": str(tiny_target_dir), "device": "cpu",
        "train_prompts": 2, "eval_prompts": 1, "max_new_tokens": 3, "draft_vocab_size": 16,
        "aux_ids": "1,3,5"})
    wd = WorkDir(cfg.work_path())
    stage_data(cfg, wd, False)
    for split in ("train", "eval"):
        aux = json.loads((wd.shards(split) / "manifest.json").read_text())["aux_layers"]
        assert aux["requested_ids"] == [1, 3, 5] and aux["convention"] == "sglang"
    other = cfg.model_copy(update={"aux_ids": [1, 2, 3]})
    with pytest.raises(UserError, match="aux_layers.capture_points: existing"):
        stage_data(other, wd, False)  # a work dir keeps its aux layers
