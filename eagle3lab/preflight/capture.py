"""Does this engine version capture aux hidden states from this target's model class?

Prevents serving a correct drafter behind a target class that never hands it the three aux
layers (the deepest failure of the case that motivated eagle3lab: accept length 1.00, fc
bypassed, no error). The facts are tables in capture_tables/, never guesses in code:
- `sglang-VERSION.json`: generated from that SGLang's `srt/models/` by
  gen_capture_table.py (every EntryClass architecture, with or without capture);
- `sglang-reported.json`: reported cases of older builds whose source was not read in full
  (early-2026 Kimi-K2.5 wrapper that did not forward the capture);
- `vllm-VERSION.json`: generated from that vLLM's source by gen_capture_table.py
  (`--engine vllm --source DIR`: every registry architecture, SupportsEagle3 or not).
An architecture a table does not list is "unknown" and said so, never "fine". A release
newer than every table is judged with the newest older one; an older one than every table
keeps only that table's "no" answers (capture support only grew over releases) and gets
"unknown" for the rest; a version that is not known (vLLM is not installed here and none
was given) is judged with the newest table, and the note says so.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Literal

from eagle3lab.engines.versions import version_tuple
from eagle3lab.preflight.gen_capture_table import TABLE_DIR

Status = Literal["yes", "no", "unknown"]


@functools.lru_cache(maxsize=None)
def load_table(name: str) -> dict[str, Any]:
    """A committed table by file stem (e.g. 'sglang-0.5.23', 'vllm')."""
    return json.loads((TABLE_DIR / f"{name}.json").read_text(encoding="utf-8"))


def generated_versions(engine: str) -> list[str]:
    """Versions with a generated table of `engine`, oldest first."""
    names = [p.stem.split("-", 1)[1] for p in TABLE_DIR.glob(f"{engine}-*.json")]
    return sorted((n for n in names if n[:1].isdigit()), key=version_tuple)


#: The engines' names in notes, and what a class missing from a table means there.
_TITLE = {"sglang": "SGLang", "vllm": "vLLM"}
_NOT_LISTED = {
    "sglang": "the architecture is not an EntryClass there (SGLang would not load it "
              "natively)",
    "vllm": "the architecture is not in its model registry (vllm/model_executor/models/"
            "registry.py); vLLM would try its Transformers backend for it, if at all",
}


@dataclasses.dataclass(frozen=True)
class CaptureVerdict:
    engine: str
    version: str
    architecture: str | None
    status: Status
    table: str  # which table answered
    entry: dict[str, Any] | None
    note: str  # how the answer was reached (fallbacks said plainly)
    absent_behaviour: str  # what the engine does without capture

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def capture_verdict(*, engine: str, version: str | None,
                    architecture: str | None) -> CaptureVerdict:
    """The capture-support answer for `architecture` (the target's architectures[0])."""
    if engine == "reference":
        return CaptureVerdict(engine, "eagle3lab", architecture, "yes", "reference", None,
                              "the reference server captures by forward hooks on any "
                              "transformers decoder (eagle3lab/targets/adapter.py)", "")
    return _versioned_verdict(engine, version, architecture)


def _known(version: str | None) -> bool:
    return bool(version) and version != "unknown" and version[:1].isdigit()


def _versioned_verdict(engine: str, version: str | None, arch: str | None) -> CaptureVerdict:
    versions = generated_versions(engine)
    title = _TITLE[engine]
    known = _known(version)
    v = version if known else versions[-1]
    shown = v if known else f"{v} (assumed: the {title} version is not known here)"
    older = [x for x in versions if version_tuple(x) <= version_tuple(v)]
    if older:  # a generated table for this version or the newest one before it
        name = f"{engine}-{older[-1]}"
        t = load_table(name)
        entry = t["architectures"].get(arch or "")
        note = f"generated from {title} {older[-1]}'s source" + (
            "" if older[-1] == v else f" (no table for {v}; the newest older one)") + (
            "" if known else f"; {title}'s version is not known here (not installed, no "
            f"--engine-version): judged as {v}")
        if entry is None:
            return CaptureVerdict(engine, shown, arch, "unknown", name, None,
                                  f"{note}; {_NOT_LISTED[engine]}", t["absent_behaviour"])
        return CaptureVerdict(engine, shown, arch, "yes" if entry["capture"] else "no", name,
                              entry, note, t["absent_behaviour"])
    if engine == "sglang":
        rep = load_table("sglang-reported")
        entry = rep["architectures"].get(arch or "")
        if entry is not None:
            return CaptureVerdict("sglang", v, arch, "yes" if entry["capture"] else "no",
                                  "sglang-reported", entry, "a reported case of builds before "
                                  f"{versions[0]}", rep["absent_behaviour"])
        absent = rep["absent_behaviour"]
    else:
        absent = load_table(f"{engine}-{versions[0]}")["absent_behaviour"]
    first = load_table(f"{engine}-{versions[0]}")
    later = first["architectures"].get(arch or "")
    if later is not None and not later["capture"]:
        return CaptureVerdict(engine, v, arch, "no", f"{engine}-{versions[0]}", later,
                              f"{title} {versions[0]} has no capture for it, and capture "
                              f"support only grew over releases", absent)
    return CaptureVerdict(engine, v, arch, "unknown", f"{engine}-{versions[0]}", later,
                          f"{title} {versions[0]} " + ("captures from it" if later else
                                                       "does not list it") +
                          f"; this older build ({v}) was not read", absent)


def table_sizes() -> list[dict[str, Any]]:
    """Per table: engine, version, architectures with and without capture."""
    out = []
    for p in sorted(TABLE_DIR.glob("*.json")):
        t = load_table(p.stem)
        archs = t["architectures"].values()
        out.append({"table": p.stem, "engine": t["engine"], "version": t["version"],
                    "with_capture": sum(bool(e["capture"]) for e in archs),
                    "without_capture": sum(not e["capture"] for e in archs),
                    "complete": t.get("complete", True)})
    return out
