"""Shared fixtures: the real default target (prepared once; only for tests marked `real`),
its tokenizer alone (read from the GGUF, nothing converted), tiny random Llama targets with
that tokenizer, and a tiny target whose next-token distributions are SHARP (so matching
them is a learnable task with a measurable accuracy), its shards, and one trained run
shared by the tests that only read a run (training and study tests).

The marker checks (tests/markers.py) are loaded here: a test that uses the real default
target must be marked `real`, one that runs a notebook `slow`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from markers import pytest_collection_modifyitems, real_target_only_when_marked  # noqa: F401
from testutil import make_tiny_llama

# The live-server fixtures (fake servers, no orphans, the tiny reference server), shared by
# tests/serving, tests/serverlogs, tests/measure and tests/refserver.
pytest_plugins = ["serverutil"]

# On a CPU shared with other jobs, OpenMP threads that spin-wait for a descheduled sibling
# make every op ~20x slower; passive waiting avoids it. Effective only if torch is not yet
# imported in this process, and inherited by the papermill kernels the notebook tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def default_target_dir() -> Path:
    """The real SmolLM2-135M-Instruct, converted and verified (a no-op once prepared)."""
    from eagle3lab.targets.default import prepare_target

    return prepare_target(verbose=False)


@pytest.fixture(scope="session")
def real_target(default_target_dir):
    """The real default target loaded once (CPU, fp32) for the tests that only run it
    (generate, extract, capture, decode: none changes its weights, dtype or hooks); ~8 s
    per load saved. A test that changes a loaded target loads its own."""
    from eagle3lab.targets.adapter import load_target

    return load_target(str(default_target_dir), device="cpu")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer (vocab 49152, chat template) saved once per session, built from
    the GGUF's tokenizer metadata alone (~7 s; no weights are read, nothing is converted).
    These are the files `prepare_target` saves beside the converted weights."""
    from transformers import AutoTokenizer

    from eagle3lab.targets.default import find_gguf

    gguf = find_gguf()
    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, tokenizer_dir) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    from eagle3lab.targets.adapter import load_target

    return load_target(str(tiny_target_dir), device="cpu")


@pytest.fixture(scope="session")
def sharp_target_dir(tmp_path_factory, tokenizer_dir) -> Path:
    """8 layers, hidden 64, logits x40: the target's argmax is a stable function of context."""
    return make_tiny_llama(tmp_path_factory.mktemp("sharp-llama"), tokenizer_dir,
                           head_scale=40.0)


@pytest.fixture(scope="session")
def sharp_data(tmp_path_factory, sharp_target_dir) -> dict[str, str]:
    """48 train / 12 held-out synthetic conversations through the sharp target; draft
    vocab 64. Made by the library's own demo_data (which the notebooks use)."""
    from eagle3lab.study.sweep import demo_data

    return demo_data(tmp_path_factory.mktemp("sharp-data"), target=str(sharp_target_dir),
                     n_train=48, n_eval=12, draft_vocab_size=64)


#: The learning run: 8 epochs of 48 samples in 512-token batches (~48 steps, ~10 s).
LEARN_KW = dict(epochs=8, max_tokens_per_batch=512, lr=1e-3, eval_every=8,
                checkpoint_every=20, progress=False)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, sharp_data) -> Path:
    from eagle3lab.train import train

    out = tmp_path_factory.mktemp("trained") / "run"
    train(data=sharp_data["train"], eval_data=sharp_data["eval"], out=str(out), **LEARN_KW)
    return out
