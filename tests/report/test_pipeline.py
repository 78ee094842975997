"""The pipeline's data stage (eagle3lab.report.pipeline): regeneration on the static engine
by default, and a work dir whose responses another engine made resumed with that engine
instead of refused as made with other parameters."""

from __future__ import annotations

import json

import pytest

from eagle3lab.data.regenerate import made_with_engine, meta_path
from eagle3lab.report.pipeline import PipelineConfig, choose_engine, run_demo
from eagle3lab.workdir import WorkDir


def _demo(wd, target, **kw):
    return run_demo(run_dir=wd, target=str(target), train_prompts=3,
                    eval_prompts=2, max_new_tokens=6, batch_size=2, draft_vocab_size=64,
                    device="cpu", progress=False, **kw)


def _engine(path):
    return json.loads(meta_path(path).read_text())["params"]["engine"]


def test_the_static_engine_is_the_default_and_an_hf_work_dir_resumes_with_hf(
        tmp_path, tiny_target_dir):
    assert PipelineConfig().regen_engine == "auto"
    hf, static = WorkDir(tmp_path / "hf"), WorkDir(tmp_path / "static")
    assert made_with_engine(hf.responses("train")) is None  # nothing there yet

    first = _demo(hf.root, tiny_target_dir, regen_engine="hf")
    assert first["regenerate_train"]["engine"] == "hf"
    assert made_with_engine(hf.responses("train")) == "hf"
    # a later run asks for "auto" (the default: static for this target): the files are resumed with
    # the engine that made them (nothing to add), not refused as made with other parameters
    again = _demo(hf.root, tiny_target_dir)
    assert again["regenerate_train"]["engine"] == "hf"
    assert again["regenerate_train"]["new_records"] == 0
    assert _engine(hf.responses("train")) == "hf"

    fresh = _demo(static.root, tiny_target_dir)
    assert fresh["regenerate_train"]["engine"] == "static"
    assert _engine(static.responses("train")) == "static"
    # fp32 greedy: the engines' records are the same tokens
    ids = [[json.loads(line)["input_ids"] for line in w.responses("train").read_text()
            .splitlines()] for w in (hf, static)]
    assert ids[0] == ids[1] and len(ids[0]) == 3


def test_an_unknown_engine_is_refused():
    from eagle3lab.errors import UserError

    with pytest.raises(UserError, match="regen_engine"):
        PipelineConfig.from_dict({"regen_engine": "vllm"})


def test_auto_takes_the_static_engine_where_it_runs_the_target(tiny_target_dir):
    from eagle3lab.targets.adapter import load_target

    tgt = load_target(str(tiny_target_dir), device="cpu")
    assert choose_engine(tgt, "auto", max_new_tokens=8) == "static"
    assert choose_engine(tgt, "hf", max_new_tokens=8) == "hf"
    # a sliding window that covers prompt + answer (1,024 + 8) but not the engine's cache,
    # which rounds that up to the next 128: the engine would refuse it, so auto does too
    tgt.model.config.sliding_window = 1_100
    assert choose_engine(tgt, "auto", max_new_tokens=8) == "hf"
    tgt.model.config.sliding_window = 1_152
    assert choose_engine(tgt, "auto", max_new_tokens=8) == "static"
    tgt.model.config.sliding_window = None
    # a model type the static engine does not mirror: transformers' generate
    tgt.model.config.model_type = "gpt2"
    assert choose_engine(tgt, "auto", max_new_tokens=8) == "hf"
