"""Shared fixtures: the real default target (prepared once) and tiny random Llama targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from testutil import make_tiny_llama


@pytest.fixture(scope="session")
def default_target_dir() -> Path:
    """The real SmolLM2-135M-Instruct, converted and verified (a no-op once prepared)."""
    from eagle3lab.default_target import prepare_target

    return prepare_target(verbose=False)


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, default_target_dir) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), default_target_dir)


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    from eagle3lab.target import load_target

    return load_target(str(tiny_target_dir), device="cpu")
