"""Aux layer ids: where each engine reads them, what they mean there, what training used.

Prevents the classic silent failure: the same explicit id list means different target
layers in SGLang (capture = id + 1) and vLLM/speculators (capture = id), and SGLang reads
ids only from `eagle_config.eagle_aux_hidden_state_layer_ids`, so ids that speculators wrote
at the top level are ignored and the engine quietly captures its defaults. Everything is
compared as capture points (capture p = the input of target layer p = HF hidden_states[p]),
the convention eagle3lab.target.adapter uses.
"""

from __future__ import annotations

from typing import Any

from eagle3lab.formats.detect import DraftConfig
from eagle3lab.formats.findings import Finding, error, warning
from eagle3lab.formats.profiles import (EngineProfile, capture_range, default_capture_points,
                       ids_to_capture)

#: Where ids can sit, and the convention an id found there is written in.
PLACES = {"eagle_config": "sglang", "top-level": "vllm"}


def place_of(profile: EngineProfile) -> str:
    return "eagle_config" if profile.aux_ids_path[0] == "eagle_config" else "top-level"


def recorded_capture(cfg: DraftConfig) -> tuple[list[int] | None, str | None]:
    """What training used, as capture points, and where that came from (None: unknown).

    Our provenance block wins; otherwise the ids of the config's own format, read in the
    convention of that format's engine (speculators: vLLM's; flat EAGLE-3 configs: SGLang's).
    """
    rec = cfg.recorded_capture_points()
    if rec is not None:
        return rec, "eagle3lab record"
    own = "top-level" if cfg.layout == "speculators" else "eagle_config"
    ids = cfg.aux_ids.get(own)
    if ids:
        return ids_to_capture(ids, PLACES[own]), f"{own} ids ({PLACES[own]} convention)"
    return None, None


def engine_capture(profile: EngineProfile, cfg: DraftConfig,
                   num_layers: int | None) -> tuple[list[int] | None, bool]:
    """Capture points the engine will use and whether they are its defaults."""
    ids = cfg.aux_ids.get(place_of(profile))
    if ids:
        return ids_to_capture(ids, profile.aux_convention), False
    return (default_capture_points(num_layers) if num_layers else None), True


def aux_findings(profile: EngineProfile, cfg: DraftConfig,
                 num_layers: int | None) -> list[Finding]:
    out: list[Finding] = []
    where = ".".join(profile.aux_ids_path)
    for place, ids in cfg.aux_ids.items():
        if ids == []:
            out.append(error("aux-layers", f"{place} eagle_aux_hidden_state_layer_ids is "
                             f"present but not a non-empty list of integers.", found=place))
        elif ids and len(set(ids)) != len(ids):
            out.append(error("aux-layers", f"Aux layer ids {ids} ({place}) repeat a layer.",
                             found=ids))
    recorded, rec_src = recorded_capture(cfg)
    read_ids = cfg.aux_ids.get(place_of(profile)) or None
    capture, is_default = engine_capture(profile, cfg, num_layers)
    if read_ids and num_layers:
        lo, hi = capture_range(profile, num_layers)
        bad = [i for i, p in zip(read_ids, capture) if not lo <= p <= hi]
        if bad:
            out.append(error(
                "aux-layers", f"Aux layer ids {read_ids} ({where}, {profile.aux_convention} "
                f"convention) give capture points {capture}; a {num_layers}-layer target "
                f"only has {lo}..{hi}. Out of range: {bad}.",
                expected=[lo, hi], found=read_ids))
    others = {p: ids for p, ids in cfg.aux_ids.items() if ids and p != place_of(profile)}
    if not read_ids and others:
        placed = "; ".join(f"{p}: {ids}" for p, ids in others.items())
        base = (f"Aux layer ids are only where {profile.name} does not read them ({placed}); "
                f"it reads {where} and falls back to its default capture points")
        if capture is None:
            out.append(error("aux-layers", base + "; without --target it cannot be shown "
                             "that those equal what training used.", found=others))
        elif recorded is not None and recorded != capture:
            out.append(error("aux-layers", base + f" {capture}, but training used {recorded} "
                             f"({rec_src}).", expected=recorded, found=capture))
        else:
            out.append(warning("aux-layers", base + f" {capture}, which equal what training "
                               f"used ({rec_src}) only by coincidence; write them to {where}.",
                               expected=recorded, found=capture))
    elif not read_ids and recorded is None:
        shown = f" {capture}" if capture else ""
        out.append(warning("aux-layers", f"No aux layer ids anywhere: {profile.name} uses its "
                           f"default capture points{shown}, and nothing records what "
                           f"training used.", found=None))
    elif read_ids and recorded is not None and capture != recorded:
        out.append(error(
            "aux-layers", f"{profile.name} reads {read_ids} from {where} in the "
            f"{profile.aux_convention} convention, i.e. capture points {capture}, but training "
            f"used {recorded} ({rec_src}). Ids were copied between conventions without the "
            f"+1/-1 shift.", expected=recorded, found=capture))
    elif not read_ids and recorded is not None and capture is not None and capture != recorded:
        out.append(error("aux-layers", f"No ids where {profile.name} reads them ({where}): it "
                         f"captures its defaults {capture}, but training used {recorded} "
                         f"({rec_src}).", expected=recorded, found=capture))
    return out


def describe(profile: EngineProfile, cfg: DraftConfig, num_layers: int | None) -> dict[str, Any]:
    capture, is_default = engine_capture(profile, cfg, num_layers)
    recorded, src = recorded_capture(cfg)
    return {"engine_reads": ".".join(profile.aux_ids_path), "convention": profile.aux_convention,
            "engine_capture_points": capture, "engine_default": is_default,
            "training_capture_points": recorded, "training_source": src}
