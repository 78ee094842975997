"""Convert between the speculators (vLLM) and SGLang/EAGLE-3 checkpoint formats, loudly.

Prevents a conversion that "works" and serves garbage: keys are renamed by a table per
direction (data), and any key without a rule, or any required rule without a key, stops the
conversion and writes nothing (in the style of SpecForge's specforge/export/to_sglang.py).
Tensors are copied byte for byte (never re-initialised, never zero-filled; NaN/Inf or an
all-zero float tensor refuses the conversion); the config is translated, with the aux layer
ids moved to where the destination engine reads them and shifted to its convention; a draft
trained with a variant the engine ignores (norm_before_fc, fc_norm, norm_before_residual,
norm_output) is refused with the options. The result is inspected for its engine before it
is moved into place atomically.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any, Literal

from eagle3lab.errors import UserError
from eagle3lab.formats.doctor import inspect_checkpoint
from eagle3lab.fsutil import atomic_dir, atomic_write_json
from eagle3lab.formats.detect import RECORD_KEY, DraftConfig, parse_draft_config
from eagle3lab.formats.findings import Report
from eagle3lab.formats.profiles import (ATTN_BIAS_PARTS, ATTN_PARTS, FIRST_LAYER_EXTRA, MLP_PARTS, NORM_PARTS,
                       SGLANG_0523, VERIFIER_KEYS, EngineProfile, capture_range, get_profile)
from eagle3lab.formats.reader import Checkpoint
from eagle3lab.formats.schema import draft_tensors
from eagle3lab.formats.targetinfo import TargetInfo, target_info
from eagle3lab.targets.auxlayers import CAPTURE_SEMANTICS, capture_to_ids

_PARTS = ATTN_PARTS + ATTN_BIAS_PARTS + MLP_PARTS + NORM_PARTS + FIRST_LAYER_EXTRA
_SHARED = ("fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t", "t2d")
_NORMS = ("input_norm.weight", "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight")

#: speculators key -> SGLang key (None: deliberately not exported; training-only copies).
TO_SGLANG: dict[str, str | None] = {
    **{f"layers.0.{p}": f"midlayer.{p}" for p in _PARTS},
    **{k: k for k in _SHARED + _NORMS},
    **{k: None for k in VERIFIER_KEYS},
}
#: SGLang/EAGLE-3 key -> speculators key.
TO_SPECULATORS: dict[str, str | None] = {
    **{f"midlayer.{p}": f"layers.0.{p}" for p in _PARTS},
    **{k: k for k in _SHARED + _NORMS},
    "aux_norm_low.weight": "fc_norm.0.weight", "aux_norm_mid.weight": "fc_norm.1.weight",
    "aux_norm_high.weight": "fc_norm.2.weight",
}
TABLES = {"sglang": TO_SGLANG, "speculators": TO_SPECULATORS}
SOURCE_FORMAT = {"sglang": "speculators", "speculators": "eagle3"}
#: Flat-config keys that belong to the EAGLE-3 wrapper, not to the decoder layer.
_EAGLE_KEYS = ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config",
               RECORD_KEY, "norm_before_fc", "fc_norm", "norm_output", "use_aux_norm",
               "num_aux_hidden_states", "eagle_aux_hidden_state_layer_ids")
_VARIANTS = {"norm_before_fc": "norm-before-fc", "fc_norm": "norm-before-fc",
             "norm_before_residual": "norm-variant", "norm_output": "norm-variant"}
_FIELD = {"norm_before_fc": "input_norm", "fc_norm": "fc_norm",
          "norm_before_residual": "norm_before_residual", "norm_output": "norm_output"}


#: Codes of a refusal because the engine does not implement a norm variant the drafter was
#: trained with: that engine cannot serve the drafter at all, whatever its keys.
VARIANT_CODES = frozenset(_VARIANTS.values())


class ConversionError(UserError):
    """A refused conversion; `code` is the finding code that explains it, `reason` the
    refusal without the options that follow it."""

    def __init__(self, code: str, message: str, options: str = ""):
        self.reason = f"[{code}] {message}"
        super().__init__(self.reason + (f" Options: {options}" if options else "")
                         + " Nothing was written.")
        self.code = code


@dataclasses.dataclass
class ConversionResult:
    path: Path
    renamed: dict[str, str]
    dropped: list[str]
    aux: dict[str, Any]
    report: Report


def plan_renames(keys, table: dict[str, str | None], required: set[str]
                 ) -> tuple[dict[str, str], list[str]]:
    """Apply a rename table: every key needs a rule, every required rule a key."""
    no_rule = sorted(k for k in keys if k not in table)
    if no_rule:
        raise ConversionError("unknown-keys", f"No rename rule for {len(no_rule)} key(s): "
                              f"{no_rule[:8]}. Multi-layer drafts and unknown tensors are not "
                              f"converted; a rule must be added deliberately.")
    missing = sorted(src for src in table if table[src] and _rule_required(src, required)
                     and src not in keys)
    if missing:
        raise ConversionError("missing-keys", f"Required tensor(s) absent: {missing}.")
    renamed = {k: table[k] for k in keys if table[k] is not None}
    dropped = sorted(k for k in keys if table[k] is None)
    return renamed, dropped  # type: ignore[return-value]


def _rule_required(src: str, required: set[str]) -> bool:
    canon = "layers.0." + src[len("midlayer."):] if src.startswith("midlayer.") else src
    return canon in required


def convert_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, *,
                       to: Literal["sglang", "speculators"],
                       target: str | os.PathLike | None = None, engine: str | None = None,
                       force: bool = False) -> ConversionResult:
    """Convert SRC to DST for `to` (engine: the profile the output must pass; default
    "sglang" for --to sglang, "vllm" for --to speculators)."""
    # lazy: a test patches eagle3lab.formats.locate.locate_checkpoint
    from eagle3lab.formats.locate import locate_checkpoint

    if to not in TABLES:
        raise UserError(f"--to must be 'sglang' or 'speculators', not {to!r}.")
    src, dst = locate_checkpoint(src), Path(dst)
    engine = engine or ("sglang" if to == "sglang" else "vllm")
    profile = get_profile(engine)
    if (to == "sglang") != engine.startswith("sglang"):
        raise UserError(f"--engine {engine} does not serve the {to} format.")
    if not src.is_dir():
        raise UserError(f"Source checkpoint {str(src)!r} is not a directory.")
    if dst.resolve() == src.resolve():
        raise UserError("DST must differ from SRC.")
    if dst.exists() and not dst.is_dir():
        raise UserError(f"DST {dst} is an existing file, not a directory; a converted checkpoint "
                        f"is a directory (config.json + model.safetensors). Choose a new "
                        f"directory path.")
    if dst.exists() and any(dst.iterdir()) and not force:
        raise UserError(f"{dst} exists and is not empty; choose another DST or pass --force.")
    tinfo = target_info(target) if target is not None else None
    ck = Checkpoint(src)
    try:
        if ck.problems:
            raise ConversionError("unreadable", "; ".join(f"{p.file}: {p.message}"
                                                          for p in ck.problems))
        fmt = ck.format
        if fmt != SOURCE_FORMAT[to]:
            raise ConversionError("format-unknown" if fmt == "unknown" else "keys-layout",
                                  f"{src} is in the {fmt} format; --to {to} converts from "
                                  f"{SOURCE_FORMAT[to]}.")
        cfg = parse_draft_config(ck.config)
        _refuse_variants(cfg, profile)
        required = {k for k, e in draft_tensors(cfg).items() if e.required}
        renamed, dropped = plan_renames(list(ck.tensors), TABLES[to], required)
        tensors = {renamed[k]: ck.tensor(k) for k in renamed}
        _refuse_bad_values(tensors)
        aux = _aux_plan(cfg, to, tinfo)
        new_cfg = (to_sglang_config(cfg, tinfo, aux, profile.name) if to == "sglang"
                   else to_speculators_config(cfg, tinfo, aux))
        new_cfg[RECORD_KEY]["converted_from"] = {"format": fmt, "path": str(src.resolve())}
        with atomic_dir(dst) as tmp:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in tensors.items()},
                      str(tmp / "model.safetensors"), metadata={"format": "pt"})
            atomic_write_json(tmp / "config.json", new_cfg)
            report = inspect_checkpoint(tmp, target=target, engine=profile.name)
            if not report.ok:
                lines = "; ".join(f"[{f.code}] {f.message}" for f in report.errors())
                raise ConversionError(report.errors()[0].code, f"The converted checkpoint does "
                                      f"not pass inspect for {profile.name}: {lines}")
        report.checkpoint = str(dst)
        return ConversionResult(dst, renamed, dropped, aux, report)
    finally:
        ck.close()


def _refuse_variants(cfg: DraftConfig, profile: EngineProfile) -> None:
    for flag, code in _VARIANTS.items():
        if not cfg.flags.get(flag) or getattr(profile, _FIELD[flag]) != "never":
            continue
        alt = ""
        if profile.name == "sglang" and getattr(SGLANG_0523, _FIELD[flag]) != "never":
            alt = ("; or, if you serve with SGLang 0.5.23 (which applies it), convert with "
                   "--engine sglang-0.5.23 (the output then needs that release)")
        raise ConversionError(code, (
            f"The draft was trained with {flag}=True, which {profile.name} does not "
            f"implement: it would serve the draft without it, with lower acceptance and no "
            f"error."), options=(
            f"serve the speculators format with vLLM (as it is, or via --to speculators); "
            f"retrain with {flag}=False{alt}."))


def _refuse_bad_values(tensors: dict[str, Any]) -> None:
    import torch

    for name, t in tensors.items():
        if t.is_floating_point():
            if not bool(torch.isfinite(t).all()):
                raise ConversionError("nonfinite", f"{name} has NaN/Inf values; refusing to "
                                      f"export it.")
            if t.numel() and not bool(t.any()):
                raise ConversionError("missing-keys", f"{name} is all zeros (a placeholder, "
                                      f"not trained weights); refusing to export it.")


def _aux_plan(cfg: DraftConfig, to: str, tinfo: TargetInfo | None) -> dict[str, Any]:
    """Training's capture points -> ids in the destination engine's place and convention."""
    points, source = cfg.training_capture()
    dest = get_profile("sglang" if to == "sglang" else "vllm")
    num_layers = tinfo.num_layers if tinfo else cfg.recorded_num_layers()
    plan = {"capture_points": points, "source": source, "convention": dest.aux_convention,
            "ids": capture_to_ids(points, dest.aux_convention) if points else None,
            "num_layers": num_layers}
    if points and num_layers:
        lo, hi = capture_range(dest, int(num_layers))
        bad = [p for p in points if not lo <= p <= hi]
        if bad:
            raise ConversionError("aux-layers", f"Training captured {points}; {dest.name} can "
                                  f"only capture {lo}..{hi} on a {num_layers}-layer target "
                                  f"(out of range: {bad}).")
    return plan


def _record(cfg: DraftConfig, aux: dict[str, Any], tinfo: TargetInfo | None) -> dict[str, Any]:
    rec = copy.deepcopy(cfg.record or {})
    if aux["capture_points"] is not None:
        rec["aux_layers"] = {
            **rec.get("aux_layers", {}), "capture_points": aux["capture_points"],
            "capture_semantics": CAPTURE_SEMANTICS,
            "convention": aux["convention"], "requested_ids": aux["ids"],
            "num_layers": aux["num_layers"]}
    if tinfo is not None:
        rec["target"] = {**rec.get("target", {}), **tinfo.to_dict()}
    return rec


def to_sglang_config(cfg: DraftConfig, tinfo: TargetInfo | None, aux: dict[str, Any],
                     engine: str = "sglang") -> dict[str, Any]:
    """speculators config -> flat LlamaConfig as SGLang's LlamaForCausalLMEagle3 reads it."""
    raw = cfg.raw
    layer = copy.deepcopy(raw.get("transformer_layer_config") or {})
    out = {k: v for k, v in layer.items() if k not in _EAGLE_KEYS}
    rope = layer.get("rope_parameters") or {}
    if "rope_theta" not in out and "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]  # releases on transformers 4 read it here
    out["architectures"] = ["LlamaForCausalLMEagle3"]
    out["model_type"] = layer.get("model_type", "llama")
    out["draft_vocab_size"] = cfg.draft_vocab_size
    out["target_hidden_size"] = (tinfo.hidden_size if tinfo else
                                 cfg.target_hidden_size or cfg.hidden_size)
    out["tie_word_embeddings"] = False
    eagle: dict[str, Any] = {"use_aux_hidden_state": True}
    if aux["ids"] is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = aux["ids"]
    if cfg.flags.get("norm_before_fc"):
        eagle["norm_before_fc"] = True  # only reached for profiles that apply it
    out["eagle_config"] = eagle
    for flag in ("fc_norm", "norm_output"):
        if cfg.flags.get(flag):
            out[flag] = True
    if raw.get("dtype") or raw.get("torch_dtype"):  # transformers 5 reads dtype, 4 torch_dtype
        out["dtype"] = out["torch_dtype"] = raw.get("dtype") or raw.get("torch_dtype")
    rec = _record(cfg, aux, tinfo)
    rec["speculators"] = {k: copy.deepcopy(raw[k]) for k in (
        "transformer_layer_config", "speculators_config", "norm_before_residual",
        "embed_requires_grad", "speculators_version", "auto_map", "architectures",
        "target_hidden_size", "dtype") if k in raw}
    rec["served_by"] = engine
    out[RECORD_KEY] = rec
    return out


