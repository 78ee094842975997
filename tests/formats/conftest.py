"""Fixtures for eagle3lab.formats: a tiny real target and drafts written by speculators itself.

Built once per session (about a second after the imports); tests copy them before planting
a fault, so every fault is checked against an otherwise good checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from testutil import edit_config, edit_state


@pytest.fixture(scope="session")
def fx(tmp_path_factory):
    """Paths: target (8 layers, hidden 64, vocab 256), spec (speculators format, aux ids
    [1, 4, 6] in vLLM's convention + an eagle3lab record), sglang (converted from spec)."""
    from eagle3lab.formats.convert import convert_checkpoint
    from eagle3lab.formats.demo import make_speculators_draft, make_tiny_target

    root = tmp_path_factory.mktemp("formats")
    target = make_tiny_target(root / "target")
    spec = make_speculators_draft(root / "spec", target=target, aux_ids=[1, 4, 6])
    sglang = convert_checkpoint(spec, root / "sglang", to="sglang", target=target).path
    return {"root": root, "target": target, "spec": spec, "sglang": sglang}


class Planter:
    """Copies a good fixture checkpoint and edits its config or tensors."""

    def __init__(self, fx, tmp_path: Path):
        self.fx, self.tmp, self.n = fx, tmp_path, 0

    def copy(self, kind: str = "sglang") -> Path:
        self.n += 1
        return Path(shutil.copytree(self.fx[kind], self.tmp / f"{kind}-{self.n}"))

    config = staticmethod(edit_config)
    state = staticmethod(edit_state)


@pytest.fixture
def plant(fx, tmp_path) -> Planter:
    return Planter(fx, tmp_path)
