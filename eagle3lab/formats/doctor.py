"""The checkpoint doctor: every train/serve mismatch, found before a GPU is started.

Prevents the hours lost to a drafter that validates at 74% accuracy and serves at accept
length 1.00: the engine dropped its decoder layer (`layers.0.*` under SGLang's midlayer
loader), captured other aux layers than training did, skipped fc on single-layer features,
ignored its input norm, or mapped draft ids through a broken d2t, all without an error.
`inspect_checkpoint` reads headers lazily, checks the checkpoint against the chosen
engine's profile (profiles.py) and, when given, the target's config, and returns a `Report`
whose findings carry stable codes (findings.CODES). `serving_engines` answers, from the
same checks, which engines serve a drafter as trained (as it is, or after `eagle3lab
convert`): the one answer the study's tables and `train`'s warning give.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any, Iterable

from eagle3lab.errors import UserError
from eagle3lab.formats import values
from eagle3lab.formats.detect import (DraftConfig, canonical_key, detect_format, key_layout,
                                      layer_index, parse_draft_config)
from eagle3lab.formats.findings import Finding, Report, error, info, warning
from eagle3lab.formats.opened import drafter_from
from eagle3lab.formats.profiles import (DEFAULT_ENGINE, INPUT_NORM, SGLANG, SGLANG_0523,
                                        EngineProfile, capture_range, drafter_profile,
                                        engine_key, get_profile)
from eagle3lab.formats.reader import Checkpoint
from eagle3lab.formats.schema import (applies, draft_tensors, engine_capture, engine_ids,
                                      engine_param_keys, engine_required, engine_target_hidden,
                                      flag_read_by, num_aux, vllm_uses_aux)
from eagle3lab.formats.targetinfo import TargetInfo, target_info

if TYPE_CHECKING:
    from eagle3lab.formats.opened import OpenedDrafter


def inspect_checkpoint(checkpoint: str | os.PathLike | OpenedDrafter, *,
                       target: str | os.PathLike | None = None,
                       engine: str | None = None, check_values: bool = True,
                       trained_capture: list[int] | None = None,
                       vllm_runner: str | None = None) -> Report:
    """Inspect a drafter checkpoint directory for `engine` (default: where its format is
    usually served: eagle3 -> sglang, speculators -> vllm). `target`: a directory with the
    target's config.json or a preset name; without it, target checks are skipped.
    `trained_capture`: the capture points training used, when the checkpoint does not record
    them (or to override its record). `vllm_runner`: "v1" when vLLM 0.25.1 will run its V1
    model runner (which also reads eagle_config's aux ids); default: the V2 runner, its
    default for non-MoE targets. The training record beside the checkpoint (eagle3lab.json)
    is read with its config. A trainer's output is located first (formats/locate.py:
    speculators' save_path -> its best epoch; SpecForge's step checkpoints are refused with
    the export command). `checkpoint` may be an `OpenedDrafter` (formats/opened.py): its
    headers are not read again, and the report is kept on it."""
    key = ("doctor", None if target is None else str(target), engine, check_values,
           None if trained_capture is None else tuple(trained_capture), vllm_runner)
    with drafter_from(checkpoint) as drafter:
        return drafter.kept(key, lambda: inspect_opened(
            drafter, target=target, engine=engine, check_values=check_values,
            trained_capture=trained_capture, vllm_runner=vllm_runner))


def inspect_opened(drafter: OpenedDrafter, *, target: str | os.PathLike | None,
                   engine: str | None, check_values: bool,
                   trained_capture: list[int] | None, vllm_runner: str | None) -> Report:
    """The doctor's report on an opened drafter (`inspect_checkpoint` keeps it on the drafter)."""
    t0 = time.perf_counter()
    path = drafter.path
    if not path.is_dir():
        raise UserError(f"Checkpoint {str(path)!r} does not exist or is not a directory.")
    tinfo: TargetInfo | None = target_info(target) if target is not None else None
    cfg = dataclasses.replace(drafter.parsed_config, trained_override=list(trained_capture)
                              if trained_capture is not None else None)
    return _inspect(drafter.checkpoint, tinfo, engine, check_values, t0, cfg, vllm_runner)


