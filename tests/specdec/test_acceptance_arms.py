"""The arms of an offline acceptance comparison: distinct drafters, the default drafter
when none is given (an untrained one, with a note, when there is none), and failure arms
built from the first drafter."""

from pathlib import Path

import pytest

from eagle3lab.errors import UserError
from eagle3lab.formats.demo import make_speculators_draft
from eagle3lab.formats.reader import Checkpoint
from eagle3lab.workdir import default_drafter
from eagle3lab.specdec.arms import DROPPED_KEYS_ARM, LAST_LAYER_ARM, acceptance_arms


def test_given_drafters_are_measured_once_each_and_named_by_path(tmp_path):
    a, b = str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b")
    plan = acceptance_arms(drafts=[a, Path(a), b], target="unused", workdir=tmp_path / "w",
                           compare_failures=False)
    assert plan.drafts == [a, b] and plan.healthy == 2 and plan.notes == []
    assert [(x.name, x.draft, x.features, x.load_as) for x in plan.arms] == [
        ("runs/a", a, "fused", None), ("runs/b", b, "fused", None)]
    assert not (tmp_path / "w").exists()  # nothing built


def test_no_drafter_given_means_the_default_one(tmp_path):
    plan = acceptance_arms(drafts=[], target="smollm2-135m-instruct", workdir=tmp_path,
                           compare_failures=False)
    assert plan.drafts == [default_drafter("smollm2-135m-instruct")]
    assert [a.name for a in plan.arms] == ["healthy"] and plan.notes == []


def test_untrained_fallback_and_failure_arms_from_the_same_drafter(tmp_path, tiny_target_dir):
    plan = acceptance_arms(drafts=[], target=str(tiny_target_dir), workdir=tmp_path)
    assert plan.drafts == [str(tmp_path / "untrained")] and plan.healthy == 1
    assert "UNTRAINED" in plan.notes[0] and "tau ~1.0" in plan.notes[0]
    healthy, last, dropped = plan.arms
    assert (healthy.name, healthy.features) == ("healthy", "fused")
    assert (last.name, last.draft, last.features) == (LAST_LAYER_ARM, healthy.draft,
                                                       "last_layer")
    assert (dropped.name, dropped.draft, dropped.load_as) == (
        DROPPED_KEYS_ARM, str(tmp_path / "keys-mismatch"), "sglang")
    ck = Checkpoint(dropped.draft)  # an SGLang config over speculators' decoder keys
    try:
        assert any(k.startswith("layers.0.") for k in ck.tensors)
        assert not any(k.startswith("midlayer.") for k in ck.tensors)
        assert ck.config["architectures"] == ["LlamaForCausalLMEagle3"]
    finally:
        ck.close()


def test_a_normed_first_drafter_gets_no_sglang_config_arm_and_a_note(tmp_path,
                                                                     tiny_target_dir):
    """SGLang's format cannot hold norm_before_fc: the conversion refuses, so the SGLang
    failure arm does not apply to this drafter (SGLang cannot serve it at all); the
    last_layer arm still comes from it, and the note gives the converter's finding code."""
    normed = make_speculators_draft(tmp_path / "normed", target=tiny_target_dir,
                                    norm_before_fc=True)
    plan = acceptance_arms(drafts=[normed], target=str(tiny_target_dir),
                           workdir=tmp_path / "w")
    assert [(a.name, a.draft, a.features) for a in plan.arms] == [
        ("healthy", str(normed), "fused"), (LAST_LAYER_ARM, str(normed), "last_layer")]
    assert plan.healthy == 1 and len(plan.notes) == 1
    note = plan.notes[0]
    assert note.startswith(f"No '{DROPPED_KEYS_ARM}' arm: {normed} cannot be written in "
                           "SGLang's format, so SGLang cannot serve it at all ([norm-before-fc]")
    assert "Options:" not in note and not (tmp_path / "w" / "keys-mismatch").exists()


@pytest.mark.real
def test_the_demos_arms_with_the_shipped_default_drafter_first(tmp_path, default_target_dir):
    """`make demo`'s notebook 05 measures [the default drafter, the demo's trained one]
    with the failure arms on: the shipped default drafter (speculators' recipe, normed)
    comes first, and the plan is made instead of the notebook failing on the refusal."""
    shipped = default_drafter("smollm2-135m-instruct")
    ours = make_speculators_draft(tmp_path / "ours", target=default_target_dir,
                                  draft_vocab=256)
    plan = acceptance_arms(drafts=[shipped, ours], target="smollm2-135m-instruct",
                           workdir=tmp_path / "w")
    assert [a.draft for a in plan.arms] == [shipped, str(ours), shipped]
    assert plan.arms[-1].name == LAST_LAYER_ARM and plan.healthy == 2
    assert "[norm-before-fc]" in plan.notes[0]


def test_a_broken_first_drafter_is_still_refused(tmp_path, tiny_target_dir):
    """Only the norm-variant refusals mean "SGLang cannot serve it": a NaN in the first
    drafter stops the plan with the converter's own finding, as before."""
    from safetensors.torch import load_file, save_file

    draft = make_speculators_draft(tmp_path / "nan", target=tiny_target_dir)
    weights = load_file(str(draft / "model.safetensors"))
    weights["fc.weight"].view(-1)[0] = float("nan")
    save_file(weights, str(draft / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"\[nonfinite\]"):
        acceptance_arms(drafts=[draft], target=str(tiny_target_dir), workdir=tmp_path / "w")
