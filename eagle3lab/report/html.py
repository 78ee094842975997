"""HTML of a batch report: each executed notebook in report mode, and the index page.

Prevents a report that only opens on the machine that made it: the notebook pages hide code
and embed every image (base64), scripts that would load from the network (require.js,
MathJax, widget managers) are removed, and index.html is a single file with its CSS inline,
links only to files in the same directory.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from eagle3lab.report.summary import format_value

#: Anything that would fetch from the network: <script> elements whose source or body
#: names an http(s) URL (require.js, MathJax, the mermaid loader), and <link> stylesheets.
_EXTERNAL = [
    re.compile(r"<script\b[^>]*>(?:(?!</script>).)*?https?://(?:(?!</script>).)*?</script>",
               re.I | re.S),
    re.compile(r"<script\b[^>]*\ssrc=[\"']https?://[^>]*>\s*</script>", re.I),
    re.compile(r"<link\b[^>]*\shref=[\"']https?://[^>]*>", re.I),
]


def render_notebook(ipynb: str | Path, html_path: str | Path) -> Path:
    """Report-mode HTML of an executed notebook: outputs and markdown only, images embedded,
    no network resources."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(ipynb), as_version=4)
    nb.metadata.pop("widgets", None)  # widget state needs a manager script from the network
    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True, embed_images=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {
        "name": Path(ipynb).stem}})
    for pat in _EXTERNAL:
        body = pat.sub("", body)
    html_path = Path(html_path)
    html_path.write_text(body, encoding="utf-8")
    return html_path


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
 max-width:1200px;padding:0 1em;color:#1d1d1f;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:1.8em;
 border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;width:100%;margin:.5em 0;font-size:.92em}