def _inspect(ck: Checkpoint, tinfo: TargetInfo | None, engine: str | None, check_values: bool,
             t0: float, cfg: DraftConfig, vllm_runner: str | None = None) -> Report:
    findings: list[Finding] = []
    skipped: list[dict[str, str]] = []
    for p in ck.problems:
        findings.append(error("unreadable", f"{p.file}: {p.message}.", found=p.file))
    keys = list(ck.tensors)
    fmt = detect_format(keys, ck.config)
    profile = drafter_profile(get_profile(engine or DEFAULT_ENGINE[fmt]), cfg.architectures,
                              vllm_runner=vllm_runner)
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


#: The speculators layer types vLLM 0.25.1 serves EAGLE-3 drafts with (algos.py
#: update_eagle3: Eagle3LlamaForCausalLM, Eagle3Qwen3ForCausalLM).
VLLM_LAYERS = ("llama", "qwen3")

#: What an engine does with a small draft vocabulary and no d2t (the missing-keys hint).
_D2T_HINT = {
    "sglang": " Without d2t the draft ids are taken as target ids: a smaller draft "
              "vocabulary then proposes the wrong tokens.",
    "vllm": " vLLM 0.25.1 then keeps draft_id_to_target_id at zeros "
            "(model_executor/models/llama_eagle3.py:304-307, :419-420) and maps draft id i "
            "to target id i (compute_logits, :347-357): every drafted token is the wrong one, "
            "silently (accept length ~1.0).",
}


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
    out += _norm_variants({canonical_key(k) for k in ck.tensors}, cfg, profile)
    out += _aux_layers(profile, cfg, tinfo.num_layers if tinfo else None)
    if profile.name == "vllm":
        out += _vllm_aux_input(cfg, profile)
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
    biases = [k for k in unknown if profile.name == "vllm" and k.endswith(".bias")]
    unknown = [k for k in unknown if k not in biases]
    if unknown:
        out.append(error("unknown-keys", f"{len(unknown)} tensor(s) {profile.name} has no "
                         f"parameter for ({profile.refusal_effect}): {_short(unknown)}.",
                         tensor=unknown[0], found=sorted(unknown)))
    if biases:
        out.append(warning("unknown-keys", f"{len(biases)} bias tensor(s) vLLM 0.25.1 has no "
                           f"parameter for: {_short(biases)}. Its loader ignores an "
                           f"unexpected '.bias' (AutoWeightsLoader.load_weights, "
                           f"model_executor/models/utils.py), so they are dropped silently; "
                           f"set attention_bias in the config if the draft was trained with "
                           f"them.", tensor=biases[0], found=sorted(biases)))
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
        hint = _D2T_HINT.get(profile.name, _D2T_HINT["sglang"]) if "d2t" in missing else ""
        if profile.name == "vllm" and [k for k in missing if k != "d2t"]:
            hint += (" vLLM 0.25.1's EAGLE-3 loader returns no loaded names, so its "
                     "'weights were not initialized' check does not run "
                     "(model_executor/model_loader/default_loader.py track_weights_loading): "
                     "an absent tensor is served uninitialised, without an error.")
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
        if profile.name == "vllm" and (cfg.layer_model_type or "llama") not in VLLM_LAYERS:
            return [error("architecture", f"transformer_layer_config.model_type is "
                          f"{cfg.layer_model_type!r}; vLLM 0.25.1 maps a speculators EAGLE-3 "
                          f"config to {VLLM_LAYERS} only and raises ValueError('Unsupported "
                          f"model_type ... for Eagle3 speculator') for any other "
                          f"(transformers_utils/configs/speculators/algos.py update_eagle3): "
                          f"the server does not start.", expected=list(VLLM_LAYERS),
                          found=cfg.layer_model_type)]
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
    if profile.name == "vllm" and not vllm_uses_aux(cfg):
        fc = None  # no fc is built; `fc.` keys are skipped (llama_eagle3.py:175, :423-424)
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
            if profile.name == "vllm":
                hint = (f": vLLM 0.25.1 builds fc for {n_aux} x {per} (llama_eagle3.py:175-187"
                        f": num_aux_hidden_states, else eagle_config's id count, else 3) and "
                        f"its weight loader refuses a {list(shape)} weight (ReplicatedLinear."
                        f"weight_loader asserts the size, model_executor/layers/linear.py:369)"
                        f": the server does not start"
                        + (". A drafter trained on one layer's features is served by vLLM "
                           "only as a flat config with eagle_config.use_aux_hidden_state: "
                           "false (and its V1 model runner)" if shape[1] == per else ""))
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


