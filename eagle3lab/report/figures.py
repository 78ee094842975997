"""A notebook's key figure: which plot the report index shows beside its key numbers.

Prevents an index that is a wall of decimals (a person reads acceptance bars faster than
`0.4591 / 0.2201`) and a thumbnail that shows whichever plot happened to come first: a
notebook names its key figure by tagging the cell that draws it `key-figure` (cell
metadata, like papermill's `parameters` tag); the figure is that cell's first PNG output.
A notebook with no tagged cell (or whose tagged cell drew nothing, e.g. a skipped section)
falls back to its first PNG output, and says so (`tagged: False`).

The index embeds a small PNG thumbnail (base64, so the page stays one offline file); the
full figure stays in the notebook's own page.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

#: The cell tag that names a notebook's key figure.
TAG = "key-figure"
#: Thumbnail width in pixels (the index shows it at half that, sharp on HiDPI screens).
THUMB_WIDTH = 760
#: Cells papermill adds to an executed notebook (not counted in the source's cell index).
_ADDED = ("injected-parameters", "papermill-error-cell-tag")


@dataclasses.dataclass(frozen=True)
class KeyFigure:
    cell_index: int  # among the source notebook's cells (from 0, markdown included)
    tagged: bool  # False: no tagged cell drew a figure; this is the notebook's first one
    png: bytes

    def size(self) -> tuple[int, int]:
        from PIL import Image

        with Image.open(io.BytesIO(self.png)) as im:
            return im.size

    def record(self) -> dict[str, Any]:
        """What report.json keeps: where the figure is, not its pixels."""
        w, h = self.size()
        return {"cell_index": self.cell_index, "tagged": self.tagged, "width": w, "height": h}

    def thumbnail(self, width: int = THUMB_WIDTH) -> str:
        """A `data:image/png;base64,...` URI of the figure scaled down to `width` pixels
        (never up)."""
        from PIL import Image

        with Image.open(io.BytesIO(self.png)) as im:
            im = im.convert("RGBA") if im.mode not in ("RGB", "RGBA") else im
            if im.width > width:
                im = im.resize((width, max(1, round(im.height * width / im.width))),
                               Image.Resampling.LANCZOS)
            buf = io.BytesIO()
            im.save(buf, format="PNG", optimize=True)
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _first_png(cell: dict[str, Any]) -> bytes | None:
    for out in cell.get("outputs", []) or []:
        data = (out.get("data") or {}).get("image/png")
        if data:
            return base64.b64decode("".join(data) if isinstance(data, list) else data)
    return None


def key_figure(nb: Any) -> KeyFigure | None:
    """The key figure of an executed notebook (a path, or the notebook as a dict): the first
    PNG of the first cell tagged `key-figure` that has one, else the notebook's first PNG;
    None when the notebook drew no figure."""
    if not isinstance(nb, dict):
        nb = json.loads(Path(nb).read_text(encoding="utf-8"))
    added, first = 0, None
    for i, cell in enumerate(nb.get("cells", [])):
        tags = (cell.get("metadata") or {}).get("tags", []) or []
        if any(t in tags for t in _ADDED):
            added += 1
            continue
        png = _first_png(cell)
        if png is None:
            continue
        if TAG in tags:
            return KeyFigure(i - added, True, png)
        if first is None:
            first = KeyFigure(i - added, False, png)
    return first
