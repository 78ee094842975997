"""The test markers say the truth (tests/markers.py): a planted test that uses the real
default target without `real`, or runs a notebook without `slow`, stops the collection
naming it; one that reaches for the real model by its preset name without `real` fails
instead of converting it; and the suite's `-m "not real and not slow"` selection collects
against an empty data root without converting anything."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PLANTED = '''
import pytest


@pytest.fixture
def default_target_dir():
    return "stands in for the real one"


def _render(path):
    import papermill
    papermill.execute_notebook(path, path)


def test_unmarked_real(default_target_dir):
    pass


@pytest.mark.real
def test_marked_real(default_target_dir):
    pass


def test_unmarked_notebook():
    _render("x.ipynb")


@pytest.mark.slow
def test_marked_notebook():
    _render("x.ipynb")
'''

REACHES = '''
from eagle3lab.config import data_root


def test_reaches_for_the_real_model():
    from eagle3lab.target.adapter import load_target

    assert not (data_root() / "models").exists(), "the data root is empty"
    load_target("smollm2-135m-instruct", device="cpu")
'''


def _pytest(tmp_path, *args, env=None):
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers -p markers\nmarkers =\n    real: r\n    slow: s\n")
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)


def test_untruthful_markers_stop_the_collection(tmp_path):
    (tmp_path / "test_planted.py").write_text(textwrap.dedent(PLANTED))
    r = _pytest(tmp_path, "--collect-only", "-q", "test_planted.py")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Test markers that do not say the truth" in out, out
    problems = out[out.index("Test markers that do not say the truth"):]
    assert "test_planted.py::test_unmarked_real: uses the real default target" in problems
    assert "test_planted.py::test_unmarked_notebook: runs a notebook but is not marked" \
        in problems
    assert "test_marked_real" not in problems and "test_marked_notebook" not in problems


def test_an_unmarked_test_cannot_convert_the_default_target(tmp_path):
    (tmp_path / "test_reaches.py").write_text(textwrap.dedent(REACHES))
    r = _pytest(tmp_path, "-q", "test_reaches.py")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "test_reaches_for_the_real_model is not marked `real` but converts" in out


@pytest.mark.slow
def test_not_real_collects_without_the_default_target(tmp_path):
    """`-m "not real and not slow"` over the whole suite, with EAGLE3LAB_DATA empty."""
    data = tmp_path / "data"
    data.mkdir()
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                        "--collect-only", "-q", "-m", "not real and not slow"],
                       cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "EAGLE3LAB_DATA": str(data)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "deselected" in r.stdout.splitlines()[-1]  # the real and slow ones
    assert list(data.iterdir()) == [], "collecting converted (or wrote) nothing"