#: Why an SGLang profile serves a norm variant without it (the sources profiles.py cites).
_SGLANG_LACKS = {
    "sglang": "the SGLang releases with the midlayer loader have no such module or flag "
              "(e.g. commit 03d5a77 of srt/models/llama_eagle3.py)",
    "norm_before_residual": "no SGLang release keeps the normed hidden state as the first "
                            "layer's residual (0.5.23: srt/models/llama_eagle3.py:99-100, "
                            "residual = hidden_states before hidden_norm)",
}


def _norm_variants(present: set[str], cfg: DraftConfig, profile: EngineProfile) -> list[Finding]:
    """The norm variants training used (config flags, and their weights among `present`,
    canonical names) against what the engine applies."""
    out: list[Finding] = []
    checks = (("norm_before_fc", profile.input_norm, INPUT_NORM in present, "norm-before-fc"),
              ("fc_norm", profile.fc_norm, any(k.startswith("fc_norm.") for k in present),
               "norm-before-fc"),
              ("norm_before_residual", profile.norm_before_residual, False, "norm-variant"),
              ("norm_output", profile.norm_output, False, "norm-variant"))
    for flag, support, has_weights, code in checks:
        if profile.name == "vllm":
            out += _vllm_norm_flag(cfg, profile, flag, code, has_weights)
            continue
        needed = cfg.flags.get(flag, False) or has_weights
        if not needed:
            continue
        what = f"{flag}" + (" (with its weights)" if has_weights else "")
        if support == "never":
            why = _SGLANG_LACKS.get(flag if flag == "norm_before_residual" else profile.name)
            newer = (profile.name == SGLANG.name
                     and getattr(SGLANG_0523, _SUPPORT_FIELD[flag]) != "never")
            out.append(error(code, f"The draft was trained with {what}, which {profile.name} "
                             f"does not implement" + (f" ({why})" if why else "")
                             + f": it serves the draft without it, silently (acceptance "
                             f"drops, no error). Options: serve the speculators format with "
                             f"vLLM 0.25.1, which applies it; retrain with {flag}=False"
                             + ("; or serve with SGLang 0.5.23, which applies it (convert "
                                "with --engine sglang-0.5.23)" if newer else "") + ".",
                             found=flag))
        elif support == "unverified":
            out.append(warning(code, f"The draft uses {flag}; whether {profile.name} applies it "
                               f"depends on its version (not verified here).", found=flag))
        elif not flag_read_by(profile, cfg, flag):
            out.append(error(code, f"The checkpoint has {flag} weights but its config does not "
                             f"set {flag} where {profile.name} reads it, so they are dropped.",
                             found=flag))
    return out


#: The EngineProfile field that says whether an engine applies each norm flag.
_SUPPORT_FIELD = {"norm_before_fc": "input_norm", "fc_norm": "fc_norm",
                  "norm_before_residual": "norm_before_residual", "norm_output": "norm_output"}

