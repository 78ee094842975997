"""What the report's index shows first, and the time table a report ends with: the headline's
speed-ups are those of the machine's fastest configuration (notebook 05's speed section,
notebook 04's arms when they ran in it), whichever speed-up is larger, and a row measured in
another configuration says so; float32 exactness is its own row; every step's wall time is
printed at the end, kept in report.json and shown in the index."""

from __future__ import annotations

import json
import re

import pytest


def _offline(**over) -> dict:
    """Notebook 05's key numbers: the main measurement (float32, exact) and the speed
    section (bf16 on one thread)."""
    return {"tau": 1.81, "speedup_measured": 0.91, "plain_tokens_per_s": 14.8,
            "spec_tokens_per_s": 13.5, "same_as_plain": "4/4",
            "config": "float32, 2 thread(s)", "fast_config": "bfloat16, 1 thread(s)",
            "fast_tau": 2.25, "fast_speedup_measured": 1.65, "fast_plain_tokens_per_s": 21.0,
            "fast_spec_tokens_per_s": 34.6, **over}


def _live(**over) -> dict:
    return {"engine": "reference", "speedup": 1.31, "baseline_tokens_per_s": 20.5,
            "spec_tokens_per_s": 26.9, "accept_length": 1.92,
            "config": "bfloat16, 1 thread(s)", "fast_config": True, **over}


def _rows(**summaries) -> dict:
    from eagle3lab.report.summary import headline

    return {r["source"] + ":" + r["what"].split()[0].rstrip(":"): r for r in headline(summaries)}


def test_the_headline_speed_ups_are_the_fastest_configurations():
    rows = _rows(**{"05_acceptance": _offline(), "04_live_server": _live()})
    assert list(rows) == ["05_acceptance:offline", "04_live_server:live",
                          "05_acceptance:exactness"]
    off = rows["05_acceptance:offline"]
    assert (off["value"], off["text"], off["config"], off["fast"]) == (
        1.65, "x1.65", "bfloat16, 1 thread(s)", True)
    assert off["detail"] == ("bfloat16, 1 thread(s): plain 21.0 -> speculative 34.6 tok/s, "
                             "tau 2.25; also measured: float32, 2 thread(s): x0.91")
    live = rows["04_live_server:live"]
    assert (live["value"], live["config"], live["fast"]) == (1.31, "bfloat16, 1 thread(s)", True)
    assert live["detail"] == ("bfloat16, 1 thread(s): baseline 20.5 -> speculative 26.9 "
                              "tok/s, accept length 1.92")
    exact = rows["05_acceptance:exactness"]  # float32 exactness: its own row
    assert (exact["value"], exact["config"]) == ("4/4", "float32, 2 thread(s)")


@pytest.mark.parametrize("fp32, fast", [(0.91, 1.65), (1.2, 0.95)])
def test_the_fastest_configuration_wins_not_the_larger_speed_up(fp32, fast):
    row = _rows(**{"05_acceptance": _offline(speedup_measured=fp32,
                                             fast_speedup_measured=fast)})
    off = row["05_acceptance:offline"]
    assert off["value"] == fast and off["config"] == "bfloat16, 1 thread(s)"
    assert f"float32, 2 thread(s): x{fp32:.2f}" in off["detail"]


def test_a_row_in_another_configuration_says_so():
    rows = _rows(**{"05_acceptance": _offline(fast_config=None, fast_speedup_measured=None),
                    "04_live_server": _live(config="float32, 1 thread(s)", fast_config=False,
                                            speedup=0.73)})
    off, live = rows["05_acceptance:offline"], rows["04_live_server:live"]
    assert (off["value"], off["fast"]) == (0.91, False)  # no speed section: the main one
    assert off["detail"].startswith("float32, 2 thread(s) (not this machine's fastest "
                                    "configuration)")
    assert (live["value"], live["fast"]) == (0.73, False)
    assert "float32, 1 thread(s) (not this machine's fastest configuration)" in live["detail"]


def test_notebooks_that_recorded_nothing_give_no_row():
    from eagle3lab.report.summary import fastest, headline

    assert headline({"05_acceptance": None, "04_live_server": None}) == []
    rows = headline({"04_live_server": _live(speedup=None)})  # its speculative arm failed
    assert rows == []
    assert fastest([{"config": "a", "speedup": None, "fast": True},
                    {"config": "b", "speedup": 1.1}])["config"] == "b"
    assert fastest([]) is None


