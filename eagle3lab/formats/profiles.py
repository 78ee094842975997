"""What each serving engine does with an EAGLE-3 checkpoint, written down as data.

Prevents the silent failure this whole package exists for: a drafter that trained well is
served with its decoder layer dropped (SGLang ignores keys it does not know and keeps its
freshly initialised parameters), with the wrong aux layers (the two id conventions), or
without the input norm it was trained with, and the server shows accept length ~1.00 with
no error. Every check in `inspect`, every rename in `convert` and the emulation in
`load_as` reads these profiles; tests/formats/test_sglang_source.py checks the SGLang
entries against the installed sglang package's own source.

Sources read (public code; paths inside each project):
- SGLang 0.5.23 (the project's pin): python/sglang/srt/models/llama_eagle3.py
  (`LlamaForCausalLMEagle3.load_weights`: `legacy_name_map` midlayer->layers.0 and
  aux_norm_low/mid/high->fc_norm.0/1/2, d2t -> `hot_token_id = d2t + arange`, t2d skipped,
  unknown names skipped without a word; `LlamaModel`: fc in = target_hidden_size * num_aux,
  input_norm when eagle_config/top-level `norm_before_fc`, fc_norm when `fc_norm`/`use_aux_norm`,
  `norm_output`; qkv_proj built with bias=False), srt/models/llama.py
  (`set_eagle3_layers_to_capture`: default [2, N//2, N-3], explicit ids +1; `set_embed`: the
  target's embedding unless `target_hidden_size` is set and differs),
  srt/model_executor/model_runner_components/spec_aux_hidden_state.py (explicit ids only from
  `eagle_config["eagle_aux_hidden_state_layer_ids"]`), srt/models/registry.py (the class is
  chosen by `architectures[0]`).
- SGLang before the multi-layer loader (e.g. commit 03d5a77 of the same file): the decoder
  layer is the attribute `midlayer`, there is no rename, no input_norm, no fc_norm, no
  norm_output: `layers.0.*` and `input_norm.weight` are dropped silently. Profile "sglang"
  is the portable one: what loads correctly on BOTH generations.
- vLLM 0.25.1 (the release served on the H200; every fact read in its wheel's source):
  vllm/model_executor/models/llama_eagle3.py (`Eagle3LlamaForCausalLM.load_weights`:
  `midlayer.` -> `layers.0.`, t2d skipped, d2t -> draft_id_to_target_id, which stays ZEROS
  when the checkpoint has no d2t, so draft id i is served as target id i (:304-307,
  :387-391, :419-420, compute_logits :347-357); `input_norm.` skipped unless norm_before_fc,
  `fc.` skipped without aux states (:423-426); the loader returns no names, so vLLM's
  "weights were not initialized" check (model_loader/default_loader.py
  track_weights_loading) never runs and a missing tensor is served uninitialised;
  `LlamaModel`: use_aux_hidden_state and norm_before_fc read from eagle_config first
  (:145-154), fc in = target_hidden_size x (num_aux_hidden_states, else
  len(eagle_config ids), else 3) (:175-187), fc_norm (:197-206), norm_output (:218, :252);
  the decoder layer's norm_before_residual (:69-72)), model_executor/models/utils.py
  (`AutoWeightsLoader`: a name with no parameter raises ValueError "There is no module or
  parameter named ..."), vllm/transformers_utils/configs/speculators/algos.py
  (`update_eagle3`: the transformer_layer_config flattened with draft_vocab_size,
  target_hidden_size, norm_before_residual DEFAULTING TO TRUE when absent, norm_before_fc /
  fc_norm / norm_output defaulting to False, architectures from the layer's model_type
  (llama, qwen3; anything else raises), aux ids copied only when truthy),
  vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py (the V2 model runner, 0.25.1's
  default for non-MoE targets: explicit ids read from the top-level
  `eagle_aux_hidden_state_layer_ids` only, not shifted) and
  vllm/v1/worker/gpu_model_runner.py `_get_eagle3_aux_layers_from_config` (the V1 runner:
  top level, else eagle_config's ids, not shifted), model_executor/models/llama.py +
  interfaces.py (capture point k = the input of decoder layer k; default (2, N//2, N-3)),
  vllm/v1/spec_decode/llm_base_proposer.py and v1/worker/gpu/spec_decode/eagle/utils.py
  (the target's embedding/head are shared only when the checkpoint has none of its own),
  model_executor/models/registry.py (`_SPECULATIVE_DECODING_MODELS`).
- speculators 0.9.0: speculators/models/eagle3/core.py (`Eagle3DraftModel`: `layers.N.*`,
  `_keys_to_ignore_on_load_missing`), model.py (HF `from_pretrained`: unexpected keys are
  logged and ignored, missing ones initialised), models/utils.py (`resolve_target_layer_ids`:
  default [2, N//2, N-3], valid 0..N, vLLM convention).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from eagle3lab.errors import UserError

Support = Literal["never", "config", "unverified"]

#: The parts of one draft decoder layer, in checkpoint naming (relative to `layers.i.`).
ATTN_PARTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
              "self_attn.v_proj.weight", "self_attn.o_proj.weight")
ATTN_BIAS_PARTS = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")
MLP_PARTS = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
NORM_PARTS = ("input_layernorm.weight", "post_attention_layernorm.weight")
FIRST_LAYER_EXTRA = ("hidden_norm.weight",)

#: Multi-latent attention (DeepSeek-V2 MLA) of SGLang 0.5.23's Kimi-K2.x drafter
#: `Eagle3DeepseekV2ForCausalLM` (srt/models/kimi_k25_eagle3.py: `Eagle3MLADecoderLayer`
#: over `DeepseekV2AttentionMLA` of srt/models/deepseek_v2.py; q_a_proj and
#: kv_a_proj_with_mqa are fused at load into fused_qkv_a_proj_with_mqa, 2 x hidden wide).
MLA_ATTN_PARTS = ("self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight",
                  "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
                  "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight",
                  "self_attn.o_proj.weight")
MLA_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"

INPUT_NORM = "input_norm.weight"
VERIFIER_KEYS = ("verifier_lm_head.weight", "verifier_norm.weight")


@dataclasses.dataclass(frozen=True)
class EngineProfile:
    """One engine's loading behaviour; every field is a fact with a source above."""

    name: str
    title: str
    config_layout: Literal["flat", "speculators"]  # where hidden_size & co are read
    layer_prefixes: tuple[str, ...]  # checkpoint prefixes that land on draft layer 0
    key_renames: tuple[tuple[str, str], ...]  # substring renames, applied in order
    unknown_keys: Literal["drop", "raise", "warn-drop"]  # what happens to a key with no param
    architectures: tuple[str, ...]  # accepted `architectures[0]` (flat) / model_type (speculators)
    aux_ids_path: tuple[str, ...]  # where explicit aux layer ids are read
    aux_convention: Literal["sglang", "vllm"]  # sglang: capture = id + 1; vllm: capture = id
    aux_capture_max_offset: int  # highest capture point = num_layers - 1 + this
    fc_num_aux: Literal["fixed3", "config", "vllm"]  # fc width from 3, the id list length,
    # or vLLM's rule (num_aux_hidden_states, else eagle_config ids, else 3: schema.num_aux)
    qkv_bias: Literal["never", "config"]
    input_norm: Support  # norm_before_fc (one RMSNorm over the concatenated aux states)
    input_norm_flag_paths: tuple[tuple[str, ...], ...]
    fc_norm: Support  # per-aux RMSNorm
    norm_before_residual: Support
    norm_output: Support
    embedding: Literal["target-unless-hidden-differs", "own-else-target", "own-else-verifier"]
    multi_layer: bool  # loads layers.1.. (num_hidden_layers > 1)
    casts_float32: bool  # serves in the model dtype (bf16/fp16): float32 weights are cast
    refusal_effect: str  # what the user sees when a key is refused/dropped
    aux_ids_fallback: tuple[str, ...] = ()  # places (auxlayers.PLACES) read when aux_place has
    # no ids, in the same convention (vLLM's V1 runner: eagle_config)

    @property
    def aux_place(self) -> str:
        """Where this engine reads explicit aux ids: a key of auxlayers.PLACES."""
        return "eagle_config" if self.aux_ids_path[0] == "eagle_config" else "top-level"