def to_speculators_config(cfg: DraftConfig, tinfo: TargetInfo | None,
                          aux: dict[str, Any]) -> dict[str, Any]:
    """flat EAGLE-3 config -> speculators Eagle3SpeculatorConfig (as save_pretrained writes)."""
    raw = cfg.raw
    stash = copy.deepcopy(((raw.get(RECORD_KEY) or {}).get("speculators")) or {})
    layer = stash.get("transformer_layer_config") or {
        **{k: v for k, v in raw.items() if k not in _EAGLE_KEYS and k not in (
            "torch_dtype", "dtype", "transformers_version")},
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}
    verifier = {"name_or_path": tinfo.path if tinfo else None,
                "architectures": list(tinfo.architectures) if tinfo else []}
    spec_cfg = stash.get("speculators_config") or {
        "algorithm": "eagle3", "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                              "accept_tolerance": 0.0, "verifier_accept_k": 1}],
        "verifier": verifier}
    if tinfo is not None:
        spec_cfg["verifier"] = verifier
    ths = cfg.target_hidden_size
    out: dict[str, Any] = {
        "architectures": stash.get("architectures", ["Eagle3DraftModel"]),
        "speculators_model_type": "eagle3",
        "draft_vocab_size": cfg.draft_vocab_size if cfg.draft_vocab_size is not None
        else cfg.vocab_size,
        "target_hidden_size": stash.get("target_hidden_size",
                                        ths if ths is not None and ths != cfg.hidden_size
                                        else None),
        "norm_before_fc": bool(cfg.flags.get("norm_before_fc")),
        "fc_norm": bool(cfg.flags.get("fc_norm")),
        "norm_output": bool(cfg.flags.get("norm_output")),
        "norm_before_residual": bool(stash.get("norm_before_residual", False)),
        "embed_requires_grad": bool(stash.get("embed_requires_grad", False)),
        "eagle_aux_hidden_state_layer_ids": aux["ids"],
        "speculators_config": spec_cfg,
        "transformer_layer_config": layer,
        "tie_word_embeddings": False,
    }
    for k in ("speculators_version", "auto_map", "dtype"):
        if k in stash:
            out[k] = stash[k]
    if "dtype" not in out and (raw.get("torch_dtype") or raw.get("dtype")):
        out["dtype"] = raw.get("torch_dtype") or raw.get("dtype")
    rec = _record(cfg, aux, tinfo)
    rec.pop("speculators", None)
    rec.pop("served_by", None)
    out[RECORD_KEY] = rec
    return out
