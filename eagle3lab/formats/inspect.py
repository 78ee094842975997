"""The checkpoint doctor: every train/serve mismatch, found before a GPU is started.

Prevents the hours lost to a drafter that validates at 74% accuracy and serves at accept
length 1.00: the engine dropped its decoder layer (`layers.0.*` under SGLang's midlayer
loader), captured other aux layers than training did, skipped fc on single-layer features,
ignored its input norm, or mapped draft ids through a broken d2t, all without an error.
`inspect_checkpoint` reads headers lazily, checks the checkpoint against the chosen
engine's profile (profiles.py) and, when given, the target's config, and returns a `Report`
whose findings carry stable codes (findings.CODES).
"""

from __future__ import annotations

import os
import time
from typing import Any

from eagle3lab.errors import UserError
from eagle3lab.formats import values
from eagle3lab.formats.detect import (DraftConfig, canonical_key, detect_format, key_layout, layer_index,
                     parse_draft_config)
from eagle3lab.formats.findings import Finding, Report, error, warning
from eagle3lab.formats.profiles import (DEFAULT_ENGINE, INPUT_NORM, EngineProfile, capture_range,
                                        drafter_profile, engine_key, get_profile)
from eagle3lab.formats.reader import Checkpoint
from eagle3lab.formats.schema import (draft_tensors, engine_capture, engine_param_keys,
                                      engine_required, engine_target_hidden, flag_read_by, num_aux)
from eagle3lab.formats.targetinfo import TargetInfo, target_info


def inspect_checkpoint(checkpoint: str | os.PathLike, *, target: str | os.PathLike | None = None,
                       engine: str | None = None, check_values: bool = True,
                       trained_capture: list[int] | None = None) -> Report:
    """Inspect a drafter checkpoint directory for `engine` (default: where its format is
    usually served: eagle3 -> sglang, speculators -> vllm). `target`: a directory with the
    target's config.json or a preset name; without it, target checks are skipped.
    `trained_capture`: the capture points training used, when the checkpoint does not record
    them (or to override its record). A trainer's output is located first
    (formats/locate.py: speculators' save_path -> its best epoch; SpecForge's step
    checkpoints are refused with the export command)."""
    from eagle3lab.formats.locate import locate_checkpoint

    t0 = time.perf_counter()
    path = locate_checkpoint(checkpoint)
    if not path.is_dir():
        raise UserError(f"Checkpoint {str(path)!r} does not exist or is not a directory.")
    tinfo: TargetInfo | None = target_info(target) if target is not None else None
    ck = Checkpoint(path)
    try:
        return _inspect(ck, tinfo, engine, check_values, t0, trained_capture)
    finally:
        ck.close()


def _inspect(ck: Checkpoint, tinfo: TargetInfo | None, engine: str | None, check_values: bool,
             t0: float, trained_capture: list[int] | None = None) -> Report:
    findings: list[Finding] = []
    skipped: list[dict[str, str]] = []
    for p in ck.problems:
        findings.append(error("unreadable", f"{p.file}: {p.message}.", found=p.file))
    keys = list(ck.tensors)
    fmt = detect_format(keys, ck.config)
    cfg = parse_draft_config(ck.config)
    cfg.trained_override = list(trained_capture) if trained_capture is not None else None
    profile = drafter_profile(get_profile(engine or DEFAULT_ENGINE[fmt]), cfg.architectures)
    if fmt == "unknown":
        findings.append(error("format-unknown", f"Neither layout recognised: keys "
                              f"{key_layout(keys)!r}, config layout {cfg.layout!r} "
                              f"(architectures {cfg.architectures})."))
    if ck.config is None:
        skipped.append({"check": "config checks", "reason": "config.json unreadable"})
    elif fmt != "unknown":
        findings += _structure(ck, cfg, profile, tinfo, skipped)
    if tinfo is None:
        skipped.append({"check": "target checks (hidden-size, aux-layer range, fc width vs "
                        "target, vocabulary, max-position)", "reason": "no --target given"})
    if check_values and fmt != "unknown":
        names = {canonical_key(k): k for k in keys if canonical_key(k) in ("d2t", "t2d")}
        if names:
            findings += values.vocab_map_findings(
                ck, names, draft_vocab=cfg.draft_vocab_size,
                target_vocab=tinfo.vocab_size if tinfo else cfg.vocab_size)
    if check_values:
        findings += values.nonfinite_findings(ck)
    else:
        skipped.append({"check": "nonfinite, vocab-map", "reason": "values not read"})
    findings += values.dtype_findings(ck, casts_float32=profile.casts_float32,
                                      engine=profile.name)
    tensors = [ck.tensors[k].to_dict() for k in sorted(ck.tensors, key=_tensor_order)]
    config = cfg.summary() if ck.config is not None else {}
    if ck.config is not None:
        config["aux"] = _aux_summary(profile, cfg, tinfo.num_layers if tinfo else None)
    return Report(checkpoint=str(ck.path), format=fmt, engine=profile.name, findings=findings,
                  tensors=tensors, skipped=skipped, config=config,
                  target=tinfo.to_dict() if tinfo else None, key_layout=key_layout(keys),
                  seconds=time.perf_counter() - t0)


