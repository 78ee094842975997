"""The numbers behind the inspect notebook on the notebook's own demo pair (a good SGLang
drafter and a copy with planted faults): per-tensor statistics, the diff, vocabulary
coverage, and the key numbers for the batch report."""

import pandas as pd
import pytest

from eagle3lab.formats import inspect_checkpoint
from eagle3lab.formats.stats import (diff_checkpoints, differing_tensors, summary_numbers,
                                     tensor_stats, tensors_in_one_only, vocab_coverage)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from eagle3lab.formats.demo import make_demo_pair

    return make_demo_pair(tmp_path_factory.mktemp("demo"))


def test_the_planted_faults_show_in_the_numbers(pair):
    stats = {r["name"]: r for r in tensor_stats(pair["faulty"])}
    assert stats["lm_head.weight"]["nan"] == 1
    diff = diff_checkpoints(pair["good"], pair["faulty"])
    assert sorted(differing_tensors(diff)) == ["d2t", "lm_head.weight"]
    assert differing_tensors(pd.DataFrame(diff)) == differing_tensors(diff)  # as displayed
    assert tensors_in_one_only(diff) == []
    assert differing_tensors(diff_checkpoints(pair["good"], pair["good"])) == []


def test_differing_and_one_sided_rows():
    rows = [{"tensor": "a", "in_a": True, "in_b": True, "bit_equal": False},
            {"tensor": "b", "in_a": True, "in_b": True, "bit_equal": True},
            {"tensor": "c", "in_a": True, "in_b": False},
            {"tensor": "d", "in_a": True, "in_b": True}]  # other shapes: not compared
    assert differing_tensors(rows) == ["a"] == differing_tensors(pd.DataFrame(rows))
    assert tensors_in_one_only(rows) == ["c"]


def test_summary_numbers_of_the_good_and_the_faulty_drafter(pair):
    from eagle3lab.formats.demo import zipf_counts

    good = inspect_checkpoint(pair["good"], target=str(pair["target"]))
    cov = vocab_coverage(pair["good"], zipf_counts(256, seed=1))
    diff = diff_checkpoints(pair["good"], pair["faulty"])
    n = summary_numbers(good, coverage=cov, diff=diff)
    assert list(n) == ["engine", "format", "ok", "findings", "errors", "warnings", "codes",
                       "skipped_checks", "vocab_coverage", "tensors_differing_from_second"]
    assert (n["engine"], n["format"], n["ok"], n["errors"]) == (good.engine, good.format,
                                                                True, 0)
    assert n["vocab_coverage"] == cov["coverage"] and 0 < cov["coverage"] <= cov["best"]
    assert n["tensors_differing_from_second"] == 2
    bad = inspect_checkpoint(pair["faulty"], target=str(pair["target"]), engine=good.engine)
    n = summary_numbers(bad)
    assert n["ok"] is False and n["errors"] == len(bad.errors()) >= 1
    assert n["findings"] == n["errors"] + n["warnings"] + sum(
        f.severity not in ("error", "warning") for f in bad.findings)
    assert {"nonfinite", "vocab-map"} <= set(n["codes"])
    assert n["vocab_coverage"] is None and n["tensors_differing_from_second"] is None
