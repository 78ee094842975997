"""The launch-level checks: findings that only the whole command can show.

Prevents the launch mistakes that the drafter alone does not reveal and that cost a start
on a GPU node or silently cap acceptance: a target class the engine does not capture from
(`aux-capture`), chain/tree settings the engine overrides or refuses (`draft-tokens`), a tp
size that does not divide the heads (`tp-heads`), a context longer than the drafter or the
target supports (`context-length`), a draft vocabulary larger than the target's
(`vocab-map`), a serving dtype that differs from the weights' (`launch-dtype`), more draft
steps than the drafter was trained for or a vLLM launch without num_speculative_tokens
(`draft-tokens`), vLLM 0.25.1's model runner for the launch (`vllm_runner`), and the
start-up messages this command will make the engine print (`startup-warning`, from the
log reader's catalogue, eagle3lab/serverlogs/catalogue.py). Each function takes plain values and
returns `Finding`s of the doctor's type (eagle3lab/formats/findings.py).
"""

from __future__ import annotations

from typing import Any

from eagle3lab.formats.findings import Finding, error, info, warning
from eagle3lab.preflight.capture import CaptureVerdict
from eagle3lab.preflight.command import LaunchSpec
from eagle3lab.serverlogs.catalogue import KNOWN_WARNINGS


def capture_findings(v: CaptureVerdict, *, text_arch: str | None) -> list[Finding]:
    """aux-capture: error where the engine version does not capture from the target class."""
    inner = f" (language model: {text_arch})" if text_arch else ""
    where = f"{v.engine} {v.version}"
    src = ""
    if v.entry:
        src = f" [{v.table}: {v.entry.get('source')}" + (
            f"; {v.entry['via']}" if v.entry.get("via") else "") + "]"
    if v.status == "no":
        return [error("aux-capture", f"{where} does not capture aux hidden states from "
                      f"{v.architecture}{inner} ({v.note}). What happens: "
                      f"{v.absent_behaviour}.{src}", expected="aux capture",
                      found=v.architecture)]
    if v.status == "unknown":
        return [warning("aux-capture", f"Whether {where} captures aux hidden states from "
                        f"{v.architecture}{inner} is not known: {v.note}. Without capture: "
                        f"{v.absent_behaviour}.", found=v.architecture)]
    if v.entry and v.entry.get("caveat"):
        return [warning("aux-capture", f"{where} captures from {v.architecture} in the "
                        f"source read ({v.entry['source']}), but {v.entry['caveat']}.",
                        found=v.architecture)]
    return []


def draft_token_findings(spec: LaunchSpec, *, trained_steps: int | None = None,
                         trained_source: str | None = None) -> list[Finding]:
    """draft-tokens: SGLang (and the reference server) verify steps + 1 tokens in a chain;
    vLLM needs num_speculative_tokens > 0; more draft steps than the drafter was trained to
    draft (its TTT depth) serve, with little acceptance at the late positions."""
    if not spec.speculative:
        return []
    out = _trained_depth_findings(spec, trained_steps, trained_source)
    if spec.engine == "vllm":
        return _vllm_spec_tokens(spec) + out
    S, K, D = spec.steps, spec.topk, spec.draft_tokens
    if K == 1 and S is not None and D is not None and D != S + 1:
        out.append(warning("draft-tokens", f"--speculative-eagle-topk 1 is a chain: SGLang "
                           f"forces --speculative-num-draft-tokens {D} to steps + 1 = {S + 1} "
                           f"(the launch is not what it says; benchmarks label it wrongly).",
                           expected=S + 1, found=D))
    if K is not None and K > 1 and S is not None and D is not None and \
            not 2 <= D <= K * S + 1:
        out.append(error("draft-tokens", f"A tree of topk {K} and {S} steps has at most "
                         f"{K * S + 1} nodes; --speculative-num-draft-tokens {D} is outside "
                         f"2..{K * S + 1}.", expected=[2, K * S + 1], found=D))
    return out


def _vllm_spec_tokens(spec: LaunchSpec) -> list[Finding]:
    """vllm/config/speculative.py (0.25.1): num_speculative_tokens is a pydantic field with
    gt=0, and `_verify_args` raises ValueError when it is None (an EAGLE-3 drafter has no
    n_predict to default it from)."""
    n = spec.steps
    if n is None:
        return [error("draft-tokens", "--speculative-config has no num_speculative_tokens: "
                      "vLLM 0.25.1 refuses to start (ValueError 'num_speculative_tokens must "
                      "be provided with speculative model', config/speculative.py "
                      "_verify_args). Add \"num_speculative_tokens\": N.", expected="> 0")]
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return [error("draft-tokens", f"num_speculative_tokens {n!r}: vLLM 0.25.1 needs an "
                      f"integer > 0 (config/speculative.py: Field(gt=0)) and refuses to "
                      f"start.", expected="> 0", found=n)]
    return []


