"""The drafter's tensors as its config defines them, and the subset an engine loads.

Prevents shape and key checks from drifting apart from the engines: one function says
which tensors a draft of this config has (with shapes, in speculators naming), another
which checkpoint keys a given engine turns into parameters (in the engine's own naming,
after its renames, see profiles.py), and `engine_capture` which aux capture points it
reads from the config. `inspect`, `convert` and `load_as` all use them.
"""

from __future__ import annotations

import dataclasses

from eagle3lab.formats.detect import DraftConfig, get_path
from eagle3lab.formats.profiles import (INPUT_NORM, VERIFIER_KEYS, EngineProfile, layer_parts)
from eagle3lab.targets.auxlayers import default_capture_points, ids_to_capture


@dataclasses.dataclass(frozen=True)
class Expect:
    shape: tuple[int, ...] | None  # None: not derivable from the config
    required: bool
    why: str = ""


def vllm_view(cfg: DraftConfig) -> dict:
    """The config vLLM 0.25.1 builds the drafter from. A speculators config is flattened as
    vllm/transformers_utils/configs/speculators/algos.py `update_eagle3` does: its
    transformer_layer_config, plus draft_vocab_size, target_hidden_size (when not None),
    norm_before_residual (True when ABSENT), norm_before_fc, fc_norm and norm_output (False
    when absent), and the aux ids only when truthy; nothing else of the top level (no
    eagle_config, no num_aux_hidden_states, no use_aux_hidden_state) reaches the model.
    Any other config is read as it is (vllm/transformers_utils/configs/eagle.py)."""
    if cfg.layout != "speculators":
        return cfg.raw
    raw = cfg.raw
    layer = raw.get("transformer_layer_config")
    view = dict(layer) if isinstance(layer, dict) else {}
    view["draft_vocab_size"] = raw.get("draft_vocab_size")
    if raw.get("target_hidden_size") is not None:
        view["target_hidden_size"] = raw["target_hidden_size"]
    view["norm_before_residual"] = raw.get("norm_before_residual", True)
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        view[flag] = raw.get(flag, False)
    if raw.get("eagle_aux_hidden_state_layer_ids"):
        view["eagle_aux_hidden_state_layer_ids"] = raw["eagle_aux_hidden_state_layer_ids"]
    return view


def vllm_eagle_config(cfg: DraftConfig) -> dict:
    eagle = vllm_view(cfg).get("eagle_config")
    return eagle if isinstance(eagle, dict) else {}


def vllm_uses_aux(cfg: DraftConfig) -> bool:
    """vLLM 0.25.1 reads use_aux_hidden_state from eagle_config only (default True):
    llama_eagle3.py:145-149, v1/spec_decode/llm_base_proposer.py
    _get_eagle3_use_aux_hidden_state_from_config."""
    return bool(vllm_eagle_config(cfg).get("use_aux_hidden_state", True))


def num_aux(cfg: DraftConfig, profile: EngineProfile) -> int:
    """How many aux states the engine's fc expects."""
    if profile.fc_num_aux == "fixed3":
        return 3
    if profile.fc_num_aux == "vllm":  # llama_eagle3.py:175-182
        view = vllm_view(cfg)
        explicit = view.get("num_aux_hidden_states")
        if isinstance(explicit, int) and not isinstance(explicit, bool):
            return explicit
        ids = vllm_eagle_config(cfg).get("eagle_aux_hidden_state_layer_ids")
        return len(ids) if isinstance(ids, list) and ids else 3
    explicit = cfg.raw.get("num_aux_hidden_states")
    if isinstance(explicit, int):
        return explicit
    ids = cfg.aux_ids.get("eagle_config") if profile.config_layout == "flat" else \
        cfg.aux_ids.get("top-level")
    return len(ids) if ids else 3


def engine_capture(profile: EngineProfile, cfg: DraftConfig,
                   num_layers: int | None) -> tuple[list[int] | None, bool]:
    """Capture points the engine will use and whether they are its defaults: the ids where
    it reads them, in its convention; else its defaults (None without the layer count)."""
    ids = engine_ids(profile, cfg)[0]
    if ids:
        return ids_to_capture(ids, profile.aux_convention), False
    return (default_capture_points(num_layers) if num_layers else None), True


def engine_ids(profile: EngineProfile, cfg: DraftConfig) -> tuple[list[int] | None, str]:
    """The explicit aux ids the engine reads and where: its place, else its fallbacks
    (vLLM's V1 runner: eagle_config); (None, its place) when it reads none."""
    for place in (profile.aux_place, *profile.aux_ids_fallback):
        ids = cfg.aux_ids.get(place)
        if ids:
            return ids, place
    return None, profile.aux_place


