"""HTML of a batch report: each executed notebook in report mode, and the index page.

Prevents a report that only opens on the machine that made it, or that runs code when
opened: the notebook pages hide code, embed every image (base64) and carry no script at all
(nbconvert's own `sanitize_html` option, with its `clean_html` filter replaced by a bleach
cleaner that keeps what a report shows: headings, tables, embedded images; the package's
nbconvert template renders nothing where the lab template loads require.js, MathJax,
mermaid or the widget manager from the network); index.html is one jinja2-rendered file
with its CSS inline, thumbnails embedded, links only to files in the same directory. The
index opens with the headline (eagle3lab.report.summary.headline: each speed-up as measured
in the machine's fastest configuration, named beside it; exactness as its own row) and
keeps a per-step time table.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any

from eagle3lab.fsutil import atomic_path
from eagle3lab.report.summary import format_value

#: nbconvert template (templates/nbconvert/NAME) of the notebook pages.
NOTEBOOK_TEMPLATE = "eagle3lab-report"

#: What the notebook pages keep of HTML outputs and markdown (anything else is stripped).
_TAGS = {"a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd",
         "del", "details", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3",
         "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "ol", "p", "pre", "q", "s",
         "samp", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td",
         "tfoot", "th", "thead", "tr", "u", "ul", "var"}
_ATTRS = {"*": ["class", "id", "title", "style", "align"], "a": ["href", "name"],
          "img": ["src", "alt", "width", "height"], "table": ["border"],
          "td": ["colspan", "rowspan"], "th": ["colspan", "rowspan", "scope"],
          "ol": ["start"]}
#: Elements dropped together with their content (a stripped <script> would leave its code
#: as visible text otherwise).
_DROP = {"script", "style", "noscript", "template", "iframe", "object", "embed", "frame",
         "frameset", "applet"}


def _offline_filter():
    """An html5lib filter (run after bleach's sanitizer) that removes the _DROP elements
    with everything inside them, and images that would be fetched from the network."""
    from bleach.html5lib_shim import Filter

    class Offline(Filter):
        def __iter__(self):
            depth = 0
            for token in Filter.__iter__(self):
                kind, name = token["type"], token.get("name")
                if name in _DROP and kind in ("StartTag", "EndTag", "EmptyTag"):
                    depth += {"StartTag": 1, "EndTag": -1}.get(kind, 0)
                    depth = max(depth, 0)
                    continue
                if depth:
                    continue
                if name == "img" and not str((token.get("data") or {}).get(
                        (None, "src"), "")).startswith("data:"):
                    continue
                yield token

    return Offline


def report_cleaner():
    """The bleach cleaner of the notebook pages (also the template's `clean_html`)."""
    import bleach
    from bleach.css_sanitizer import ALLOWED_CSS_PROPERTIES, CSSSanitizer

    # _DROP tags pass the sanitizer only so that the filter can remove their content too.
    css = CSSSanitizer(allowed_css_properties=ALLOWED_CSS_PROPERTIES)
    return bleach.Cleaner(tags=_TAGS | _DROP, attributes=_ATTRS,
                          protocols={"http", "https", "mailto", "data"}, strip=True,
                          strip_comments=True, css_sanitizer=css, filters=[_offline_filter()])


def render_notebook(ipynb: str | Path, html_path: str | Path) -> Path:
    """Report-mode HTML of an executed notebook: outputs and markdown only, images embedded,
    no script."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(ipynb), as_version=4)
    nb.metadata.pop("widgets", None)  # widget state is only read by the widget manager
    cleaner = report_cleaner()
    exporter = HTMLExporter(
        template_name=NOTEBOOK_TEMPLATE,
        extra_template_basedirs=[str(files("eagle3lab.report") / "templates" / "nbconvert")],
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True,
        embed_images=True, sanitize_html=True,
        filters={"clean_html": lambda s: cleaner.clean(
            s.decode() if isinstance(s, bytes) else str(s))})
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {
        "name": Path(ipynb).stem}})
    html_path = Path(html_path)
    _write(html_path, body)
    return html_path


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:  # a reader never sees half a page
        tmp.write_text(text, encoding="utf-8")


def _yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def _secs(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min"


def _numbers(summary: dict[str, Any] | None, skip: tuple[str, ...] = ()) -> list[dict]:
    """Key numbers for the page: rounded for reading, the full value in a tooltip."""
    return [{"key": k, "text": format_value(v, digits=3, compact=True),
             "full": json.dumps(v) if isinstance(v, (float, list, dict)) else None}
            for k, v in (summary or {}).items() if k not in skip]


def _stage_when(e: dict[str, Any]) -> str:
    rec = e.get("record") or {}
    if not rec:
        return ""
    when = (f"computed {rec['computed_at']} in {_secs(rec.get('computed_s'))}"
            if rec.get("computed_at") else "made before stage records were kept")
    if e["status"] == "reused":
        when += f"; checked in {_secs(rec.get('check_s'))}"
    return when


def _short_error(e: dict[str, Any]) -> str:
    err = e.get("error") or {}
    cell = e.get("failed_cell")
    msg = f"{err.get('ename')}: {str(err.get('evalue') or '')[:160]}"
    return msg + (f" (cell index {cell['cell_index']})" if cell else "")


def _view(e: dict[str, Any], thumbnails: dict[str, str]) -> dict[str, Any]:
    """One step as the template shows it."""
    v = {**e, "status_class": "st-" + (e["status"] or "not run").replace(" ", "-"),
         "wall": _secs(e.get("wall_s")), "short_error": _short_error(e)}
    if e["kind"] == "notebook":
        v["numbers"] = _numbers(e.get("summary")) if e.get("ipynb") else None
        v["thumbnail"] = thumbnails.get(e["name"])
        kf = e.get("key_figure") or {}
        v["figure_href"] = (e.get("html") or "") + ("#key-figure" if kf.get("tagged") else "")
    else:
        v["numbers"] = _numbers(e.get("summary"), ("source_fingerprint",)) \
            if e.get("record") else None
        v["when"] = _stage_when(e)
    if e.get("parameters") is not None:
        v["parameter_items"] = [(k, json.dumps(p)) for k, p in e["parameters"].items()]
    return v


def render_index(report: dict[str, Any], path: str | Path,
                 thumbnails: dict[str, str] | None = None) -> Path:
    """index.html of a report (see eagle3lab.report.run for the data). thumbnails: step
    name -> data URI of its key figure (eagle3lab.report.figures)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("eagle3lab.report", "templates"),
                             autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    steps = [_view(e, thumbnails or {}) for e in report["steps"]]
    heads = report["headline"]
    times = [{**t, "wall": _secs(t["seconds"]) or "-"} for t in report["times"]]
    notes = list(report.get("notes", [])) + [f"{e['name']}: {n}" for e in report["steps"]
                                             for n in e.get("notes", []) or []]
    page = env.get_template("index.html.j2").render(
        report=report, title=f"eagle3lab report · {Path(report['out']).name}",
        wall=_secs(report.get("wall_s")),
        counts=", ".join(f"{v} {k}" for k, v in report.get("counts", {}).items()),
        notebooks=[s for s in steps if s["kind"] == "notebook"],
        stages=[s for s in steps if s["kind"] == "stage"],
        failed=[s for s in steps if s["status"] == "failed"], notes=notes,
        headline=heads, times=times,
        pipeline_yaml=_yaml(report.get("pipeline")),
        params_yaml=_yaml(report["params"]) if report.get("params") else None)
    path = Path(path)
    _write(path, page)
    return path