def _trained_depth_findings(spec: LaunchSpec, trained: int | None,
                            source: str | None) -> list[Finding]:
    """More draft steps than the TTT depth: neither engine checks it (vLLM 0.25.1 accepts
    any num_speculative_tokens > 0 for eagle3 whatever the drafter's speculators_config
    says: that value is read only when the drafter itself is the served model,
    transformers_utils/config.py maybe_override_with_speculators), so the late positions
    are drafted from states the drafter never learned from."""
    n = spec.steps
    if not trained or not isinstance(n, int) or isinstance(n, bool) or n <= trained:
        return []
    flag = "num_speculative_tokens" if spec.engine == "vllm" else "--speculative-num-steps"
    return [warning("draft-tokens", f"{flag} {n} drafts more positions than the drafter was "
                    f"trained for ({trained}: {source}). The engine serves it, but positions "
                    f"{trained + 1}..{n} are drafted from the drafter's own states beyond its "
                    f"training depth: their acceptance falls and each still costs a draft "
                    f"forward. Use {flag} <= {trained}, or retrain with ttt_steps >= {n}.",
                    expected=trained, found=n)]


#: vLLM 0.25.1's model runner for this launch: config/vllm.py `use_v2_model_runner`
#: (VLLM_USE_V2_MODEL_RUNNER, else V2 for a non-MoE target unless a feature V2 lacks is
#: on, e.g. EAGLE-3 with pipeline parallelism), `_is_default_v2_model_runner_model`
#: (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES), model_arch_config_convertor.py get_num_experts.
V2_MOE_ARCHITECTURES = ("DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM")
_EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")


def vllm_runner(spec: LaunchSpec, *, target_cfg: dict | None,
                env: dict[str, str] | None = None) -> tuple[str, str]:
    """("v1" | "v2", why) for a vLLM 0.25.1 launch."""
    env = {**(spec.flags.get("env") or {}), **(env or {})}
    value = env.get("VLLM_USE_V2_MODEL_RUNNER")
    if value is not None:
        on = value.strip().lower() in ("1", "true", "yes")
        return ("v2" if on else "v1"), f"VLLM_USE_V2_MODEL_RUNNER={value}"
    if (spec.flags.get("pipeline_parallel_size") or 1) > 1:
        return "v1", "EAGLE-3 with pipeline parallelism runs the V1 model runner " \
                     "(config/vllm.py _get_v2_model_runner_unsupported_features)"
    text = (target_cfg or {}).get("text_config") if isinstance(
        (target_cfg or {}).get("text_config"), dict) else (target_cfg or {})
    archs = (target_cfg or {}).get("architectures") or []
    moe = any(isinstance(text.get(k), (int, list)) and text.get(k) for k in _EXPERT_KEYS)
    if moe and not any(a in V2_MOE_ARCHITECTURES for a in archs):
        return "v1", "a MoE target runs vLLM 0.25.1's V1 model runner by default " \
                     "(config/vllm.py use_v2_model_runner)"
    unread = "" if target_cfg else "; the target was not read: a MoE target gets V1"
    return "v2", "vLLM 0.25.1's default for a non-MoE target (config/vllm.py " \
                 f"use_v2_model_runner; VLLM_USE_V2_MODEL_RUNNER=0 picks V1{unread})"


def _heads(cfg: dict[str, Any]) -> tuple[int | None, int | None]:
    nh = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads", nh)
    return (nh if isinstance(nh, int) else None), (kv if isinstance(kv, int) else None)


def tp_findings(spec: LaunchSpec, *, target_cfg: dict | None, draft_cfg: dict | None,
                draft_mla: bool = False) -> list[Finding]:
    """tp-heads: every attention head count must split over tp (SGLang and vLLM assert)."""
    out: list[Finding] = []
    for who, cfg, tp in (("target", target_cfg, spec.tp),
                         ("drafter", draft_cfg, spec.draft_tp or spec.tp)):
        if not cfg or tp <= 1:
            continue
        nh, kv = _heads(cfg)
        mla = draft_mla if who == "drafter" else "kv_lora_rank" in cfg
        if nh is not None and nh % tp:
            out.append(error("tp-heads", f"tp {tp} does not divide the {who}'s "
                             f"{nh} attention heads.", expected=f"a divisor of {nh}", found=tp))
        elif kv is not None and not mla and (kv % tp if kv >= tp else tp % kv):
            out.append(error("tp-heads", f"tp {tp} and the {who}'s {kv} key/value heads: "
                             f"the engine needs one to divide the other (kv heads split "
                             f"over ranks, or replicated).", found=[tp, kv]))
    return out