def engine_target_hidden(cfg: DraftConfig) -> int | None:
    """The per-aux width the engine builds fc with: target_hidden_size, else hidden_size."""
    return cfg.target_hidden_size if cfg.target_hidden_size is not None else cfg.hidden_size


def flag_read_by(profile: EngineProfile, cfg: DraftConfig, what: str) -> bool:
    """Whether the config sets a variant flag where this engine reads it."""
    if profile.name == "vllm":
        return vllm_flag(cfg, what)
    if what == "norm_before_fc":
        return any(bool(get_path(cfg.raw, p)) for p in profile.input_norm_flag_paths)
    if what == "fc_norm":
        return bool(cfg.raw.get("fc_norm") or (profile.name.startswith("sglang")
                                                and cfg.raw.get("use_aux_norm")))
    return bool(cfg.raw.get(what))


def vllm_flag(cfg: DraftConfig, what: str) -> bool:
    """A norm-variant flag as vLLM 0.25.1 reads it from `vllm_view`: norm_before_fc from
    eagle_config first, then the config (llama_eagle3.py:150-154); fc_norm, norm_output and
    norm_before_residual from the config, False when absent there (:69, :197, :218); for a
    speculators config the view already holds update_eagle3's defaults."""
    view = vllm_view(cfg)
    if what == "norm_before_fc":
        return bool(vllm_eagle_config(cfg).get("norm_before_fc",
                                               view.get("norm_before_fc", False)))
    return bool(view.get(what, False))


def applies(profile: EngineProfile, cfg: DraftConfig, what: str) -> bool:
    support = {"norm_before_fc": profile.input_norm, "fc_norm": profile.fc_norm,
               "norm_before_residual": profile.norm_before_residual,
               "norm_output": profile.norm_output}[what]
    return support != "never" and flag_read_by(profile, cfg, what)