th,td{border:1px solid #d0d0d0;padding:.35em .5em;vertical-align:top;text-align:left}
thead th{background:#f3f3f5} .meta{color:#555}
.st{font-weight:600;white-space:nowrap;padding:.1em .45em;border-radius:3px}
.st-ok,.st-computed,.st-reused{background:#e3f5e1;color:#17651b}
.st-failed{background:#fde2e1;color:#a11}
.st-skipped,.st-missing{background:#fff3cd;color:#7a5b00}
.st-not-selected{background:#eee;color:#555}
dl.kv{margin:0;display:grid;grid-template-columns:max-content auto;column-gap:.8em}
dl.kv dt{color:#555} dl.kv dd{margin:0;font-variant-numeric:tabular-nums}
pre{background:#f7f7f9;border:1px solid #e3e3e3;padding:.6em;overflow:auto;font-size:.85em;
 max-height:28em;white-space:pre-wrap}
.none{color:#888;font-style:italic}
"""


def _yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def _e(x: Any) -> str:
    return html.escape(str(x))


def _status(s: str | None) -> str:
    s = s or "not run"
    return f"<span class='st st-{_e(s.replace(' ', '-'))}'>{_e(s)}</span>"


def _numbers(summary: dict[str, Any] | None, skip: tuple[str, ...] = ()) -> str:
    if not summary:
        return "<span class='none'>no summary</span>"
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(format_value(v))}</dd>"
                    for k, v in summary.items() if k not in skip)
    return f"<dl class='kv'>{items}</dl>"


def _secs(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min"


def _links(e: dict[str, Any]) -> str:
    out = []
    if e.get("html"):
        out.append(f"<a href='{_e(e['html'])}'>report</a>")
    if e.get("ipynb"):
        out.append(f"<a href='{_e(e['ipynb'])}'>notebook</a>")
    return " · ".join(out)


def _short_error(e: dict[str, Any]) -> str:
    err = e.get("error") or {}
    cell = e.get("failed_cell")
    msg = f"{err.get('ename')}: {str(err.get('evalue') or '')[:160]}"
    return msg + (f" (cell index {cell['cell_index']})" if cell else "")


def _failure(e: dict[str, Any]) -> str:
    err = e.get("error") or {}
    cell = e.get("failed_cell")
    where = ""
    if cell:
        where = (f"<p>Failed in cell index {cell['cell_index']} of {_e(e['name'])}.ipynb "
                 f"(cells counted from 0, markdown included; execution count "
                 f"In [{_e(cell.get('execution_count'))}]): <code>"
                 f"{_e(cell.get('source_first_line', ''))}</code></p>")
    link = ""
    if e.get("ipynb"):
        link = (f"<p>Executed notebook: <a href='{_e(e['ipynb'])}'>{_e(e['ipynb'])}</a>"
                + (f" · <a href='{_e(e['html'])}#papermill-error-cell'>report at the error</a>"
                   if e.get("html") else "") + "</p>")
    tb = err.get("traceback") or ""
    return (f"<div class='failure' id='failure-{_e(e['name'])}'><h3>{_e(e['name'])} "
            f"({_e(e['kind'])})</h3>{where}<p><b>{_e(err.get('ename'))}</b>: "
            f"{_e(err.get('evalue'))}</p>{link}"
            + (f"<pre>{_e(tb)}</pre>" if tb else "") + "</div>")


def render_index(report: dict[str, Any], path: str | Path) -> Path:
    """index.html of a report (see eagle3lab.report.run for the data)."""
    steps = report["steps"]
    nbs = [e for e in steps if e["kind"] == "notebook"]
    stages = [e for e in steps if e["kind"] == "stage"]
    counts = ", ".join(f"{v} {k}" for k, v in report.get("counts", {}).items())
    title = f"eagle3lab report · {Path(report['out']).name}"
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{_e(title)}</h1>"]
    if report.get("description"):
        parts.append(f"<p>{_e(report['description'])}</p>")
    parts.append(
        f"<p class='meta'>Created {_e(report['created'])} · total {_secs(report.get('wall_s'))}"
        f" · {_e(counts)} · parameters: {_e(report.get('params_file') or '(defaults)')}"
        f" · work dir <code>{_e(report['work_dir'])}</code></p>")
    rows = []
    for e in nbs:
        rows.append(f"<tr data-step='{_e(e['name'])}'><td><b>{_e(e['name'])}</b><br>"
                    f"<small class='meta'>{_e(e.get('about', ''))}</small></td>"
                    f"<td>{_status(e['status'])}"
                    + (f"<br><small>{_e(e['reason'])}</small>" if e.get("reason") else "")
                    + (f"<br><small>{_e(_short_error(e))} · <a href='#failure-"
                       f"{_e(e['name'])}'>details</a></small>" if e["status"] == "failed"
                       else "")
                    + f"</td><td>{_secs(e.get('wall_s'))}</td>"
                    f"<td>{_numbers(e.get('summary')) if e.get('ipynb') else ''}</td>"
                    f"<td>{_links(e)}</td></tr>")
    parts.append("<h2>Notebooks: key numbers</h2><table id='summary'><thead><tr><th>notebook"
                 "</th><th>status</th><th>wall time</th><th>key numbers</th><th>files</th>"
                 "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    srows = []
    for e in stages:
        rec = e.get("record") or {}
        when = ""
        if rec:
            when = (f"computed {_e(rec['computed_at'])} in {_secs(rec.get('computed_s'))}"
                    if rec.get("computed_at") else "made before stage records were kept")
            if e["status"] == "reused":
                when += f"; checked in {_secs(rec.get('check_s'))}"
        srows.append(f"<tr data-step='{_e(e['name'])}'><td><b>{_e(e['name'])}</b><br><small "
                     f"class='meta'>{_e(e.get('about', ''))}</small></td><td>"
                     f"{_status(e['status'])}"
                     + (f"<br><small>{_e(e['reason'])}</small>" if e.get("reason") else "")
                     + f"</td><td>{_secs(e.get('wall_s'))}</td><td>{when}</td><td>"
                     f"{_numbers(e.get('summary'), ('source_fingerprint',)) if rec else ''}"
                     f"</td></tr>")
    if stages:
        parts.append("<h2>Pipeline stages</h2><p class='meta'>Library stages in the work dir; a "
                     "complete stage is reused (its original time is shown).</p>"
                     "<table id='stages'>"
                     "<thead><tr><th>stage</th><th>status</th><th>wall time</th><th>computed"
                     "</th><th>key numbers</th></tr></thead><tbody>" + "".join(srows)
                     + "</tbody></table>")
    failed = [e for e in steps if e["status"] == "failed"]
    if failed:
        parts.append("<h2>Failures</h2>" + "".join(_failure(e) for e in failed))
    notes = list(report.get("notes", [])) + [f"{e['name']}: {n}" for e in steps
                                             for n in e.get("notes", []) or []]
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes)
                     + "</ul>")
    prow = []
    for e in nbs:
        if e.get("parameters") is None:
            continue
        vals = "".join(f"<dt>{_e(k)}</dt><dd><code>{_e(json.dumps(v))}</code></dd>"
                       for k, v in e["parameters"].items())
        cell = f"<dl class='kv'>{vals}</dl>" if vals else "<span class='none'>none</span>"
        prow.append(f"<tr><td>{_e(e['name'])}</td><td>{cell}</td></tr>")
    parts.append("<h2>Parameters used</h2><table id='parameters'><thead><tr><th>notebook</th>"
                 "<th>parameters passed by papermill (others: the notebook's defaults)</th>"
                 "</tr></thead><tbody>" + "".join(prow) + "</tbody></table>")
    if stages:
        parts.append("<p>Pipeline settings (stages, defaults filled in):</p><pre>"
                     + _e(_yaml(report.get("pipeline"))) + "</pre>")
    if report.get("params"):
        parts.append(f"<p>Parameters as given ({_e(report.get('params_file') or 'a dict')}):"
                     f"</p><pre>" + _e(_yaml(report["params"])) + "</pre>")
    vrows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
                    for k, v in report.get("versions", {}).items())
    parts.append(f"<h2>Versions</h2><table id='versions'>{vrows}</table>")
    parts.append("<p class='meta'>Machine-readable: <a href='report.json'>report.json</a> · "
                 "log: <a href='report.log'>report.log</a> · per-cell timeout "
                 f"{_e(report.get('timeout_s'))} s</p></body></html>")
    path = Path(path)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