#: Where vLLM 0.25.1 reads each norm flag (vllm/model_executor/models/llama_eagle3.py) and
#: the speculators adapter's default for an absent key (transformers_utils/configs/
#: speculators/algos.py update_eagle3). norm_output: the post-norm state is the second
#: output (:249-254), the one both model runners feed to the next draft step
#: (v1/worker/gpu/spec_decode/autoregressive/speculator.py:326, v1/spec_decode/
#: llm_base_proposer.py:595), as speculators' forward feeds it (models/eagle3/core.py:302).
_VLLM_FLAG_SOURCE = {
    "norm_before_fc": "llama_eagle3.py:150-154, eagle_config first; algos.py:38 default False",
    "fc_norm": "llama_eagle3.py:197; algos.py:39 default False",
    "norm_before_residual": "llama_eagle3.py:69-72; algos.py:35-37 default TRUE when absent",
    "norm_output": "llama_eagle3.py:218, :252; algos.py:40 default False",
}


def _vllm_norm_flag(cfg: DraftConfig, profile: EngineProfile, flag: str, code: str,
                    has_weights: bool) -> list[Finding]:
    """vLLM 0.25.1 implements all four norm variants; what can go wrong is that it reads
    another value than training used (an absent norm_before_residual is True in its
    speculators adapter but False in speculators' own loader), or weights of a variant its
    config does not switch on (input_norm: skipped silently; fc_norm: no such parameter,
    the load raises)."""
    served = applies(profile, cfg, flag)
    trained, where, certain = cfg.trained_flag(flag)
    src = _VLLM_FLAG_SOURCE[flag]
    if has_weights and not served:
        effect = ("vLLM skips input_norm. weights when norm_before_fc is off "
                  "(llama_eagle3.py:425-426): the draft is served without its input norm"
                  if flag == "norm_before_fc" else
                  f"vLLM builds no fc_norm then, so its weights have no parameter and "
                  f"{profile.refusal_effect}")
        return [error(code, f"The checkpoint has {flag} weights but vLLM 0.25.1 reads "
                      f"{flag}=False from this config ({src}): {effect}.", found=flag)]
    if served == trained:
        return []
    msg = f"vLLM 0.25.1 serves this draft with {flag}={served} ({src})"
    if certain:
        return [error(code, msg + f", but training used {flag}={trained} ({where}): every "
                      f"draft forward differs from the trained one, silently (accept length "
                      f"drops, no error). Write {flag}: {str(trained).lower()} into "
                      f"config.json.", expected=trained, found=served)]
    return [warning(code, msg + f", but the key is absent from config.json and nothing "
                    f"records what training used: speculators 0.9.0's own loader (and "
                    f"eagle3lab's) reads {trained} (models/eagle3/config.py "
                    f"Eagle3SpeculatorConfig), vLLM {served}. Write the trained value into "
                    f"config.json.", expected=trained, found=served)]