SGLANG = EngineProfile(
    name="sglang",
    title="SGLang, portable (every release seen: <=0.5.x midlayer loader and 0.5.23)",
    config_layout="flat",
    layer_prefixes=("midlayer.",),
    key_renames=(),
    unknown_keys="drop",
    architectures=("LlamaForCausalLMEagle3",),
    aux_ids_path=("eagle_config", "eagle_aux_hidden_state_layer_ids"),
    aux_convention="sglang",
    aux_capture_max_offset=0,
    fc_num_aux="fixed3",
    qkv_bias="never",
    input_norm="never",
    input_norm_flag_paths=(),
    fc_norm="never",
    norm_before_residual="never",
    norm_output="never",
    embedding="target-unless-hidden-differs",
    multi_layer=False,
    casts_float32=True,
    refusal_effect="SGLang skips it without a word and serves its freshly initialised "
                   "parameter instead",
)

SGLANG_0523 = dataclasses.replace(
    SGLANG,
    name="sglang-0.5.23",
    title="SGLang 0.5.23 exactly (the project's pin; checked against its source)",
    layer_prefixes=("midlayer.", "layers.0."),
    key_renames=(("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"),
                 ("aux_norm_mid", "fc_norm.1"), ("aux_norm_high", "fc_norm.2")),
    fc_num_aux="config",
    input_norm="config",
    input_norm_flag_paths=(("eagle_config", "norm_before_fc"), ("norm_before_fc",)),
    fc_norm="config",
    norm_output="config",
    multi_layer=True,
    architectures=("LlamaForCausalLMEagle3", MLA_ARCHITECTURE),
)

