"""The drafter: speculators' Eagle3DraftModel built, loaded and checked against shards.

Prevents a drafter built for other features: its hidden size, aux layers (written in the
vLLM convention = capture points, with the SGLang ids and the convention recorded beside
them), target vocab and draft vocab map all come from the shard manifest, and shards that
do not match a drafter (eval split, `init_from` checkpoint, a saved drafter evaluated on
them) are refused before any step, naming both values. Also prevents a drafter saved
without `embed_tokens` loading with a zero embedding (`load_drafter`), and a drafter
trained with speculators flags some engine does not serve without a word: `build_drafter`
says which engines would not serve them, by the doctor's rules (`serving_warning`).

`resolve_draft_attn` turns TrainConfig.draft_attn into the kernel a run uses, refusing
(in one line) flex attention where its training step cannot run: with "sdpa"/"eager"
speculators 0.9.0 builds a DENSE mask over the packed batch (`create_mask` /
`create_float_mask`, widened by `extend_dense_mask_for_draft_tokens` at each TTT step),
with "simple_flex_attention" a block-sparse `BlockMask` (`create_block_mask`, widened by
`extend_mask_for_draft_tokens`, in whole blocks of FLEX_BLOCK tokens).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from eagle3lab.errors import UserError
from eagle3lab.formats.doctor import serving_engines_of_config, serving_line
from eagle3lab.formats.reader import Checkpoint
from eagle3lab.train.config import ENGINE_PROFILES


#: speculators' BlockMask block (torch's flex default): `extend_mask_for_draft_tokens`
#: appends whole blocks per TTT step, so a packed length not a multiple of it fails at TTT
#: step 1 ("block_mask was created for block_mask.shape=(1, 1, 384, 768) but got q_len=300
#: and kv_len=600"): flex needs every batch, eval ones too, padded to such a length.
FLEX_BLOCK = 128
FLEX = "simple_flex_attention"


def flex_backward_problem(device: str) -> str | None:
    """Why flex attention cannot train (forward + backward) on `device`, or None: tried on
    a 128-token tensor there (torch 2.13 on the CPU: "FlexAttention does not support
    backward on CPU", NotImplementedError, compiled or not; its forward runs)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q = torch.randn(1, 1, FLEX_BLOCK, 16, device=device, requires_grad=True)
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, FLEX_BLOCK,
                             FLEX_BLOCK, device=device)
    try:
        flex_attention(q, q, q, block_mask=mask).sum().backward()
    except (NotImplementedError, RuntimeError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]} (torch {torch.__version__})"
    return None


def resolve_draft_attn(attn: str, *, device: str, max_tokens: int) -> str:
    """The attention kernel a run on `device` with `max_tokens` packed tokens per batch
    uses: sdpa / eager as asked; "auto": simple_flex_attention on CUDA when
    max_tokens is a multiple of FLEX_BLOCK, else sdpa; simple_flex_attention itself where
    it cannot train is refused, saying why (a UserError, before any model is built)."""
    if attn not in (FLEX, "auto"):
        return attn
    if attn == "auto" and not device.startswith("cuda"):
        return "sdpa"
    problem = (f"max_tokens_per_batch {max_tokens} is not a multiple of {FLEX_BLOCK} "
               f"(speculators extends its BlockMask by whole {FLEX_BLOCK}-token blocks at "
               f"each TTT step)" if max_tokens % FLEX_BLOCK else None)
    if problem is None and not device.startswith("cuda"):
        problem = flex_backward_problem(device)
    if problem is None:
        return FLEX
    if attn == "auto":
        return "sdpa"
    raise UserError(f"draft_attn {FLEX!r} cannot train on {device}: {problem}. Use "
                    f"draft_attn 'sdpa', or 'auto' (flex where it can run, else sdpa).")


def draft_layer_config(target_path: str, *, num_layers: int = 1, attn: str = "sdpa",
                       full_attention: bool = True):
    """A `num_layers`-layer Llama copy of the target's config, as `speculators train`
    builds it (create_transformer_layer_config), with the chosen attention kernel."""
    from speculators.train.cli import create_transformer_layer_config

    tl = create_transformer_layer_config(
        target_path, num_layers=num_layers, draft_arch="llama", hidden_act=None,
        sliding_window=2048, full_attention_indices=list(range(num_layers))
        if full_attention else [])
    tl._attn_implementation = attn
    return tl


