"""Fixtures for eagle3lab.preflight: a tiny target config, real drafters written by
speculators itself (and converted to SGLang's format), and launch-command builders.

Built once per session (about a second after the imports); a test copies what it plants a
fault in. Targets are config-only (preflight never reads target weights).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pf(tmp_path_factory):
    """Paths: target (8 layers, hidden 64, vocab 256, 4 heads / 2 kv heads, max pos 512,
    config only), spec (speculators format, aux ids [2, 4, 5] = the default for 8 layers,
    with an eagle3lab record), sglang (converted from spec for SGLang 0.5.23)."""
    from eagle3lab.formats.convert import convert_checkpoint
    from eagle3lab.formats.demo import make_speculators_draft, make_tiny_target

    root = tmp_path_factory.mktemp("preflight")
    target = make_tiny_target(root / "target", weights=False)
    spec = make_speculators_draft(root / "spec", target=target, aux_ids=[2, 4, 5])
    sglang = convert_checkpoint(spec, root / "sglang", to="sglang", target=target,
                                engine="sglang-0.5.23").path
    return {"root": root, "target": target, "spec": spec, "sglang": sglang}