def _tensor_order(name: str):
    i = layer_index(canonical_key(name))
    return (0 if i is None else 1, i or 0, name)


def _structure(ck: Checkpoint, cfg: DraftConfig, profile: EngineProfile,
               tinfo: TargetInfo | None, skipped: list[dict[str, str]]) -> list[Finding]:
    out: list[Finding] = []
    out += _layout_and_keys(ck, cfg, profile, tinfo)
    out += _architecture(cfg, profile)
    out += _shapes(ck, cfg, profile, tinfo)
    out += _hidden(cfg, profile, tinfo)
    out += _norm_variants(ck, cfg, profile)
    out += _aux_layers(profile, cfg, tinfo.num_layers if tinfo else None)
    if tinfo is not None:
        if cfg.vocab_size is not None and cfg.vocab_size != tinfo.vocab_size:
            out.append(error("vocab-map", f"The draft config's vocab_size {cfg.vocab_size} is "
                             f"not the target's {tinfo.vocab_size}.",
                             expected=tinfo.vocab_size, found=cfg.vocab_size))
        tm = tinfo.max_position_embeddings
        if cfg.max_position_embeddings is not None and tm and cfg.max_position_embeddings < tm:
            out.append(warning("max-position", f"Draft max_position_embeddings "
                               f"{cfg.max_position_embeddings} is below the target's {tm}.",
                               expected=tm, found=cfg.max_position_embeddings))
    if cfg.hidden_size is None:
        skipped.append({"check": "shape", "reason": "config has no hidden_size"})
    return out


def _layout_and_keys(ck: Checkpoint, cfg: DraftConfig, profile: EngineProfile,
                     tinfo: TargetInfo | None) -> list[Finding]:
    out: list[Finding] = []
    if cfg.layout != profile.config_layout and not (
            profile.name == "vllm" and cfg.layout == "speculators"):
        reads = "a flat LlamaConfig (hidden_size & co at the top level)" \
            if profile.config_layout == "flat" else "a speculators config"
        out.append(error("keys-layout", f"config.json has the {cfg.layout} layout but "
                         f"{profile.name} reads {reads}.", expected=profile.config_layout,
                         found=cfg.layout))
    params = engine_param_keys(profile, cfg)
    misplaced, unknown = [], []
    for k in ck.tensors:
        if engine_key(profile, k) in params:
            continue
        canon = canonical_key(k)
        if canon in (INPUT_NORM,) or canon.startswith("fc_norm."):
            continue  # reported by the norm checks
        if layer_index(canon) == 0 and not k.startswith(profile.layer_prefixes):
            misplaced.append(k)
        else:
            unknown.append(k)
    if misplaced:
        prefixes = sorted({k.split(".")[0] + ("." + k.split(".")[1] if k.startswith("layers.")
                                              else "") + "." for k in misplaced})
        out.append(error("keys-layout", f"{len(misplaced)} decoder-layer tensor(s) under "
                         f"{prefixes}, which {profile.name} does not load "
                         f"({profile.refusal_effect}); it loads "
                         f"{list(profile.layer_prefixes)}.", tensor=misplaced[0],
                         expected=list(profile.layer_prefixes), found=prefixes))
    if unknown:
        out.append(error("unknown-keys", f"{len(unknown)} tensor(s) {profile.name} has no "
                         f"parameter for ({profile.refusal_effect}): {_short(unknown)}.",
                         tensor=unknown[0], found=sorted(unknown)))
    n_layers = cfg.num_hidden_layers or 1
    if n_layers > 1 and not profile.multi_layer:
        out.append(error("keys-layout", f"The draft has {n_layers} decoder layers; "
                         f"{profile.name} loads one (check with --engine sglang-0.5.23).",
                         expected=1, found=n_layers))
    present = {canonical_key(k) for k in ck.tensors}
    drafted = draft_tensors(cfg, n_aux=num_aux(cfg, profile),
                            target_vocab=tinfo.vocab_size if tinfo else None)
    need = engine_required(profile, cfg, drafted, tinfo.vocab_size if tinfo else None)
    missing = sorted(k for k in need if k not in present)
    if missing:
        hint = (" Without d2t the draft ids are taken as target ids: a smaller draft "
                "vocabulary then proposes the wrong tokens (vLLM serves it at accept length "
                "~1.1)." if "d2t" in missing else "")
        out.append(error("missing-keys", f"{len(missing)} tensor(s) {profile.name} needs are "
                         f"absent: {_short(missing)}.{hint}", tensor=missing[0],
                         expected=missing))
    return out