def build_drafter(*, target_path: str, aux, d2t, t2d, serve_engine: str = "sglang",
                  ttt_steps: int = 3, num_layers: int = 1, attn: str = "sdpa",
                  flags: Mapping[str, Any] | None = None, warn: bool = False):
    """speculators' Eagle3DraftModel for these shards' target, aux layers and vocab map:
    aux ids written as `aux.vllm_ids` (capture points); embeddings, draft head (rows of
    the target head, by t2d) and the frozen verifier norm/head come from the target via
    speculators' `load_verifier_weights`. `flags`: the speculators flags
    (TrainConfig.drafter_flags; default: ENGINE_PROFILES[serve_engine]); `warn`: print
    `serving_warning`'s line when flags other than serve_engine's leave an engine unable
    to serve the drafter."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    prof = {**ENGINE_PROFILES[serve_engine], **(flags or {})}
    tl = draft_layer_config(target_path, num_layers=num_layers, attn=attn,
                            full_attention=prof["full_attention"])
    verifier = VerifierConfig.from_pretrained(target_path)
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=int(d2t.numel()),
        norm_before_residual=prof["norm_before_residual"],
        norm_before_fc=prof["norm_before_fc"], fc_norm=prof["fc_norm"],
        norm_output=prof["norm_output"], eagle_aux_hidden_state_layer_ids=aux.vllm_ids,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy", verifier=verifier,
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)]))
    model = Eagle3DraftModel(cfg)
    model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()
    if warn and prof != ENGINE_PROFILES[serve_engine] and (line := serving_warning(model)):
        print(line, flush=True)
    return model


def serving_warning(model) -> str | None:
    """One line naming the engines that would not serve this (unsaved) drafter as
    trained, with the doctor's codes (formats.doctor.serving_engines_of_config, the rules
    `eagle3lab inspect` applies to the saved one); None when every engine serves it."""
    verdicts = serving_engines_of_config(model.config.to_dict(), model.state_dict())
    if all(v.serves for v in verdicts.values()):
        return None
    flags = ", ".join(f"{k}={getattr(model.config, k)}" for k in (
        "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"))
    return (f"train: warning: a drafter with {flags} is {serving_line(verdicts)} "
            f"(`eagle3lab inspect DRAFTER --engine E` explains each).")


def load_drafter(path: str | os.PathLike, *, attn: str = "sdpa", target: str | None = None):
    """Load a saved drafter with speculators' own `from_pretrained` (verifier weights are
    read from the target recorded in its config, or from `target` when given: the path in
    config.json may be another machine's), forcing a CPU-capable attention.

    A drafter saved without `embed_tokens` (packed for shipping: engines use the target's
    embedding) would come out of from_pretrained with a ZERO embedding, since speculators
    refills only NaN ones (measured on the default eval shards: position-0 accuracy 0.11
    instead of 0.59); the target's embedding is loaded instead, as the engines do."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.utils.loading import load_model_layers

    cfg = Eagle3SpeculatorConfig.from_pretrained(str(path))
    cfg.transformer_layer_config._attn_implementation = attn
    if target is not None:
        cfg.speculators_config.verifier.name_or_path = str(target)
    model = Eagle3DraftModel.from_pretrained(str(path), config=cfg)
    ck = Checkpoint(path)  # headers only
    shipped_embedding = "embed_tokens.weight" in ck.tensors
    ck.close()
    if not shipped_embedding:
        w = load_model_layers(["embed_tokens.weight"],
                              str(cfg.speculators_config.verifier.name_or_path))
        model.embed_tokens.load_state_dict({"weight": w["embed_tokens.weight"]})
    return model


def match_final_state(model, shards) -> None:
    """Make the drafter compute its targets as the shards' final state needs: speculators
    computes lm_head(verifier_norm(state)) from the input of the final norm; a set holding
    the norm's OUTPUT (SpecForge's `hidden_state`) gets lm_head(state), its verifier norm
    replaced by the identity (never saved: speculators does not save verifier weights).
    Prevents targets normalised twice, which no error would reveal."""
    import torch

    state = shards.manifest.get("final_state", "pre_norm")
    if state == "normed":
        model.verifier_norm = torch.nn.Identity()
    elif state != "pre_norm":
        raise UserError(f"{shards.path}: unknown final_state {state!r} in its manifest.")


def check_drafter_against_shards(drafter_cfg: dict[str, Any], shards, d2t, what: str) -> None:
    """Refuse shards whose features/vocab differ from a drafter config (config.json dict)."""
    import torch

    tl = drafter_cfg["transformer_layer_config"]
    hidden = drafter_cfg.get("target_hidden_size") or tl["hidden_size"]
    t = shards.manifest["target"]
    problems = []
    if hidden != t["hidden_size"]:
        problems.append(f"hidden size: shards {t['hidden_size']}, {what} {hidden}")
    if tl["vocab_size"] != t["vocab_size"]:
        problems.append(f"target vocab size: shards {t['vocab_size']}, {what} {tl['vocab_size']}")
    ids = drafter_cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and list(ids) != shards.aux.vllm_ids:
        problems.append(f"aux layer ids (vLLM convention = capture points): shards "
                        f"{shards.aux.vllm_ids}, {what} {list(ids)}")
    if drafter_cfg.get("d2t") is not None and not torch.equal(drafter_cfg["d2t"], d2t):
        problems.append(f"draft vocab map: {what} has another d2t than the shards' "
                        f"vocab_map.safetensors (regenerating d2t destroys a trained drafter)")
    if problems:
        raise UserError(f"The shards in {shards.path} do not match {what}: "
                        + "; ".join(problems) + ". Use shards extracted for this drafter "
                        "(same target, aux layers and vocab map), or train a new one.")


def init_from(model, path: str, shards, d2t) -> None:
    """Start from a saved speculators drafter after checking it fits the shards."""
    from safetensors.torch import load_file

    p = Path(path)
    if not (p / "config.json").is_file():
        raise UserError(f"init_from {path!r} is not a speculators checkpoint (no config.json).")
    cfg = json.loads((p / "config.json").read_text())
    weights = {}
    for f in sorted(p.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    cfg["d2t"] = weights.get("d2t")
    check_drafter_against_shards(cfg, shards, d2t, f"the drafter in {path}")
    model.load_state_dict(weights, strict=False)