def context_findings(spec: LaunchSpec, *, draft_max_pos: int | None,
                     target_max_pos: int | None) -> list[Finding]:
    """context-length: the launch's context vs the drafter's and the target's positions."""
    ctx = spec.context_length
    out: list[Finding] = []
    if ctx is None:
        if draft_max_pos and target_max_pos and draft_max_pos < target_max_pos:
            out.append(warning("context-length", f"No context length given: the engine "
                               f"serves the target's {target_max_pos} positions, but the "
                               f"drafter's max_position_embeddings is {draft_max_pos}.",
                               expected=target_max_pos, found=draft_max_pos))
        return out
    if target_max_pos and ctx > target_max_pos:
        out.append(error("context-length", f"Context length {ctx} exceeds the target's "
                         f"max_position_embeddings {target_max_pos} (SGLang refuses it unless "
                         f"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set; vLLM refuses).",
                         expected=target_max_pos, found=ctx))
    if draft_max_pos and ctx > draft_max_pos:
        out.append(warning("context-length", f"Context length {ctx} exceeds the drafter's "
                           f"max_position_embeddings {draft_max_pos}: beyond it the draft's "
                           f"positions are out of range and acceptance collapses.",
                           expected=ctx, found=draft_max_pos))
    return out


def vocab_findings(*, draft_vocab: int | None, target_vocab: int | None) -> list[Finding]:
    """vocab-map: a draft vocabulary larger than the target's cannot be mapped into it."""
    if draft_vocab and target_vocab and draft_vocab > target_vocab:
        return [error("vocab-map", f"draft_vocab_size {draft_vocab} exceeds the target's "
                      f"vocabulary {target_vocab}: draft ids cannot map to target ids.",
                      expected=target_vocab, found=draft_vocab)]
    return []


_FLOAT = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
          "half": "float16", "fp16": "float16", "float32": "float32", "float": "float32"}


def dtype_findings(spec: LaunchSpec, *, draft_dtype: str | None,
                   target_dtype: str | None) -> list[Finding]:
    """launch-dtype: the serving dtype vs the weights' (auto = the target's config dtype)."""
    asked = _FLOAT.get((spec.dtype or "auto").lower())
    serve = asked or _FLOAT.get((target_dtype or "").lower())
    out: list[Finding] = []
    for who, have in (("target", target_dtype), ("drafter", draft_dtype)):
        have = _FLOAT.get((have or "").lower())
        if not serve or not have or have == serve:
            continue
        if serve == "float16" and have == "bfloat16":
            out.append(warning("launch-dtype", f"Serving in float16 but the {who} was saved in "
                               f"bfloat16: activations beyond float16's range overflow.",
                               expected="bfloat16", found=serve))
        elif serve == "float32" and who == "target":
            out.append(warning("launch-dtype", f"Serving in float32 a {have} target doubles "
                               f"its memory and halves throughput.", expected=have,
                               found=serve))
    return out


def startup_warning_findings(spec: LaunchSpec, *, draft_dir: str | None,
                             target_cfg: dict | None) -> list[Finding]:
    """startup-warning: catalogue entries this SGLang command will trigger, explained."""
    from pathlib import Path

    if spec.engine != "sglang":
        return []
    fires: list[str] = []
    if spec.flags.get("attention_backend") is None:
        fires.append("attention-backend-default")
    if spec.speculative and spec.flags.get("max_running_requests") is None:
        fires.append("max-running-requests-reset")
    if spec.speculative and spec.topk == 1 and spec.draft_tokens is not None and \
            spec.steps is not None and spec.draft_tokens != spec.steps + 1:
        fires.append("draft-tokens-adjusted")
    if spec.flags.get("disable_cuda_graph"):
        fires.append("disable-cuda-graph-deprecated")
    if spec.speculative and draft_dir and not (Path(draft_dir) / "generation_config.json"
                                               ).is_file():
        fires.append("generation-config-missing")
    quant = (target_cfg or {}).get("quantization_config") or {}
    if isinstance(quant, dict) and quant.get("quant_method") == "fp8" and \
            quant.get("scale_fmt") != "ue8m0":
        fires.append("deepgemm-scale-fmt")
    by_id = {w["id"]: w for w in KNOWN_WARNINGS}
    out = []
    for wid in fires:
        w = by_id[wid]
        make = warning if w["severity"] in ("warning", "error") else info
        out.append(make("startup-warning", f"[{wid}] {w['explanation']}", found=wid))
    return out