def _architecture(cfg: DraftConfig, profile: EngineProfile) -> list[Finding]:
    if cfg.layout == "speculators":
        if profile.config_layout == "flat" and profile.name != "vllm":
            return [error("architecture", f"A speculators config (architectures "
                          f"{cfg.architectures}) cannot be served by {profile.name}, which "
                          f"picks its model class from architectures[0] and knows "
                          f"{list(profile.architectures)}.", expected=list(profile.architectures),
                          found=cfg.architectures)]
        if cfg.raw.get("speculators_model_type") != "eagle3":
            return [error("architecture", f"speculators_model_type is "
                          f"{cfg.raw.get('speculators_model_type')!r}, not 'eagle3'.",
                          expected="eagle3", found=cfg.raw.get("speculators_model_type"))]
        if profile.name == "vllm" and cfg.layer_model_type != "llama":
            return [warning("architecture", f"transformer_layer_config.model_type is "
                            f"{cfg.layer_model_type!r}; the vLLM adapter read maps every "
                            f"speculators EAGLE-3 config to Eagle3LlamaForCausalLM (Llama "
                            f"layers): check that your vLLM version has this layer type.",
                            expected="llama", found=cfg.layer_model_type)]
        if profile.name != "vllm" and cfg.layer_model_type not in profile.architectures:
            return [error("architecture", f"transformer_layer_config.model_type is "
                          f"{cfg.layer_model_type!r}; {profile.name} builds "
                          f"{list(profile.architectures)} draft layers.",
                          expected=list(profile.architectures), found=cfg.layer_model_type)]
        return []
    first = cfg.architectures[0] if cfg.architectures else None
    if profile.config_layout == "speculators":
        return [error("architecture", f"{profile.name} loads speculators configs "
                      f"(speculators_model_type 'eagle3'); this is a flat {first} config.",
                      expected="speculators_model_type: eagle3", found=first)]
    if first not in profile.architectures:
        return [error("architecture", f"architectures[0] is {first!r}; {profile.name} serves "
                      f"EAGLE-3 drafts as {list(profile.architectures)} (another name loads "
                      f"another model class, or none).", expected=list(profile.architectures),
                      found=cfg.architectures)]
    return []


def _shapes(ck: Checkpoint, cfg: DraftConfig, profile: EngineProfile,
            tinfo: TargetInfo | None) -> list[Finding]:
    out: list[Finding] = []
    n_aux = num_aux(cfg, profile)
    drafted = draft_tensors(cfg, n_aux=n_aux, target_vocab=tinfo.vocab_size if tinfo else None)
    for k, info in ck.tensors.items():
        canon = canonical_key(k)
        exp = drafted.get(canon)
        if exp is None or exp.shape is None or canon == "fc.weight":
            continue
        if tuple(info.shape) != exp.shape:
            out.append(error("shape", f"{k} is {list(info.shape)}; the config implies "
                             f"{list(exp.shape)} ({exp.why}).", tensor=k,
                             expected=list(exp.shape), found=list(info.shape)))
    fc = next((k for k in ck.tensors if canonical_key(k) == "fc.weight"), None)
    if fc is not None:
        shape = ck.tensors[fc].shape
        if len(shape) != 2:
            out.append(error("shape", f"fc.weight is {list(shape)}, not a matrix.", tensor=fc))
            return out
        if cfg.hidden_size is not None and shape[0] != cfg.hidden_size:
            out.append(error("shape", f"fc.weight has {shape[0]} outputs; hidden_size is "
                             f"{cfg.hidden_size}.", tensor=fc, expected=cfg.hidden_size,
                             found=shape[0]))
        per = tinfo.hidden_size if tinfo else engine_target_hidden(cfg)
        built = n_aux * engine_target_hidden(cfg) if engine_target_hidden(cfg) else None
        if per is not None and shape[1] != n_aux * per:
            hint = (" (1x: the draft was built for single-layer features; the engine then "
                    "skips fc whenever the feature width equals the draft's hidden size)"
                    if shape[1] == per else "")
            out.append(error("fc-dim", f"fc.weight takes {shape[1]} inputs; {profile.name} "
                             f"feeds {n_aux} aux states of width {per} = {n_aux * per}{hint}.",
                             tensor=fc, expected=n_aux * per, found=shape[1]))
        elif built is not None and shape[1] != built:
            out.append(error("fc-dim", f"fc.weight takes {shape[1]} inputs but {profile.name} "
                             f"builds fc for {built} from the config.", tensor=fc,
                             expected=built, found=shape[1]))
    return out


