"""Fixtures for the speculative-decoding tests: an untrained speculators-format drafter for
the tiny random target (every arm of a measurement can be built from it)."""

import pytest


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory, tiny_target_dir):
    from eagle3lab.formats.demo import make_speculators_draft

    return make_speculators_draft(tmp_path_factory.mktemp("d") / "draft",
                                  target=tiny_target_dir, draft_vocab=512)