#: SGLang 0.5.23 with the MLA drafter class (srt/models/kimi_k25_eagle3.py): `layers.0.` ->
#: `midlayer.` (a `midlayer.` key loads too), other keys under `model.`; an unknown name is
#: skipped with the warning "Eagle3 MLA: skipping unexpected weight"; no input_norm;
#: fc_norm from `fc_norm`/`use_aux_norm`; `norm_output`; num_hidden_layers must be 1.
SGLANG_0523_MLA = dataclasses.replace(
    SGLANG_0523,
    title="SGLang 0.5.23, Eagle3DeepseekV2ForCausalLM (MLA drafter of Kimi-K2.x)",
    key_renames=(("midlayer", "layers.0"),),
    unknown_keys="warn-drop",
    input_norm="never",
    input_norm_flag_paths=(),
    multi_layer=False,
    refusal_effect="SGLang logs 'Eagle3 MLA: skipping unexpected weight' and serves its "
                   "freshly initialised parameter instead",
)

VLLM = EngineProfile(
    name="vllm",
    title="vLLM 0.25.1 (Eagle3LlamaForCausalLM; speculators configs via its adapter; the V2 "
          "model runner, its default for non-MoE targets)",
    config_layout="flat",  # speculators configs are flattened by vLLM's adapter
    layer_prefixes=("midlayer.", "layers.0."),
    key_renames=(("midlayer.", "layers.0."),),
    unknown_keys="raise",
    architectures=("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"),
    aux_ids_path=("eagle_aux_hidden_state_layer_ids",),
    aux_convention="vllm",
    aux_capture_max_offset=1,  # id N = the last layer's output (speculators' --include-last-layer)
    fc_num_aux="vllm",
    qkv_bias="config",
    input_norm="config",
    input_norm_flag_paths=(("eagle_config", "norm_before_fc"), ("norm_before_fc",)),
    fc_norm="config",
    norm_before_residual="config",
    norm_output="config",
    embedding="own-else-target",
    multi_layer=True,
    casts_float32=True,
    refusal_effect="vLLM raises ValueError ('There is no module or parameter named ...', "
                   "vllm/model_executor/models/utils.py AutoWeightsLoader) while loading and "
                   "the server does not start",
)

