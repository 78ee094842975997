"""The recipe arm: a run may train with speculators' own EAGLE-3 defaults (the "EAGLE-3.1"
flags norm_before_fc and norm_output, and norm_before_residual), the run records the flags
it used, `train` names the engines that would not serve such a drafter, and the doctor's
per-engine verdict on the packed drafters (speculators' real save_pretrained, our packer)
agrees with what the converter does: vLLM 0.25.1 serves every one; SGLang serves ours.

SPECULATORS_EAGLE3_DEFAULTS is checked against speculators' own trainer config, so a
speculators release that changes its defaults fails here instead of silently changing the
study's recipe arm."""

from __future__ import annotations

import json

import pytest

from eagle3lab.train.config import (ENGINE_PROFILES, FLAG_FIELDS, SPECULATORS_EAGLE3_DEFAULTS,
                                    TrainConfig)

#: The three drafters: ours (the sglang profile), speculators' eagle3 flags, and the two
#: EAGLE-3.1 flags alone on our recipe (what SGLang 0.5.23 applies, the portable one not).
ARMS = {
    "ours": {},
    "speculators": {k: SPECULATORS_EAGLE3_DEFAULTS[k] for k in FLAG_FIELDS},
    "eagle31": {"norm_before_fc": True, "norm_output": True},
}


def test_speculators_defaults_are_speculators_own():
    """Each preset value equals what speculators 0.9.0's trainer resolves for an eagle3 run
    given no flags (its TrainConfig, derived defaults included)."""
    from speculators.train.config.schema import TrainConfig as SpecTrainConfig

    spec = SpecTrainConfig()
    assert spec.speculator_type == "eagle3"
    theirs = {
        "norm_before_residual": spec.draft.norm_before_residual,
        "norm_before_fc": spec.draft.norm_before_fc, "norm_output": spec.draft.norm_output,
        "num_layers": spec.draft.num_layers, "ttt_steps": spec.loss.ttt_steps,
        "ttt_step_loss_decay": spec.loss.ttt_step_loss_decay, "loss_fn": spec.loss.loss_fn,
        "lr": spec.optimizer.lr, "weight_decay": spec.optimizer.weight_decay,
        "schedule": spec.scheduler.scheduler_type,
        "max_tokens_per_batch": spec.data.total_seq_len,
        "train_lm_head": False, "grad_clip": 1.0,  # model.py freezes it; trainer.py clips 1.0
    }
    assert SPECULATORS_EAGLE3_DEFAULTS == theirs
    assert spec.draft.fc_norm is False  # never set by either recipe
    TrainConfig.from_dict({"data": "d", "out": "o", **SPECULATORS_EAGLE3_DEFAULTS})


def test_flags_default_to_the_engine_profile_and_the_run_may_set_them():
    for engine, profile in ENGINE_PROFILES.items():
        assert TrainConfig(data="d", out="o", serve_engine=engine).drafter_flags() == profile
    cfg = TrainConfig(data="d", out="o", norm_output=True, norm_before_fc=False,
                      serve_engine="vllm")
    assert cfg.drafter_flags() == {**ENGINE_PROFILES["vllm"], "norm_output": True,
                                   "norm_before_fc": False}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sharp_data):
    """Each arm trained for a few steps and packed as data/drafters/ is (pack_drafter);
    what `train` printed is kept."""
    import contextlib
    import io

    from eagle3lab.train import pack_drafter, train

    root = tmp_path_factory.mktemp("recipe")
    out = {}
    for arm, flags in ARMS.items():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            train(data=sharp_data["train"], eval_data=sharp_data["eval"],
                  out=str(root / arm), max_steps=2, eval_at_start=False, eval_every=0,
                  max_tokens_per_batch=256, progress=False, verify=False, **flags)
        pack_drafter(root / arm / "final", root / f"{arm}-packed")
        out[arm] = {"run": root / arm, "packed": root / f"{arm}-packed",
                    "printed": printed.getvalue()}
    return out


