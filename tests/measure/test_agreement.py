"""The offline prediction against a server's counters: both sides reduced to the same raw
counts (verify steps, steps accepting at least k drafts), the gap per position in standard
errors, the accept length as 1 + E[accepted] with its standard error."""

import math

import pytest

from eagle3lab.measure.agreement import compare, counts_from_histogram, counts_from_window, table


def window_of(hist):
    """What two vLLM /metrics scrapes around the same decoding give (metrics.window):
    drafts and the accepted count per position (counters are floats in prometheus)."""
    return {"drafts": float(sum(hist)),
            "per_position_accepted": [float(sum(hist[k:])) for k in range(1, len(hist))]}


def test_the_same_decoding_read_from_both_sides_agrees_exactly():
    hist = [400, 300, 200, 100]  # steps that accepted exactly 0, 1, 2, 3 drafts
    off, srv = counts_from_histogram(hist), counts_from_window(window_of(hist))
    assert off == srv == {"steps": 1000, "at_least": [600, 300, 100]}
    r = compare(off, srv)
    assert r["agree"] and r["max_abs_z"] == 0
    assert [row["offline_p"] for row in r["positions"]] == [0.6, 0.3, 0.1]
    mean = (300 * 1 + 200 * 2 + 100 * 3) / 1000
    var = (300 * 1 + 200 * 4 + 100 * 9) / 1000 - mean ** 2
    assert r["accept_length"]["offline"] == pytest.approx(1 + mean)
    assert r["accept_length"]["offline_se"] == pytest.approx(math.sqrt(var / 1000))
    assert "within 3 SE" in table(r)


def test_a_gap_beyond_the_noise_of_the_counts_is_called():
    off = counts_from_histogram([400, 300, 200, 100])
    srv = counts_from_window(window_of([900, 80, 15, 5]))  # a collapsed server
    r = compare(off, srv)
    assert not r["agree"]
    assert r["positions"][0]["z"] < -20 and r["accept_length"]["diff"] < -0.8
    assert "OUTSIDE" in table(r)
    # the same rates from few counts are within the noise
    few = compare(counts_from_histogram([4, 3, 2, 1]), counts_from_window(window_of([5, 3, 1, 1])))
    assert few["agree"]


def test_positions_only_one_side_has_are_kept_as_missing():
    r = compare(counts_from_histogram([5, 5]), counts_from_window(window_of([4, 3, 3])))
    assert len(r["positions"]) == 2
    assert math.isnan(r["positions"][1]["offline_p"]) and math.isnan(r["positions"][1]["z"])
