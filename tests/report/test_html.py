"""The report's HTML without running papermill: a notebook page carries no script (whatever
its outputs held) but keeps headings, tables and embedded figures; a notebook's key figure
is its `key-figure` cell's plot; the index shows each figure as an embedded thumbnail that
links to the notebook's page, and its numbers rounded (full value in the tooltip)."""

from __future__ import annotations

import base64
import io
import json
import re

import nbformat
import pytest


def _png(width_in: float = 8.0) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width_in, 3))
    ax.bar([0, 1, 2], [0.9, 0.5, 0.2])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _image(b64: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("display_data", data={"image/png": b64,
                                                        "text/plain": "<Figure>"})


def _executed_notebook() -> nbformat.NotebookNode:
    """What papermill leaves: an injected-parameters cell, then the notebook's cells."""
    import pandas as pd

    nb = nbformat.v4.new_notebook()
    table = pd.DataFrame({"tau": [2.5, 1.2]}).to_html()
    nb.cells = [
        nbformat.v4.new_code_cell("n = 3", metadata={"tags": ["injected-parameters"]}),
        nbformat.v4.new_markdown_cell("## Acceptance per position\n\nSome *text*.\n\n"
                                      "<script>alert('markdown')</script>"),
        nbformat.v4.new_code_cell("plot_other()", outputs=[_image(_png(4))]),
        nbformat.v4.new_code_cell("show()", outputs=[
            nbformat.v4.new_output("display_data", data={
                "text/html": table + "<script>evilInHtml()</script><style>td{color:red}</style>"
                                     "<img src='https://example.com/x.png'>",
                "text/plain": "table"}),
            nbformat.v4.new_output("display_data", data={
                "application/javascript": "evilJs()", "text/plain": "js"}),
            nbformat.v4.new_output("display_data", data={
                "application/vnd.jupyter.widget-view+json": {"model_id": "abc",
                                                             "version_major": 2,
                                                             "version_minor": 0},
                "text/plain": "progress"}),
            nbformat.v4.new_output("stream", name="stdout", text="printed line\n")]),
        nbformat.v4.new_code_cell("plot_key()", metadata={"tags": ["key-figure"]},
                                  outputs=[_image(_png(12)), _image(_png(3))]),
    ]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return nb


def test_a_notebook_page_has_no_script_and_keeps_what_it_shows(tmp_path):
    from eagle3lab.report.html import render_notebook

    src = tmp_path / "05_acceptance.ipynb"
    nbformat.write(_executed_notebook(), str(src))
    page = render_notebook(src, tmp_path / "05_acceptance.html").read_text()
    assert not re.search(r"<script", page, re.I), "no script element at all"
    for gone in ("alert(", "evilInHtml", "evilJs", "example.com", "widget-state",
                 "require.min.js", "MathJax.js", "mermaid.esm"):
        assert gone not in page, gone
    assert re.search(r"<h2[^>]*>Acceptance per position", page)
    assert '<table border="1" class="dataframe">' in page and ">2.5<" in page
    assert "printed line" in page and "<em>text</em>" in page
    assert page.count('src="data:image/png;base64,') == 3  # every figure, embedded
    assert 'id="key-figure"' in page  # what the index's thumbnail links to
    assert "plot_key()" not in page  # code hidden


def test_the_key_figure_is_the_tagged_cells_first_plot(tmp_path):
    from eagle3lab.report.figures import key_figure

    nb = json.loads(nbformat.writes(_executed_notebook()))
    kf = key_figure(nb)
    assert kf.tagged and kf.cell_index == 3  # the source's index: injected cell not counted
    assert kf.record() == {"cell_index": 3, "tagged": True, "width": 1200, "height": 300}
    uri = kf.thumbnail(width=480)
    png = base64.b64decode(uri.removeprefix("data:image/png;base64,"))
    from PIL import Image

    assert Image.open(io.BytesIO(png)).size == (480, 120)
    for cell in nb["cells"]:  # untagged: the first plot, and it says so
        cell["metadata"].pop("tags", None)
    kf = key_figure(nb)
    assert not kf.tagged and kf.cell_index == 2 and kf.size() == (400, 300)
    nb["cells"] = nb["cells"][:2]
    assert key_figure(nb) is None


def _report(tmp_path, thumb: str) -> dict:
    from eagle3lab.report.summary import index_tables

    report = {
        "out": str(tmp_path), "created": "2026-01-01T00:00:00", "wall_s": 75.0,
        "work_dir": "/work", "params_file": None, "params": {"common": {"x": 1}},
        "pipeline": {"target": "t"}, "description": "test <b>report</b>", "timeout_s": 60.0,
        "versions": {"torch": "2.13.0"}, "counts": {"ok": 2, "failed": 1}, "notes": [],
        "steps": [
            {"name": "train", "kind": "stage", "deps": [], "about": "train it", "status":
             "computed", "wall_s": 3.0, "record": {"computed_at": "now", "computed_s": 3.0},
             "summary": {"steps": 12, "source_fingerprint": "abc"}},
            {"name": "05_acceptance", "kind": "notebook", "deps": [], "about": "tau",
             "status": "ok", "wall_s": 130.0, "ipynb": "05_acceptance.ipynb",
             "html": "05_acceptance.html", "parameters": {"limit": 2},
             "key_figure": {"cell_index": 6, "tagged": True, "width": 1200, "height": 400},
             "summary": {"tau": 2.4567891, "acceptance_per_position": [0.4591234, 0.2201234],
                         "tokens": 31504880, "arm": "healthy <i>", "same": True}},
            {"name": "06_grokking_vs_data", "kind": "notebook", "deps": [], "about": "study",
             "status": "failed", "wall_s": 2.0, "ipynb": "06_grokking_vs_data.ipynb",
             "parameters": {}, "error": {"ename": "ValueError", "evalue": "planted <x>",
                                         "traceback": "Traceback ..."},
             "failed_cell": {"cell_index": 4, "execution_count": 3,
                             "source_first_line": "raise ValueError()"}},
        ]}
    return {**report, **index_tables(report["steps"])}  # as run_report records them


def test_the_index_shows_thumbnails_and_rounded_numbers(tmp_path):
    from eagle3lab.report.figures import KeyFigure
    from eagle3lab.report.html import render_index

    thumb = KeyFigure(6, True, base64.b64decode(_png(12))).thumbnail()
    page = render_index(_report(tmp_path, thumb), tmp_path / "index.html",
                        {"05_acceptance": thumb}).read_text()
    assert "<script" not in page and "<link" not in page
    row05 = re.search(r'<tr data-step="05_acceptance">(.*?)</tr>', page, re.S).group(1)
    assert f'<a href="05_acceptance.html#key-figure"><img class="thumb" src="{thumb}"' in row05
    # rounded for reading; the full value in the tooltip (and in report.json, untouched)
    assert '<dd title="2.4567891">2.46</dd>' in row05
    assert '<dd title="[0.4591234, 0.2201234]">0.459 / 0.22</dd>' in row05
    assert "<dd>31.5M</dd>" in row05 and "<dd>yes</dd>" in row05
    assert "healthy &lt;i&gt;" in row05  # values are escaped
    row06 = re.search(r'<tr data-step="06_grokking_vs_data">(.*?)</tr>', page, re.S).group(1)
    assert "no figure" in row06 and "no summary" in row06 and "thumb" not in row06
    assert page.count('class="thumb"') == 1
    assert "Failed in cell index 4 of 06_grokking_vs_data.ipynb" in page
    assert "planted &lt;x&gt;" in page and 'href="#failure-06_grokking_vs_data"' in page
    stage = re.search(r'<tr data-step="train">(.*?)</tr>', page, re.S).group(1)
    assert "computed now in 3.0 s" in stage and "source_fingerprint" not in stage
    assert "test &lt;b&gt;report&lt;/b&gt;" in page and "2.2 min" in page
    assert '<dt>limit</dt><dd><code>2</code></dd>' in page


@pytest.mark.parametrize("value, reading, notebook", [
    (0.4591234, "0.459", "0.4591"), (31504880, "31.5M", "31,504,880"),
    (1234.5, "1,234", "1,234"), (2.0e9, "2G", "2,000,000,000"), ([0.5, None], "0.5 / n/a",
                                                                  "0.5 / n/a")])
def test_format_value_rounds_for_reading_only_in_the_index(value, reading, notebook):
    from eagle3lab.report.summary import format_value

    assert format_value(value, digits=3, compact=True) == reading
    assert format_value(value) == notebook  # the notebook's own table: unchanged