def draft_tensors(cfg: DraftConfig, *, n_aux: int = 3, target_hidden: int | None = None,
                  target_vocab: int | None = None) -> dict[str, Expect]:
    """Every tensor a draft with this config has (speculators naming) and its shape."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    Ht = target_hidden or engine_target_hidden(cfg)
    V = cfg.vocab_size or target_vocab
    Vd = cfg.draft_vocab_size if cfg.draft_vocab_size is not None else V

    def shp(*dims):
        return None if any(d is None for d in dims) else tuple(int(d) for d in dims)

    out: dict[str, Expect] = {}
    for i in range(cfg.num_hidden_layers or 1):
        d_in = 2 * H if (i == 0 and H) else H
        shapes = {
            "self_attn.q_proj.weight": shp(nh * hd if nh and hd else None, d_in),
            "self_attn.k_proj.weight": shp(nkv * hd if nkv and hd else None, d_in),
            "self_attn.v_proj.weight": shp(nkv * hd if nkv and hd else None, d_in),
            "self_attn.o_proj.weight": shp(H, nh * hd if nh and hd else None),
            "self_attn.q_proj.bias": shp(nh * hd if nh and hd else None),
            "self_attn.k_proj.bias": shp(nkv * hd if nkv and hd else None),
            "self_attn.v_proj.bias": shp(nkv * hd if nkv and hd else None),
            "mlp.gate_proj.weight": shp(I, H), "mlp.up_proj.weight": shp(I, H),
            "mlp.down_proj.weight": shp(H, I), "input_layernorm.weight": shp(H),
            "post_attention_layernorm.weight": shp(H), "hidden_norm.weight": shp(H),
        }
        if cfg.mla is not None:
            shapes.update(_mla_shapes(cfg, d_in, shp))
        for part in layer_parts(i, attention_bias=cfg.attention_bias, mla=cfg.mla is not None):
            out[f"layers.{i}.{part}"] = Expect(shapes[part], True, "decoder layer")
    out["fc.weight"] = Expect(shp(H, n_aux * Ht if Ht else None), True, "fuses the aux states")
    out["norm.weight"] = Expect(shp(H), True, "final norm")
    out["lm_head.weight"] = Expect(shp(Vd, H), True, "draft head")
    out["embed_tokens.weight"] = Expect(shp(V, H), False, "token embedding")
    small = Vd is not None and V is not None and Vd < V
    out["d2t"] = Expect(shp(Vd), small, "draft -> target id offsets")
    out["t2d"] = Expect(shp(V), small, "target-vocab mask of draft tokens")
    if cfg.flags.get("norm_before_fc"):
        out[INPUT_NORM] = Expect(shp(n_aux * Ht if Ht else None), True, "norm_before_fc")
    if cfg.flags.get("fc_norm"):
        for k in range(n_aux):
            out[f"fc_norm.{k}.weight"] = Expect(shp(Ht), True, "fc_norm")
    return out


def _mla_shapes(cfg: DraftConfig, d_in, shp) -> dict[str, tuple[int, ...] | None]:
    """Multi-latent attention (DeepseekV2AttentionMLA with q_lora_rank) tensor shapes."""
    m, nh, H = cfg.mla or {}, cfg.num_attention_heads, cfg.hidden_size
    q, kv = m.get("q_lora_rank"), m.get("kv_lora_rank")
    nope, rope, v = m.get("qk_nope_head_dim"), m.get("qk_rope_head_dim"), m.get("v_head_dim")

    def mul(a, b):
        return a * b if a is not None and b is not None else None

    def add(a, b):
        return a + b if a is not None and b is not None else None

    return {"self_attn.q_a_proj.weight": shp(q, d_in),
            "self_attn.q_a_layernorm.weight": shp(q),
            "self_attn.q_b_proj.weight": shp(mul(nh, add(nope, rope)), q),
            "self_attn.kv_a_proj_with_mqa.weight": shp(add(kv, rope), d_in),
            "self_attn.kv_a_layernorm.weight": shp(kv),
            "self_attn.kv_b_proj.weight": shp(mul(nh, add(nope, v)), kv),
            "self_attn.o_proj.weight": shp(H, mul(nh, v))}


def engine_param_keys(profile: EngineProfile, cfg: DraftConfig) -> set[str]:
    """Checkpoint keys (after the engine's renames) that the engine loads into a parameter.

    d2t/t2d are included when the engine consumes or deliberately skips them.
    """
    n_layers = (cfg.num_hidden_layers or 1) if profile.multi_layer else 1
    bias = profile.qkv_bias == "config" and cfg.attention_bias
    keys: set[str] = set()
    for i in range(n_layers):
        prefix = "midlayer." if (i == 0 and profile.layer_prefixes == ("midlayer.",)) \
            else f"layers.{i}."
        keys |= {prefix + p for p in layer_parts(i, attention_bias=bias,
                                                 mla=cfg.mla is not None)}
    keys |= {"fc.weight", "norm.weight", "embed_tokens.weight", "d2t", "t2d"}
    tied = profile.config_layout == "flat" and profile.name.startswith("sglang") and \
        cfg.tie_word_embeddings
    if not tied:
        keys.add("lm_head.weight")
    if profile.input_norm != "never" and (profile.input_norm == "unverified"
                                          or flag_read_by(profile, cfg, "norm_before_fc")):
        keys.add(INPUT_NORM)
    if profile.fc_norm != "never" and (profile.fc_norm == "unverified"
                                       or flag_read_by(profile, cfg, "fc_norm")):
        keys |= {f"fc_norm.{k}.weight" for k in range(num_aux(cfg, profile))}
    if profile.name == "speculators":
        keys |= set(VERIFIER_KEYS)
    return keys


def engine_required(profile: EngineProfile, cfg: DraftConfig, drafted: dict[str, Expect],
                    target_vocab: int | None) -> dict[str, str]:
    """Canonical names the engine needs from the checkpoint -> why."""
    need = {k: e.why for k, e in drafted.items() if e.required}
    if profile.name.startswith("sglang"):
        if cfg.draft_vocab_size is None or cfg.tie_word_embeddings:
            need.pop("lm_head.weight", None)  # head from the target / tied to the embedding
        if cfg.target_hidden_size is not None and cfg.hidden_size is not None and \
                cfg.target_hidden_size != cfg.hidden_size:
            need["embed_tokens.weight"] = "own embedding (hidden differs from the target's)"
    if profile.name == "vllm":
        V = cfg.vocab_size or target_vocab
        if cfg.draft_vocab_size is not None and V is not None and cfg.draft_vocab_size >= V:
            need.pop("lm_head.weight", None)  # vLLM shares the target's head when absent
        # vLLM never reads t2d: its loader skips it (vllm/model_executor/models/
        # llama_eagle3.py load_weights, 0.25.1). Measured on an H200: the shipped drafter
        # without t2d served at accept length 2.05, as with it (docs/vllm.md).
        need.pop("t2d", None)
    if not applies(profile, cfg, "norm_before_fc"):
        need.pop(INPUT_NORM, None)
    if not applies(profile, cfg, "fc_norm"):
        for k in [k for k in need if k.startswith("fc_norm.")]:
            need.pop(k)
    if not profile.multi_layer:
        for k in [k for k in need if k.startswith("layers.") and not k.startswith("layers.0.")]:
            need.pop(k)
    if profile.name == "vllm" and not vllm_uses_aux(cfg):
        for k in [k for k in need if k == "fc.weight" or k == INPUT_NORM
                  or k.startswith("fc_norm.")]:
            need.pop(k)  # no fc is built (llama_eagle3.py:175)
    return need