#: vLLM 0.25.1 under its V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0, MoE targets, pipeline
#: parallelism): explicit ids from the top level, else from eagle_config, neither shifted
#: (vllm/v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config). Not a choice of
#: `eagle3lab inspect --engine`: preflight picks it for a launch that runs the V1 runner.
VLLM_V1 = dataclasses.replace(
    VLLM, title="vLLM 0.25.1, V1 model runner (aux ids also read from eagle_config)",
    aux_ids_fallback=("eagle_config",))

SPECULATORS = EngineProfile(
    name="speculators",
    title="speculators 0.9 Eagle3DraftModel.from_pretrained (training, evaluation)",
    config_layout="speculators",
    layer_prefixes=("layers.0.",),
    key_renames=(),
    unknown_keys="warn-drop",
    architectures=("llama", "qwen3"),  # transformer_layer_config.model_type (model_classes)
    aux_ids_path=("eagle_aux_hidden_state_layer_ids",),
    aux_convention="vllm",
    aux_capture_max_offset=1,
    fc_num_aux="config",
    qkv_bias="config",
    input_norm="config",
    input_norm_flag_paths=(("norm_before_fc",),),
    fc_norm="config",
    norm_before_residual="config",
    norm_output="config",
    embedding="own-else-verifier",
    multi_layer=True,
    casts_float32=False,
    refusal_effect="transformers logs it as an unexpected key and ignores it; a missing "
                   "parameter is freshly initialised",
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (SGLANG, SGLANG_0523, VLLM, SPECULATORS)}
ENGINES = tuple(PROFILES)

#: Engine to check against when none is given: where each format is usually served.
DEFAULT_ENGINE = {"eagle3": "sglang", "speculators": "vllm", "unknown": "sglang"}


def get_profile(engine: str) -> EngineProfile:
    if engine not in PROFILES:
        raise UserError(f"Unknown engine {engine!r}; choose one of {', '.join(ENGINES)}.")
    return PROFILES[engine]


def drafter_profile(profile: EngineProfile, architectures, *,
                    vllm_runner: str | None = None) -> EngineProfile:
    """The profile of the drafter class the engine picks from `architectures[0]`: SGLang
    0.5.23 builds the MLA drafter with its own loader (SGLANG_0523_MLA); vLLM's V1 model
    runner (`vllm_runner="v1"`) also reads eagle_config's aux ids (VLLM_V1)."""
    first = architectures[0] if architectures else None
    if profile.name == SGLANG_0523.name and first == MLA_ARCHITECTURE:
        return SGLANG_0523_MLA
    if profile.name == VLLM.name and vllm_runner == "v1":
        return VLLM_V1
    return profile


def engine_key(profile: EngineProfile, key: str) -> str:
    """A checkpoint key as the engine renames it before looking for its parameter."""
    for old, new in profile.key_renames:
        if old in key:
            key = key.replace(old, new)
    return key


def layer_parts(layer: int, *, attention_bias: bool, mla: bool = False) -> list[str]:
    """Checkpoint-relative names of one decoder layer's tensors (layer 0 has hidden_norm);
    `mla`: multi-latent attention projections instead of q/k/v."""
    parts = list(MLA_ATTN_PARTS if mla else ATTN_PARTS) + list(MLP_PARTS) + list(NORM_PARTS)
    if attention_bias and not mla:
        parts += list(ATTN_BIAS_PARTS)
    if layer == 0:
        parts += list(FIRST_LAYER_EXTRA)
    return parts


def capture_range(profile: EngineProfile, num_layers: int) -> tuple[int, int]:
    """Capture points the engine can produce: inputs of layers 0..N-1 (+ the final output)."""
    return 0, num_layers - 1 + profile.aux_capture_max_offset
