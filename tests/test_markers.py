"""The test markers say the truth (tests/markers.py): a planted test that uses the real
default target without `real`, runs a notebook without `slow`, or is marked `full` without
`slow`, stops the collection naming it; one that reaches for the real model by its preset
name without `real` fails instead of converting it; and the suite's `-m "not real and not
slow"` selection collects against an empty data root without converting anything. `make
test` leaves out the `full` tests, `make test-all` (what .ci/run runs) runs every test."""

import os
import re
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


@pytest.mark.full
def test_full_not_slow():
    pass


@pytest.mark.full
@pytest.mark.slow
def test_full_and_slow():
    pass
'''

REACHES = '''
from eagle3lab.config import data_root


def test_reaches_for_the_real_model():
    from eagle3lab.targets.adapter import load_target

    assert not (data_root() / "models").exists(), "the data root is empty"
    load_target("smollm2-135m-instruct", device="cpu")
'''


def _pytest(tmp_path, *args, env=None):
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers -p markers\nmarkers =\n    real: r\n    slow: s\n"
        "    full: f\n")
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
    assert "test_planted.py::test_full_not_slow: marked `full` (too slow for `make test`) " \
        "but not `slow`" in problems
    assert "test_marked_real" not in problems and "test_marked_notebook" not in problems
    assert "test_full_and_slow" not in problems


def test_an_unmarked_test_cannot_convert_the_default_target(tmp_path):
    (tmp_path / "test_reaches.py").write_text(textwrap.dedent(REACHES))
    r = _pytest(tmp_path, "-q", "test_reaches.py")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "test_reaches_for_the_real_model is not marked `real` but converts" in out


@pytest.mark.slow
@pytest.mark.full
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


def _recipe(makefile: str, target: str) -> list[str]:
    """The command lines of one Makefile target (its tab-indented lines)."""
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert m, f"Makefile: no target {target!r}"
    return [line.strip() for line in m.group(1).splitlines()]


def test_make_test_leaves_out_full_and_ci_runs_everything():
    """`make test` selects `not full`; `make test-all` runs pytest with no marker selection;
    CI (.ci/run) and the README name `make test-all`."""
    makefile = (REPO / "Makefile").read_text()
    test = [c for c in _recipe(makefile, "test") if " -m pytest" in c]
    assert len(test) == 1 and '-m "not full"' in test[0], test
    test_all = [c for c in _recipe(makefile, "test-all") if " -m pytest" in c]
    assert len(test_all) == 1 and not re.search(r"\s-m\s", test_all[0].split("pytest", 1)[1]), \
        test_all
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith("make ")]
    assert ci == ["make test-all"], ci
    assert "make test-all" in (REPO / "README.md").read_text()
