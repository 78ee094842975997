"""The shipped default drafter: intact, passes the doctor for its engine, and its accept
length is re-measured (not copied) on a few held-out prompts against a regression floor;
the seed failures collapse acceptance towards 1.0 on the same prompts."""

from pathlib import Path

import pytest
from checksums import assert_checksums

from eagle3lab.specdec.accept import Arm, measure_acceptance
from eagle3lab.workdir import default_drafter

DRAFTER = Path(__file__).resolve().parents[2] / "data" / "drafters" / "smollm2-135m-instruct"

#: Measured on the 2-core CPU for this drafter (fp32, these 3 prompts x 32 tokens, 3 steps):
#: tau 1.92 (x 48 tokens: 1.80; its README: 1.87 over 12 prompts x 96 tokens; the previous
#: default drafter gave 1.66 x 48). The floor leaves margin for other hardware's rounding.
#: 32 tokens, not 48: the slowest test of the suite took a third less for the same checks.
TAU_FLOOR = 1.5
#: "Collapse towards 1.0": the failure arms keep under 40% of the healthy excess over 1.0
#: (measured x 32 tokens: healthy 1.92, last_layer 1.08, dropped decoder keys 1.17; x 48:
#: 1.80, 1.05, 1.13) and stay below 1.25.
COLLAPSE_SHARE, COLLAPSED = 0.4, 1.25
MAX_NEW_TOKENS = 32


def test_shipped_drafter_is_intact_and_small():
    assert_checksums(DRAFTER)
    assert (DRAFTER / "model.safetensors").stat().st_size < 25e6
    assert (DRAFTER / "README.md").is_file()
    assert default_drafter() == str(DRAFTER)


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
    from eagle3lab.specdec.failures import sglang_config_speculators_keys

    bad = sglang_config_speculators_keys(DRAFTER, tmp_path / "bad", target=default_target_dir)
    r = measure_acceptance(
        target=real_target,
        arms=[Arm("healthy", str(DRAFTER)), Arm("last_layer", str(DRAFTER), "last_layer"),
              Arm("keys dropped", str(bad), "fused", "sglang")],
        prompts="eval", limit=3, max_new_tokens=MAX_NEW_TOKENS, steps=3, progress=False)
    tau = {a["name"]: a["stats"]["tau"] for a in r["arms"]}
    assert all(a["matches_plain"] == 3 for a in r["arms"]), "exact greedy output"
    assert tau["healthy"] >= TAU_FLOOR, tau
    for arm in ("last_layer", "keys dropped"):
        assert tau[arm] < COLLAPSED, tau
        assert tau[arm] - 1 < COLLAPSE_SHARE * (tau["healthy"] - 1), tau


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
