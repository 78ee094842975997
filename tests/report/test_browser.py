"""The tiny end-to-end report in a real browser: headless Chromium opens index.html and one
notebook report, takes screenshots (kept in the report's screenshots/ directory, a CI
artifact under reports/ci when EAGLE3LAB_CI_ARTIFACTS is set), and the DOM it rendered
shows the summary table's rows and the notebook's plots as non-empty embedded images.

Needs Debian's `chromium` (.ci/run installs it); skipped with the reason otherwise.
"""

from __future__ import annotations

import base64
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.real, pytest.mark.slow, pytest.mark.full,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: "
                       "apt-get install chromium; .ci/run installs it)"),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium(args: list[str], profile: Path) -> str:
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"{cmd} failed: {res.stderr[-2000:]}"
    return res.stdout


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def _screenshot(page: Path, shot: Path, profile: Path) -> None:
    _chromium([f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri()], profile)
    w, h = _png_size(shot.read_bytes())
    assert (w, h) == (1280, 2000) and shot.stat().st_size > 10_000, "a blank screenshot"


def test_index_and_a_notebook_report_render_in_chromium(tiny_report, tmp_path):
    from eagle3lab.report.plan import PLAN

    report, _, out = tiny_report
    shots = out / "screenshots"
    shots.mkdir(exist_ok=True)
    profile = tmp_path / "chromium-profile"

    index = out / "index.html"
    _screenshot(index, shots / "index.png", profile)
    dom = _chromium(["--dump-dom", index.as_uri()], profile)
    table = re.search(r"<table id=\"summary\">.*?<tbody>(.*?)</tbody>", dom, re.S)
    assert table, "the summary table is in the rendered page"
    rows = re.findall(r"<tr data-step=\"([^\"]+)\"", table.group(1))
    assert rows == [s.name for s in PLAN if s.kind == "notebook"]
    stages = re.search(r"<table id=\"stages\">.*?<tbody>(.*?)</tbody>", dom, re.S)
    assert re.findall(r"<tr data-step=\"([^\"]+)\"", stages.group(1)) == [
        s.name for s in PLAN if s.kind == "stage"]

    page = out / "02_training_curves.html"
    if not page.exists():  # the notebook not there yet: any rendered one with plots
        page = next(out / e["html"] for e in report["steps"] if e.get("html"))
    _screenshot(page, shots / f"{page.stem}.png", profile)
    dom = _chromium(["--dump-dom", page.as_uri()], profile)
    srcs = re.findall(r"<img[^>]*\ssrc=\"data:image/png;base64,([^\"]*)\"", dom)
    assert srcs, f"{page.name}: no embedded images in the rendered DOM"
    for b64 in srcs:
        w, h = _png_size(base64.b64decode(b64))
        assert w > 100 and h > 100, f"{page.name}: an empty plot ({w}x{h})"
    assert "<script src=\"http" not in dom