def test_the_time_table_lists_every_step_and_the_total():
    from eagle3lab.report.summary import step_times, times_text

    steps = [{"name": "data", "kind": "stage", "status": "computed", "wall_s": 223.46},
             {"name": "05_acceptance", "kind": "notebook", "status": "failed", "wall_s": 7.0},
             {"name": "04_live_server", "kind": "notebook", "status": "skipped",
              "wall_s": None},
             {"name": "06_grokking_vs_data", "kind": "notebook", "status": None}]
    times = step_times(steps)
    assert times == [
        {"step": "data", "kind": "stage", "seconds": 223.46, "status": "computed"},
        {"step": "05_acceptance", "kind": "notebook", "seconds": 7.0, "status": "failed"},
        {"step": "04_live_server", "kind": "notebook", "seconds": None, "status": "skipped"},
        {"step": "06_grokking_vs_data", "kind": "notebook", "seconds": None,
         "status": "not run"}]
    lines = times_text(times, 240.9).splitlines()
    assert lines[0] == "per-step times:"
    cells = [line.split() for line in lines[2:]]
    assert cells == [["data", "stage", "223.5", "computed"],
                     ["05_acceptance", "notebook", "7.0", "failed"],
                     ["04_live_server", "notebook", "-", "skipped"],
                     ["06_grokking_vs_data", "notebook", "-", "not", "run"],
                     ["total", "240.9", "1", "failed"]]
    assert times_text(times[:1], 223.46).splitlines()[-1].split() == ["total", "223.5", "ok"]


@pytest.mark.slow  # run_report (tests/markers.py), though no notebook exists to run
def test_a_report_prints_records_and_shows_its_step_times(tmp_path):
    """No notebook exists: the steps end "missing" at once, and the report still
    ends with its time table (printed last but one, before the index line), keeps it in
    report.json and shows it in index.html."""
    from eagle3lab.report.plan import Step
    from eagle3lab.report.run import run_report

    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    plan = [Step("a_missing", "notebook"), Step("b_missing", "notebook", ("a_missing",))]
    printed: list[str] = []
    rep = run_report(out=tmp_path / "report", notebooks_dir=nbs, plan=plan, echo=printed.append,
                     params={"pipeline": {"work_dir": str(tmp_path / "w")}})
    assert [(t["step"], t["status"], t["seconds"]) for t in rep["times"]] == [
        ("a_missing", "missing", None), ("b_missing", "missing", None)]
    table = printed[-2].splitlines()
    assert table[0] == "per-step times:" and table[2].split()[:3] == ["a_missing", "notebook", "-"]
    assert table[-1].split()[0] == "total" and printed[-1].startswith("report: ")
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["times"] == rep["times"] and saved["headline"] == []
    assert "per-step times:" in (tmp_path / "report" / "report.log").read_text()
    index = (tmp_path / "report" / "index.html").read_text()
    times = re.search(r'<table id="times">(.*?)</table>', index, re.S).group(1)
    assert re.findall(r'<tr data-time="([^"]+)"', times) == ["a_missing", "b_missing"]
    assert '<table id="headline">' not in index  # nothing measured: no headline


def test_the_index_opens_with_the_headline(tmp_path):
    from eagle3lab.report.html import render_index
    from eagle3lab.report.summary import index_tables

    steps = [{"name": n, "kind": "notebook", "deps": [], "about": "", "status": "ok",
              "wall_s": 90.0, "ipynb": f"{n}.ipynb", "html": f"{n}.html", "summary": s}
             for n, s in (("05_acceptance", _offline()), ("04_live_server", _live()))]
    report = {"out": str(tmp_path), "created": "now", "wall_s": 180.0, "work_dir": "/w",
              "params_file": None, "params": None, "pipeline": None, "description": "",
              "timeout_s": 60.0, "versions": {}, "counts": {"ok": 2}, "notes": [],
              "steps": steps, **index_tables(steps)}  # as run_report records them
    page = render_index(report, tmp_path / "index.html").read_text()
    head = re.search(r'<table id="headline">(.*?)</table>', page, re.S).group(1)
    assert page.index('id="headline"') < page.index('id="summary"')  # shown first
    rows = re.findall(r"<tr><td>(.*?)</td><td class=\"big\">(.*?)</td>", head)
    assert [v for _, v in rows] == ["x1.65", "x1.31", "4/4"]
    assert "bfloat16, 1 thread(s): plain 21.0 -&gt; speculative 34.6 tok/s" in head
    times = re.search(r'<table id="times">(.*?)</table>', page, re.S).group(1)
    assert re.findall(r'<tr data-time="([^"]+)"', times) == ["05_acceptance",
                                                            "04_live_server"]
    assert "90.0 s" in times and "3.0 min" in times  # each step, then the total