def _hidden(cfg: DraftConfig, profile: EngineProfile, tinfo: TargetInfo | None) -> list[Finding]:
    out: list[Finding] = []
    if profile.name.startswith("sglang") and cfg.layout == "flat" and \
            cfg.target_hidden_size_stated and cfg.target_hidden_size is None:
        out.append(error("hidden-size", "target_hidden_size is null: SGLang builds fc from it "
                         "(None x 3 fails) and never shares the target's embedding.",
                         found=None))
    if tinfo is None or cfg.hidden_size is None:
        return out
    Ht, H = tinfo.hidden_size, cfg.hidden_size
    if cfg.target_hidden_size is not None and cfg.target_hidden_size != Ht:
        out.append(error("hidden-size", f"target_hidden_size is {cfg.target_hidden_size} but "
                         f"the target's hidden size is {Ht}.", expected=Ht,
                         found=cfg.target_hidden_size))
    elif cfg.target_hidden_size is None and H != Ht:
        out.append(error("hidden-size", f"Draft hidden size {H} differs from the target's "
                         f"{Ht} and target_hidden_size is not set.", expected=Ht, found=H))
    return out


def _norm_variants(ck: Checkpoint, cfg: DraftConfig, profile: EngineProfile) -> list[Finding]:
    out: list[Finding] = []
    present = {canonical_key(k) for k in ck.tensors}
    checks = (("norm_before_fc", profile.input_norm, INPUT_NORM in present, "norm-before-fc"),
              ("fc_norm", profile.fc_norm, any(k.startswith("fc_norm.") for k in present),
               "norm-before-fc"),
              ("norm_before_residual", profile.norm_before_residual, False, "norm-variant"),
              ("norm_output", profile.norm_output, False, "norm-variant"))
    for flag, support, has_weights, code in checks:
        needed = cfg.flags.get(flag, False) or has_weights
        if not needed:
            continue
        what = f"{flag}" + (" (with its weights)" if has_weights else "")
        if support == "never":
            out.append(error(code, f"The draft was trained with {what}, which {profile.name} "
                             f"does not implement: it serves the draft without it, silently. "
                             f"Options: retrain with {flag}=False; serve the speculators "
                             f"format with vLLM; or, for SGLang, convert with "
                             f"--engine sglang-0.5.23 if that release applies it.",
                             found=flag))
        elif support == "unverified":
            out.append(warning(code, f"The draft uses {flag}; whether {profile.name} applies it "
                               f"depends on its version (not verified here).", found=flag))
        elif not flag_read_by(profile, cfg, flag):
            out.append(error(code, f"The checkpoint has {flag} weights but its config does not "
                             f"set {flag} where {profile.name} reads it, so they are dropped.",
                             found=flag))
    return out


def _aux_layers(profile: EngineProfile, cfg: DraftConfig,
                num_layers: int | None) -> list[Finding]:
    """The aux layer ids the engine reads (where, in which convention) against what
    training used: the two conventions, ids the engine ignores, defaults by coincidence."""
    out: list[Finding] = []
    where = ".".join(profile.aux_ids_path)
    for place, ids in cfg.aux_ids.items():
        if ids == []:
            out.append(error("aux-layers", f"{place} eagle_aux_hidden_state_layer_ids is "
                             f"present but not a non-empty list of integers.", found=place))
        elif ids and len(set(ids)) != len(ids):
            out.append(error("aux-layers", f"Aux layer ids {ids} ({place}) repeat a layer.",
                             found=ids))
    recorded, rec_src = cfg.training_capture()
    read_ids = cfg.aux_ids.get(profile.aux_place) or None
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
    others = {p: ids for p, ids in cfg.aux_ids.items() if ids and p != profile.aux_place}
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


def _aux_summary(profile: EngineProfile, cfg: DraftConfig,
                 num_layers: int | None) -> dict[str, Any]:
    capture, is_default = engine_capture(profile, cfg, num_layers)
    recorded, src = cfg.training_capture()
    return {"engine_reads": ".".join(profile.aux_ids_path), "convention": profile.aux_convention,
            "engine_capture_points": capture, "engine_default": is_default,
            "training_capture_points": recorded, "training_source": src}


def _short(names: list[str], n: int = 6) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
