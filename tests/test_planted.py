"""tests/planted.py, the check behind the "every finding code has a planted-fault test"
meta-tests (tests/formats/test_inspect_checkpoint.py, tests/preflight/test_preflight_checks.py):
a code named only in a comment, a docstring or a test that does not check it is reported;
each way a test can check a finding passes."""

from __future__ import annotations

import importlib.util
import textwrap

from planted import planted_problems

MODULE = '''
from planted import plants


def helper(r):
    return [f for f in r if f == "shape"]


def test_mentions_in_comments_only(r):
    """Checks "fc-dim"."""
    # "fc-dim" here too
    assert r is not None


@plants("fc-dim")
def test_claims_but_does_not_check(r):
    """Plants "fc-dim"."""
    x = "fc-dim"  # assigned, never asserted
    assert r


@plants("shape")
def helper_is_not_a_test(r):
    assert "shape" in r


@plants("dtype")
def test_asserts_directly(r):
    assert "dtype" in r


@plants("vocab-map", "aux-layers")
def test_unpacks_and_calls_next(r, by_code):
    [f] = by_code(r, "vocab-map")
    g = next(f for f in r if f.code == "aux-layers")


@plants("nonfinite")
def test_asserts_a_value_that_flows_from_the_code(r):
    bad = {f.tensor for f in r if f.code == "nonfinite"}
    names = sorted(bad)
    assert names == ["fc.weight"]


@plants("no-such-code")
def test_claims_an_unknown_code(r):
    assert "no-such-code" in r
'''


def _module(tmp_path, source: str):
    path = tmp_path / "test_fake_planted.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("test_fake_planted", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_code_maps_to_a_test_that_checks_it(tmp_path):
    module = _module(tmp_path, MODULE)
    problems = planted_problems(module, ["fc-dim", "shape", "dtype", "vocab-map",
                                         "aux-layers", "nonfinite"])
    assert problems == [
        "fc-dim: test_claims_but_does_not_check is marked @plants('fc-dim') but does not "
        "check a finding with that code",
        "shape: no test of test_fake_planted is marked @plants('shape')",
        "test_claims_an_unknown_code: @plants('no-such-code') names no code of this check"]
    assert planted_problems(module, ["dtype", "vocab-map", "aux-layers", "nonfinite",
                                     "no-such-code", "fc-dim"]) == problems[:1]