def _aux_layers(profile: EngineProfile, cfg: DraftConfig,
                num_layers: int | None) -> list[Finding]:
    """The aux layer ids the engine reads (where, in which convention) against what
    training used: the two conventions, ids the engine ignores, defaults by coincidence."""
    out: list[Finding] = []
    for place, ids in cfg.aux_ids.items():
        if ids == []:
            out.append(error("aux-layers", f"{place} eagle_aux_hidden_state_layer_ids is "
                             f"present but not a non-empty list of integers.", found=place))
        elif ids and len(set(ids)) != len(ids):
            out.append(error("aux-layers", f"Aux layer ids {ids} ({place}) repeat a layer.",
                             found=ids))
    if profile.name == "vllm" and not vllm_uses_aux(cfg):
        return out  # no aux states feed this drafter (_vllm_aux_input says what does)
    recorded, rec_src = cfg.training_capture()
    read_ids, read_place = engine_ids(profile, cfg)
    where = _place_path(read_place)
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
    others = {p: ids for p, ids in cfg.aux_ids.items() if ids and p != read_place}
    if not read_ids and others:
        placed = "; ".join(f"{p}: {ids}" for p, ids in others.items())
        v1, v1_wrong = _vllm_v1_reading(profile, others, recorded)
        base = (f"Aux layer ids are only where {profile.name} does not read them ({placed}); "
                f"it reads {where} and falls back to its default capture points")
        if capture is None:
            out.append(error("aux-layers", base + "; without --target it cannot be shown "
                             f"that those equal what training used{v1}.", found=others))
        elif recorded is not None and recorded != capture:
            out.append(error("aux-layers", base + f" {capture}, but training used {recorded} "
                             f"({rec_src}){v1}.", expected=recorded, found=capture))
        else:
            out.append(warning("aux-layers", base + f" {capture}, which equal what training "
                               f"used ({rec_src}) only by coincidence{v1}; write them to "
                               f"{where}.", expected=recorded, found=capture))
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
            f"+1/-1 shift" + (" (vLLM 0.25.1 does not shift explicit ids: id k captures the "
                              "input of decoder layer k, model_executor/models/llama.py "
                              "LlamaModel.forward)" if profile.name == "vllm" else "") + ".",
            expected=recorded, found=capture))
    elif not read_ids and recorded is not None and capture is not None and capture != recorded:
        out.append(error("aux-layers", f"No ids where {profile.name} reads them ({where}): it "
                         f"captures its defaults {capture}, but training used {recorded} "
                         f"({rec_src}).", expected=recorded, found=capture))
    if profile.fc_num_aux == "vllm" and vllm_uses_aux(cfg):
        n_fc, n_cap = num_aux(cfg, profile), len(read_ids) if read_ids else 3
        if n_fc != n_cap:
            out.append(error("aux-layers", f"vLLM 0.25.1 captures {n_cap} aux state(s) "
                             f"({where if read_ids else 'its 3 defaults'}) but builds fc for "
                             f"{n_fc} (num_aux_hidden_states, else the count of eagle_config's "
                             f"ids, else 3: llama_eagle3.py:175-187; the top-level ids are not "
                             f"counted): their concatenation does not fit fc and the first "
                             f"draft forward fails.", expected=n_fc, found=n_cap))
    return out


def _place_path(place: str) -> str:
    return ("eagle_config." if place == "eagle_config" else "") + \
        "eagle_aux_hidden_state_layer_ids"


def _vllm_v1_reading(profile: EngineProfile, others: dict[str, list[int]],
                     recorded: list[int] | None) -> tuple[str, bool]:
    """The clause about vLLM's V1 model runner, which reads eagle_config's ids (unshifted)
    where the V2 runner judged here does not; and whether those differ from training."""
    ids = others.get("eagle_config")
    if profile.name != "vllm" or profile.aux_ids_fallback or not ids:
        return "", False
    v1 = [int(i) for i in ids]
    wrong = recorded is not None and v1 != recorded
    return (f" (this is vLLM 0.25.1's V2 model runner, its default for non-MoE targets: "
            f"v1/worker/gpu/spec_decode/eagle/eagle3_utils.py; its V1 runner "
            f"(VLLM_USE_V2_MODEL_RUNNER=0, MoE targets, pipeline parallelism) reads eagle_config's "
            f"ids unshifted, capture points {v1}" + (", which is NOT what training used"
                                                    if wrong else "") + ")"), wrong


