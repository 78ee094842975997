"""Which format a checkpoint is in, and what its config says, read one way for all checks.

Prevents a checkpoint being judged by the wrong rules: the same facts live in different
places in the two formats (speculators nests the layer config in `transformer_layer_config`
and writes aux ids at the top level; SGLang/official EAGLE/SpecForge checkpoints are a flat
LlamaConfig with ids under `eagle_config`). `DraftConfig` normalises both into one view and
keeps where each fact came from, so a finding can say "found here, the engine reads there".
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from eagle3lab.targets.auxlayers import PLACES, ids_to_capture

Format = Literal["speculators", "eagle3", "unknown"]

_LAYER_RE = re.compile(r"^layers\.(\d+)\.")
RECORD_KEY = "eagle3lab"  # our provenance block inside a checkpoint's config.json
#: The run record eagle3lab's trainer writes beside a drafter (train/checkpoints.py
#: save_final, pack_drafter): what the data was captured at and the flags training used.
SIDECAR = "eagle3lab.json"
#: The config fields of a multi-latent-attention (DeepSeek-V2 MLA) draft layer.
MLA_DIMS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim")


def key_layout(keys) -> str:
    """'midlayer', 'layers', 'mixed' or 'none', from the tensor names alone."""
    mid = any(k.startswith("midlayer.") for k in keys)
    lay = any(_LAYER_RE.match(k) for k in keys)
    return "mixed" if mid and lay else "midlayer" if mid else "layers" if lay else "none"


def config_layout(config: dict[str, Any] | None) -> str:
    """'speculators', 'flat' (an EAGLE-3 LlamaConfig) or 'none'."""
    if not config:
        return "none"
    if "speculators_model_type" in config or "transformer_layer_config" in config:
        return "speculators"
    archs = config.get("architectures") or []
    if "hidden_size" in config or any("eagle" in str(a).lower() for a in archs):
        return "flat"
    return "none"


def detect_format(keys, config: dict[str, Any] | None) -> Format:
    """speculators (`layers.N.*`, `speculators_model_type`), eagle3 (`midlayer.*`), unknown.

    The config decides when it is recognisable; otherwise the tensor names do.
    """
    layout = config_layout(config)
    if layout == "speculators":
        return "speculators"
    lay = key_layout(keys)
    archs = [str(a) for a in (config or {}).get("architectures") or []]
    if lay == "midlayer" or (layout == "flat" and any("eagle3" in a.lower() for a in archs)):
        return "eagle3"
    if lay == "layers":
        return "speculators" if layout == "none" else "eagle3"
    return "unknown"


def layer_index(key: str) -> int | None:
    m = _LAYER_RE.match(key)
    return int(m.group(1)) if m else None


def canonical_key(key: str) -> str:
    """Checkpoint key in speculators naming (the canonical one used by checks)."""
    if key.startswith("midlayer."):
        return "layers.0." + key[len("midlayer."):]
    for legacy, new in (("aux_norm_low", "fc_norm.0"), ("aux_norm_mid", "fc_norm.1"),
                        ("aux_norm_high", "fc_norm.2")):
        if key.startswith(legacy):
            return new + key[len(legacy):]
    return key


def get_path(d: dict[str, Any] | None, path: tuple[str, ...]) -> Any:
    cur: Any = d
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return cur


@dataclasses.dataclass
class DraftConfig:
    """The facts every check needs, from either config layout (None: not stated)."""

    layout: str
    architectures: list[str]
    layer_model_type: str | None
    hidden_size: int | None
    intermediate_size: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    head_dim: int | None
    num_hidden_layers: int | None
    vocab_size: int | None  # the target vocabulary (embedding rows)
    draft_vocab_size: int | None  # None: null/absent (SGLang then takes the head from the target)
    draft_vocab_size_stated: bool
    target_hidden_size: int | None
    target_hidden_size_stated: bool  # the key exists (even as null)
    max_position_embeddings: int | None
    attention_bias: bool
    tie_word_embeddings: bool
    flags: dict[str, bool]  # norm_before_fc, fc_norm, norm_before_residual, norm_output
    aux_ids: dict[str, list[int] | None]  # "top-level" / "eagle_config" -> ids (None: absent)
    record: dict[str, Any] | None  # our provenance block
    dtype: str | None
    raw: dict[str, Any]
    mla: dict[str, int | None] | None = None  # multi-latent attention dims (kv_lora_rank set)
    trained_override: list[int] | None = None  # capture points given by the user (preflight)
    record_source: str | None = None  # where `record` came from (config.json, eagle3lab.json)

    def recorded_capture_points(self) -> list[int] | None:
        """What training recorded (our provenance block), if anything."""
        aux = (self.record or {}).get("aux_layers") or {}
        pts = aux.get("capture_points")
        return [int(p) for p in pts] if isinstance(pts, list) else None

    def recorded_num_layers(self) -> int | None:
        """The target's layer count as training recorded it, if anything."""
        return ((self.record or {}).get("aux_layers") or {}).get("num_layers")

    def trained_steps(self) -> tuple[int | None, str | None]:
        """How many positions the drafter was trained to draft (its TTT depth) and where
        that was read: the record's `ttt_steps`, else speculators'
        `speculators_config.proposal_methods[0].speculative_tokens` (eagle3lab's trainer
        writes its ttt_steps there: train/model.py build_drafter)."""
        n = (self.record or {}).get("ttt_steps")
        if isinstance(n, int) and n > 0:
            return n, f"ttt_steps ({self.record_source})"
        methods = get_path(self.raw, ("speculators_config", "proposal_methods"))
        if isinstance(methods, list) and methods and isinstance(methods[0], dict):
            n = methods[0].get("speculative_tokens")
            if isinstance(n, int) and n > 0:
                return n, "speculators_config.proposal_methods[0].speculative_tokens"
        return None, None

    def trained_flag(self, flag: str) -> tuple[bool, str, bool]:
        """(value, where it was read, certain) of a norm-variant flag at training time: the
        record's engine_profile; else the config (a speculators config always states its
        flags); else speculators 0.9.0's default, False (models/eagle3/config.py
        Eagle3SpeculatorConfig), which is what its loader (and eagle3lab's) reads for an
        absent key: not certain, since another trainer may have meant otherwise."""
        prof = (self.record or {}).get("engine_profile")
        if isinstance(prof, dict) and isinstance(prof.get(flag), bool):
            return prof[flag], f"{self.record_source} engine_profile", True
        if flag in self.raw or flag in ((self.raw.get("eagle_config") or {})
                                        if isinstance(self.raw.get("eagle_config"), dict)
                                        else {}):
            return bool(self.flags.get(flag)), "config.json", True
        return False, "absent from config.json: speculators' default", False

    def training_capture(self) -> tuple[list[int] | None, str | None]:
        """What training used, as capture points, and where that came from (None: unknown).

        Our provenance block wins; otherwise the ids of the config's own format, read in the
        convention of that format's engine (speculators: vLLM's; flat EAGLE-3 configs:
        SGLang's).
        """
        if self.trained_override is not None:
            return list(self.trained_override), "given (--trained-aux-layers)"
        rec = self.recorded_capture_points()
        if rec is not None:
            return rec, f"eagle3lab record ({self.record_source})"
        own = "top-level" if self.layout == "speculators" else "eagle_config"
        ids = self.aux_ids.get(own)
        if ids:
            return ids_to_capture(ids, PLACES[own]), f"{own} ids ({PLACES[own]} convention)"
        return None, None

    def summary(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("raw")
        return d


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _ids(v: Any) -> list[int] | None:
    if isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        return list(v)
    return None if v is None else []  # [] marks "present but not a list of ints"


def read_sidecar(directory) -> dict[str, Any] | None:
    """The training record beside a drafter (eagle3lab.json) in the shape of the config's
    `eagle3lab` block: `aux_layers` (what the shards were captured at), `engine_profile`
    (the norm flags training used), `ttt_steps`, `rendering` when recorded; None when absent or
    unreadable (the doctor then judges by the config alone)."""
    import json
    from pathlib import Path

    f = Path(directory) / SIDECAR
    try:
        run = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(run, dict):
        return None
    drafter = run.get("drafter") if isinstance(run.get("drafter"), dict) else {}
    aux = get_path(run, ("data", "train", "aux_layers")) or drafter.get("aux")
    out: dict[str, Any] = {}
    if isinstance(aux, dict) and isinstance(aux.get("capture_points"), list):
        out["aux_layers"] = aux
    if isinstance(drafter.get("engine_profile"), dict):
        out["engine_profile"] = drafter["engine_profile"]
    steps = drafter.get("ttt_steps", get_path(run, ("config", "ttt_steps")))
    if isinstance(steps, int):
        out["ttt_steps"] = steps
    if isinstance(run.get("rendering"), dict):  # how its data was rendered (data/rendering.py)
        out["rendering"] = run["rendering"]
    return out or None


def parse_draft_config(config: dict[str, Any] | None, *,
                       sidecar: dict[str, Any] | None = None) -> DraftConfig:
    config = config or {}
    layout = config_layout(config)
    layer = config.get("transformer_layer_config") if layout == "speculators" else config
    layer = layer if isinstance(layer, dict) else {}
    heads = _int(layer.get("num_attention_heads"))
    hidden = _int(layer.get("hidden_size"))
    kv = _int(layer.get("num_key_value_heads")) or heads
    head_dim = _int(layer.get("head_dim")) or (hidden // heads if hidden and heads else None)
    eagle_cfg = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    flags = {}
    for flag in ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output"):
        flags[flag] = bool(config.get(flag) or eagle_cfg.get(flag))
    if layout == "flat" and config.get("use_aux_norm"):
        flags["fc_norm"] = True
    aux_ids = {"top-level": _ids(config.get("eagle_aux_hidden_state_layer_ids")),
               "eagle_config": _ids(eagle_cfg.get("eagle_aux_hidden_state_layer_ids"))}
    if layout == "speculators":
        dvs = config.get("draft_vocab_size", 32000)  # speculators' pydantic default
    else:
        dvs = config.get("draft_vocab_size")
    archs = config.get("architectures")
    own = config.get(RECORD_KEY) if isinstance(config.get(RECORD_KEY), dict) else {}
    record = {**(sidecar or {}), **own}
    where = [w for w, r in (("config.json", own), (SIDECAR, sidecar)) if r]
    return DraftConfig(
        layout=layout,
        architectures=[str(a) for a in archs] if isinstance(archs, list) else [],
        layer_model_type=layer.get("model_type") if isinstance(layer.get("model_type"), str)
        else None,
        hidden_size=hidden,
        intermediate_size=_int(layer.get("intermediate_size")),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        num_hidden_layers=_int(layer.get("num_hidden_layers")),
        vocab_size=_int(layer.get("vocab_size")),
        draft_vocab_size=_int(dvs),
        draft_vocab_size_stated="draft_vocab_size" in config,
        target_hidden_size=_int(config.get("target_hidden_size")),
        target_hidden_size_stated="target_hidden_size" in config,
        max_position_embeddings=_int(layer.get("max_position_embeddings")),
        attention_bias=bool(layer.get("attention_bias", False)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        flags=flags,
        aux_ids=aux_ids,
        record=record or None,
        record_source=" + ".join(where) or None,
        dtype=str(config.get("dtype") or config.get("torch_dtype") or layer.get("dtype")
                  or layer.get("torch_dtype") or "") or None,
        raw=config,
        mla={k: _int(layer.get(k)) for k in MLA_DIMS} if "kv_lora_rank" in layer else None,
    )
