"""The shipped default drafter (the study's winner): intact, passes the doctor for its
engine, and its accept length is re-measured (not copied) on a few held-out prompts against
a regression floor, as is the SGLang-servable shipped drafter's; the seed failures collapse
acceptance towards 1.0 on the same prompts."""

from pathlib import Path

import pytest
from checksums import assert_checksums

from eagle3lab.specdec.accept import Arm, measure_acceptance
from eagle3lab.workdir import default_drafter

DRAFTER = Path(__file__).resolve().parents[2] / "data" / "drafters" / "smollm2-135m-instruct"
#: The SGLang-servable shipped drafter (the default one until the study's winner replaced it).
SGLANG_DRAFTER = DRAFTER.with_name(DRAFTER.name + "-sglang")

#: Measured on the 2-core CPU (fp32, these 3 prompts x 32 tokens, 3 steps), 2026-12-04:
#: the default drafter (the study's 64M-token winner) tau 2.29 (x 48 tokens: 2.03; the
#: 32M-token drafter before it 2.23 / 1.97); the
#: SGLang-servable one 1.92 (x 48: 1.80; its README: 1.87 over 12 prompts x 96 tokens; the
#: default drafter before it gave 1.66 x 48). Each floor leaves about the old margin
#: (0.4) for other hardware's rounding.
#: 32 tokens, not 48: the slowest test of the suite took a third less for the same checks.
TAU_FLOOR = 1.8
SGLANG_TAU_FLOOR = 1.5
#: "Collapse towards 1.0": the failure arms keep under 40% of their healthy drafter's excess
#: over 1.0 and stay below a ceiling: last_layer features on the default drafter (measured
#: x 32 tokens: 1.37 against 2.29; x 48: 1.37 against 2.03; its norm before fc keeps more
#: than the unnormed drafter's 1.08) below 1.5; dropped decoder keys on the SGLang-servable
#: one (1.17 against 1.92; x 48: 1.13 against 1.80) below 1.25.
COLLAPSE_SHARE = 0.4
COLLAPSED = {"last_layer": 1.5, "keys dropped": 1.25}
MAX_NEW_TOKENS = 32


def test_shipped_drafter_is_intact_and_small():
    for d in (DRAFTER, SGLANG_DRAFTER):
        assert_checksums(d)
        assert (d / "model.safetensors").stat().st_size < 25e6
        assert (d / "README.md").is_file()
    assert default_drafter() == str(DRAFTER)
    assert default_drafter(engine="sglang") == str(SGLANG_DRAFTER)


@pytest.mark.real
def test_shipped_drafter_passes_the_doctor(default_target_dir):
    from eagle3lab.formats.doctor import inspect_checkpoint

    report = inspect_checkpoint(DRAFTER, target=str(default_target_dir), engine="vllm")
    assert report.ok, report.to_json()
    assert report.format == "speculators"


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.full
def test_tau_floor_and_failure_collapse(default_target_dir, real_target, tmp_path):
    """The default drafter's floor and its last-layer failure; the seed failure (an SGLang
    config over speculators' keys) is an SGLang one, and SGLang serves only the
    SGLang-servable shipped drafter (the default one is normed: no SGLang release applies
    norm_before_residual, so it cannot be converted), so it is built from that one and
    collapses against that one's own healthy accept length."""
    from eagle3lab.specdec.failures import sglang_config_speculators_keys

    bad = sglang_config_speculators_keys(SGLANG_DRAFTER, tmp_path / "bad",
                                         target=default_target_dir)
    r = measure_acceptance(
        target=real_target,
        arms=[Arm("healthy", str(DRAFTER)), Arm("last_layer", str(DRAFTER), "last_layer"),
              Arm("healthy sglang", str(SGLANG_DRAFTER)),
              Arm("keys dropped", str(bad), "fused", "sglang")],
        prompts="eval", limit=3, max_new_tokens=MAX_NEW_TOKENS, steps=3, progress=False)
    tau = {a["name"]: a["stats"]["tau"] for a in r["arms"]}
    assert all(a["matches_plain"] == 3 for a in r["arms"]), "exact greedy output"
    assert tau["healthy"] >= TAU_FLOOR, tau
    assert tau["healthy sglang"] >= SGLANG_TAU_FLOOR, tau
    for arm, healthy in (("last_layer", "healthy"), ("keys dropped", "healthy sglang")):
        assert tau[arm] < COLLAPSED[arm], tau
        assert tau[arm] - 1 < COLLAPSE_SHARE * (tau[healthy] - 1), tau


@pytest.mark.real
def test_packed_drafter_gets_the_target_embedding(default_target_dir):
    """Shipped without embed_tokens, the drafter must be loaded with the target's embedding
    (speculators' from_pretrained alone leaves it at zero)."""
    import torch
    from safetensors import safe_open
    from speculators.utils.loading import load_model_layers

    from eagle3lab.train import load_drafter

    with safe_open(str(DRAFTER / "model.safetensors"), "pt") as h:
        assert "embed_tokens.weight" not in h.keys()
    model = load_drafter(DRAFTER, target=str(default_target_dir))
    want = load_model_layers(["embed_tokens.weight"], str(default_target_dir))
    assert torch.equal(model.embed_tokens.weight.float(),
                       want["embed_tokens.weight"].float())
