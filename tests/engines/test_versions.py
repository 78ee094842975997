"""The engine releases: compared as numbers, read from the installed metadata (nothing of
the engine imported), the pinned SGLang when none is installed."""

from __future__ import annotations

from importlib import metadata

import pytest

from eagle3lab.engines import versions
from eagle3lab.engines.versions import installed_version, version_tuple


@pytest.mark.parametrize("text,expected", [
    ("0.5.23", (0, 5, 23)), ("0.25.1rc1", (0, 25, 1)), ("2.13.0+cu128", (2, 13, 0)),
    ("1", (1,)), ("0.5.x", (0, 5, 0))])
def test_version_tuple(text, expected):
    assert version_tuple(text) == expected


def test_versions_order_as_numbers_not_strings():
    assert version_tuple("0.5.9") < version_tuple("0.5.23") < version_tuple("0.25.1")


def test_installed_versions_come_from_metadata(monkeypatch):
    assert installed_version("pydantic") == metadata.version("pydantic")
    assert installed_version("no-such-distribution-eagle3lab") is None
    seen = []

    def fake(name):
        seen.append(name)
        if name == "vllm":
            return "0.25.1"
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", fake)
    assert versions.installed_vllm_version() == "0.25.1"
    assert versions.installed_sglang_version() is None
    assert seen == ["vllm", "sglang"]