def _vllm_aux_input(cfg: DraftConfig, profile: EngineProfile) -> list[Finding]:
    """What vLLM 0.25.1 feeds a drafter that reads one layer's state (EAGLE-1/2 style,
    `eagle_config.use_aux_hidden_state: false`), and such a switch where vLLM never reads
    it."""
    out: list[Finding] = []
    if not vllm_uses_aux(cfg):
        if profile.aux_ids_fallback:  # the V1 runner
            out.append(info("fc-dim", "eagle_config.use_aux_hidden_state is false: vLLM "
                            "0.25.1's V1 model runner captures no aux states and feeds the "
                            "drafter the target's final (normed) hidden state "
                            "(v1/worker/gpu_model_runner.py:625-628); no fc is built "
                            "(llama_eagle3.py:175) and fc. weights are skipped (:423-424)."))
        else:
            out.append(error("fc-dim", "eagle_config.use_aux_hidden_state is false (a drafter "
                             "that reads the target's last hidden state, no fc). vLLM 0.25.1's "
                             "V2 model runner, its default for non-MoE targets, captures aux "
                             "states for every eagle3 launch (v1/worker/gpu/model_runner.py:"
                             "196-198) and copies their concatenation, 3 x hidden wide, into "
                             "the drafter's hidden-wide input buffer (v1/worker/gpu/"
                             "spec_decode/autoregressive/speculator.py:168-173), which its "
                             "start-up dummy run already does: the server does not start. "
                             "Serve it with VLLM_USE_V2_MODEL_RUNNER=0 (the V1 runner feeds it "
                             "the final normed hidden state).", expected=True, found=False))
    eagle = cfg.raw.get("eagle_config") if isinstance(cfg.raw.get("eagle_config"), dict) else {}
    ignored = [w for w, d in (("the top level", cfg.raw),
                              ("eagle_config of a speculators config",
                               eagle if cfg.layout == "speculators" else {}))
               if d.get("use_aux_hidden_state") is False]
    if ignored:
        out.append(warning("fc-dim", f"use_aux_hidden_state: false at {ignored[0]}, where vLLM "
                           f"0.25.1 does not read it (only a flat config's eagle_config: "
                           f"llama_eagle3.py:145-149; the speculators adapter passes no "
                           f"eagle_config on, algos.py update_eagle3): it builds fc and feeds "
                           f"the drafter aux states.", found=ignored[0]))
    return out


def _aux_summary(profile: EngineProfile, cfg: DraftConfig,
                 num_layers: int | None) -> dict[str, Any]:
    capture, is_default = engine_capture(profile, cfg, num_layers)
    recorded, src = cfg.training_capture()
    reads = ".".join(profile.aux_ids_path) + "".join(
        f", else {_place_path(p)}" for p in profile.aux_ids_fallback)
    return {"engine_reads": reads, "convention": profile.aux_convention,
            "engine_capture_points": capture, "engine_default": is_default,
            "training_capture_points": recorded, "training_source": src}


def _short(names: list[str], n: int = 6) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


# -- which engines serve a drafter ------------------------------------------------------

#: The engines `serving_engines` judges, in this order: vLLM 0.25.1, every SGLang release
#: seen (the portable profile) and SGLang 0.5.23 (the project's pin).
SERVING_ENGINES = ("vllm", "sglang", "sglang-0.5.23")

#: Finding codes about the drafter itself, which `eagle3lab convert` carries over to the
#: other format unchanged (the layout codes, keys-layout, architecture and aux-layers, are
#: what it rewrites).
_CARRIED = ("unreadable", "nonfinite", "vocab-map", "shape", "fc-dim", "hidden-size",
            "missing-keys", "norm-before-fc", "norm-variant")


@dataclasses.dataclass(frozen=True)
class Serving:
    """Whether one engine serves a drafter as it was trained. `via`: "as is", or the
    `eagle3lab convert` command that brings it to the engine's format; `findings`: the
    errors that stop it (none: it serves)."""

    engine: str
    via: str
    findings: tuple[Finding, ...] = ()

    @property
    def serves(self) -> bool:
        return not self.findings

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def reason(self) -> str:
        if self.serves:
            return f"{self.engine} serves it {self.via}"
        f = self.findings[0]
        return f"{self.engine} does not serve it: [{f.code}] {f.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "serves": self.serves, "via": self.via,
                "codes": self.codes, "reason": self.reason()}