@pytest.mark.parametrize("arm", list(ARMS))
def test_the_run_records_the_flags_it_trained_with(runs, arm):
    from eagle3lab.formats.detect import read_sidecar

    want = {**ENGINE_PROFILES["sglang"], **ARMS[arm]}
    run = json.loads((runs[arm]["run"] / "run.json").read_text())
    assert run["drafter"]["engine_profile"] == want
    assert {k: run["config"][k] for k in FLAG_FIELDS} == {k: ARMS[arm].get(k)
                                                          for k in FLAG_FIELDS}
    packed = runs[arm]["packed"]
    config = json.loads((packed / "config.json").read_text())
    assert {k: config[k] for k in ("norm_before_residual", "norm_before_fc", "norm_output")} \
        == {k: want[k] for k in ("norm_before_residual", "norm_before_fc", "norm_output")}
    assert read_sidecar(packed)["engine_profile"] == want  # what the doctor compares with


def test_speculators_eagle3_drafter_is_a_speculators_module_with_those_norms(runs):
    """The flags reach speculators' model: input_norm trained and saved, norm_output and
    norm_before_residual in the config speculators reloads."""
    from safetensors.torch import load_file

    from eagle3lab.train import load_drafter

    w = load_file(str(runs["speculators"]["packed"] / "model.safetensors"))
    assert "input_norm.weight" in w and "input_norm.weight" not in load_file(
        str(runs["ours"]["packed"] / "model.safetensors"))
    model = load_drafter(runs["speculators"]["packed"])
    assert model.input_norm is not None
    assert model.config.norm_output and model.config.norm_before_residual
    assert model.layers[0].norm_before_residual


def test_train_warns_once_naming_the_engines_that_would_not_serve_it(runs):
    assert "warning" not in runs["ours"]["printed"]  # the sglang profile: no override
    for arm, refused in (("speculators", {"sglang", "sglang-0.5.23"}),
                         ("eagle31", {"sglang"})):
        lines = [x for x in runs[arm]["printed"].splitlines() if "warning" in x]
        assert len(lines) == 1, runs[arm]["printed"]
        named = lines[0].split("not served by ")[1].split("; served by ")
        assert {e.split(" (")[0] for e in named[0].split("), ")} == refused, lines[0]
        assert "vllm" in named[1]


#: engine -> the finding code that stops it, per arm (None: it serves the drafter).
VERDICTS = {
    "ours": {"vllm": None, "sglang": None, "sglang-0.5.23": None},
    "speculators": {"vllm": None, "sglang": "norm-before-fc", "sglang-0.5.23": "norm-variant"},
    "eagle31": {"vllm": None, "sglang": "norm-before-fc", "sglang-0.5.23": None},
}


@pytest.mark.parametrize("arm", list(ARMS))
def test_doctor_says_which_engines_serve_each_drafter(runs, arm, sharp_target_dir):
    from eagle3lab.formats.doctor import serving_engines

    verdicts = serving_engines(runs[arm]["packed"], target=sharp_target_dir)
    got = {e: (v.codes[0] if v.codes else None) for e, v in verdicts.items()}
    assert got == VERDICTS[arm], {e: v.reason() for e, v in verdicts.items()}
    assert verdicts["vllm"].via == "as is"
    assert all("--to sglang" in verdicts[e].via for e in ("sglang", "sglang-0.5.23"))
    if arm == "speculators":  # the residual is the one variant no SGLang implements
        assert verdicts["sglang-0.5.23"].findings[0].found == "norm_before_residual"
        assert {f.found for f in verdicts["sglang"].findings} == {
            "norm_before_fc", "norm_before_residual", "norm_output"}


@pytest.mark.parametrize("arm", list(ARMS))
@pytest.mark.parametrize("engine", ["sglang", "sglang-0.5.23"])
def test_convert_agrees_with_the_verdict(runs, arm, engine, sharp_target_dir, tmp_path):
    """`eagle3lab convert --to sglang --engine E` refuses exactly the drafters the verdict
    says E does not serve, with the same code; the ones it writes, E serves as they are."""
    from eagle3lab.formats.convert import ConversionError, convert_checkpoint
    from eagle3lab.formats.doctor import serving_engines

    code = VERDICTS[arm][engine]
    dst = tmp_path / "converted"
    if code is not None:
        with pytest.raises(ConversionError) as e:
            convert_checkpoint(runs[arm]["packed"], dst, to="sglang", engine=engine,
                               target=sharp_target_dir)
        assert e.value.code == code
        return
    convert_checkpoint(runs[arm]["packed"], dst, to="sglang", engine=engine,
                       target=sharp_target_dir)
    v = serving_engines(dst, target=sharp_target_dir, engines=[engine])[engine]
    assert v.serves and v.via == "as is", v.reason()