def serving_engines(drafter: str | os.PathLike | OpenedDrafter, *,
                    target: str | os.PathLike | None = None,
                    engines: Iterable[str] = SERVING_ENGINES,
                    check_values: bool = True) -> dict[str, Serving]:
    """Which engines serve `drafter` as trained (engine -> `Serving`). A drafter in the
    engine's own format (speculators' for vLLM, the flat EAGLE-3 one for SGLang), or one it
    reads without a finding, is judged by the doctor's whole report for that engine (every
    error stops it). Any other reaches the engine through `eagle3lab convert`, which
    rewrites the layout (names, config layout, where and in which convention the aux ids
    are) and refuses what no layout change fixes: the engine is then judged by the
    findings that survive conversion (`_CARRIED`: the norm variants it does not implement,
    NaN, a broken vocab map, shapes) and by the converter's one decoder layer; convert
    refuses such a drafter with the same code (tests/train/test_recipe.py)."""
    out: dict[str, Serving] = {}
    with drafter_from(drafter) as opened:
        cfg = opened.parsed_config
        for engine in engines:
            profile = get_profile(engine)
            report = inspect_checkpoint(opened, target=target, engine=engine,
                                        check_values=check_values)
            if cfg.layout == _own_layout(profile) or (report.ok and
                                                      _reads_layout(profile, cfg)):
                out[engine] = Serving(engine, "as is", tuple(report.errors()))
                continue
            stops = [f for f in report.errors() if f.code in _CARRIED]
            if (cfg.num_hidden_layers or 1) > 1:
                stops.append(error("keys-layout", f"The draft has {cfg.num_hidden_layers} "
                                   f"decoder layers; eagle3lab convert exports one.",
                                   expected=1, found=cfg.num_hidden_layers))
            out[engine] = Serving(engine, _convert_via(profile, opened.given), tuple(stops))
    return out


def serving_engines_of_config(config: dict[str, Any], tensors: Iterable[str], *,
                              engines: Iterable[str] = SERVING_ENGINES) -> dict[str, Serving]:
    """`serving_engines` for a drafter not saved yet (`train` judges its flags before the
    first step): its speculators config (`config.to_dict()`) and tensor names, judged on
    the norm variants alone, by the same rules."""
    cfg = parse_draft_config(config)
    present = {canonical_key(k) for k in tensors}
    out: dict[str, Serving] = {}
    for engine in engines:
        profile = get_profile(engine)
        stops = [f for f in _norm_variants(present, cfg, profile) if f.severity == "error"]
        via = "as is" if cfg.layout == _own_layout(profile) else _convert_via(profile,
                                                                              "DRAFTER")
        out[engine] = Serving(engine, via, tuple(stops))
    return out


def serving_line(verdicts: dict[str, Serving]) -> str:
    """The verdicts in one line: which engines serve the drafter, which do not and why
    (codes and the flags or tensors they name)."""
    def why(f: Finding) -> str:
        return f"{f.code}: {f.found}" if isinstance(f.found, str) else f.code

    yes = [v.engine for v in verdicts.values() if v.serves]
    no = [f"{v.engine} ({', '.join(dict.fromkeys(why(f) for f in v.findings))})"
          for v in verdicts.values() if not v.serves]
    return "; ".join(([f"not served by {', '.join(no)}"] if no else [])
                     + [f"served by {', '.join(yes)}" if yes else "served by none of them"])


def _reads_layout(profile: EngineProfile, cfg: DraftConfig) -> bool:
    """Whether the engine reads this config layout as it is (vLLM also reads speculators')."""
    return cfg.layout == profile.config_layout or (profile.name == "vllm"
                                                    and cfg.layout == "speculators")


def _own_layout(profile: EngineProfile) -> str:
    """The config layout `eagle3lab convert` writes for this engine."""
    return "flat" if profile.name.startswith("sglang") else "speculators"


def _convert_via(profile: EngineProfile, given: Any) -> str:
    to = "sglang" if _own_layout(profile) == "flat" else "speculators"
    return f"after `eagle3lab convert {given} OUT --to {to} --engine {profile.name}`"
