"""Serving-path emulation: the drafter exactly as an engine would end up holding it.

Prevents predicting acceptance from the checkpoint as trained when the server runs
something else: `load_as(ckpt, engine)` applies the engine's renames, drops the keys it
drops (their parameters stay at fresh initialisation, as in the engine), refuses where the
engine refuses, swaps in the target's embedding/head where the engine does, turns d2t into
the engine's hot-token ids, and says which aux capture points and norm variants the engine
will use. The result is in speculators naming, so `build_model` can run it on a CPU with
speculators' own Eagle3DraftModel (offline acceptance: eagle3lab.specdec).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from eagle3lab.errors import UserError
from eagle3lab.formats.convert import to_speculators_config
from eagle3lab.formats.detect import DraftConfig, canonical_key, parse_draft_config
from eagle3lab.formats.opened import drafter_from
from eagle3lab.formats.profiles import INPUT_NORM, EngineProfile, engine_key, get_profile
from eagle3lab.formats.reader import Checkpoint
from eagle3lab.formats.schema import (applies, draft_tensors, engine_capture, engine_param_keys,
                                      engine_target_hidden, num_aux)
from eagle3lab.formats.targetinfo import target_info, target_tensor

if TYPE_CHECKING:
    from eagle3lab.formats.opened import OpenedDrafter

#: Stand-in for an engine's uninitialised parameters (SGLang/vLLM allocate torch.empty;
#: RMSNorm weights start at ones). Seeded, so predictions are reproducible.
FRESH_STD = 0.02


class EngineRefusal(UserError):
    """The engine would refuse to load this checkpoint (the server would not start)."""


@dataclasses.dataclass
class EngineState:
    engine: str
    state: dict[str, Any]  # speculators naming -> tensor, as the engine holds it
    sources: dict[str, str]  # name -> "checkpoint:KEY" | "fresh" | "target" | "tied:..."
    dropped: list[str]  # checkpoint keys the engine ignored
    hot_token_ids: Any  # draft id -> target id (None: full vocabulary head)
    capture_points: list[int] | None  # target layers whose inputs feed fc
    applies: dict[str, bool]  # norm variants the engine applies
    config: DraftConfig
    notes: list[str]

    @property
    def fresh(self) -> list[str]:
        return sorted(k for k, v in self.sources.items() if v == "fresh")

    def summary(self) -> dict[str, Any]:
        return {"engine": self.engine, "fresh": self.fresh, "dropped": self.dropped,
                "replaced": sorted(k for k, v in self.sources.items() if v != "fresh"
                                   and not v.startswith("checkpoint:")),
                "capture_points": self.capture_points, "applies": self.applies,
                "notes": self.notes}


def load_as(checkpoint: str | os.PathLike | OpenedDrafter, engine: str, *,
            target: str | os.PathLike | None = None, seed: int = 0) -> EngineState:
    """The drafter state `engine` would end up with (see the module docstring).
    `checkpoint`: a path (located first: formats/locate.py) or an `OpenedDrafter`
    (formats/opened.py), whose headers are not read again."""
    profile = get_profile(engine)
    with drafter_from(checkpoint) as drafter:
        return _load_as(drafter.checkpoint, profile, target=target, seed=seed)


def _load_as(ck: Checkpoint, profile: EngineProfile, *, target: str | os.PathLike | None,
             seed: int) -> EngineState:
    import torch

    if ck.problems:
        raise EngineRefusal("; ".join(f"{p.file}: {p.message}" for p in ck.problems))
    cfg = parse_draft_config(ck.config)
    _config_refusals(profile, cfg)
    tinfo = target_info(target) if target is not None else None
    n_aux = num_aux(cfg, profile)
    built = draft_tensors(cfg, n_aux=n_aux, target_hidden=engine_target_hidden(cfg))
    params = engine_param_keys(profile, cfg)
    canon_params = {canonical_key(engine_key(profile, p)) for p in params} - {"d2t", "t2d"}
    canon_params = {p for p in canon_params if p in built and not p.startswith("verifier_")}
    state: dict[str, Any] = {}
    sources: dict[str, str] = {}
    dropped: list[str] = []
    hot = None
    for key in ck.tensors:
        ek = engine_key(profile, key)
        if ek not in params:
            if profile.unknown_keys == "raise" and not (profile.name == "vllm"
                                                        and key.endswith(".bias")):
                raise EngineRefusal(f"{profile.name} has no parameter for {key!r} and raises "
                                    f"while loading ({profile.refusal_effect}).")
            dropped.append(key)
            continue
        canon = canonical_key(ek)
        t = ck.tensor(key)
        if canon == "d2t":
            hot = t.to(torch.int64) + torch.arange(t.numel())
            if profile.name == "speculators":
                state["d2t"], sources["d2t"] = t.clone(), f"checkpoint:{key}"
            continue
        if canon == "t2d":
            if profile.name == "speculators":
                state["t2d"], sources["t2d"] = t.clone(), f"checkpoint:{key}"
            continue  # SGLang and vLLM skip it
        if canon.startswith("verifier_"):
            continue  # training-only copies of the target's head/norm
        if canon not in built:
            dropped.append(key)
            continue
        exp = built[canon].shape
        if exp is not None and tuple(t.shape) != exp:
            raise EngineRefusal(f"{profile.name} builds {canon} as {list(exp)} from the config "
                                f"but the checkpoint's {key} is {list(t.shape)}: the shape "
                                f"check in its weight loader fails.")
        state[canon], sources[canon] = t.clone(), f"checkpoint:{key}"
    gen = torch.Generator().manual_seed(seed)
    for name in sorted(canon_params - set(state)):
        shape = built[name].shape
        if shape is None:
            continue
        if name.endswith("norm.weight") or ".fc_norm." in name or name.startswith("fc_norm."):
            state[name] = torch.ones(shape)
        else:
            state[name] = FRESH_STD * torch.randn(shape, generator=gen)
        sources[name] = "fresh"
    notes = _swap_in_target(profile, cfg, state, sources, target)
    vocab = cfg.vocab_size or (tinfo.vocab_size if tinfo else None)
    if hot is None and profile.name == "vllm" and cfg.draft_vocab_size and vocab and \
            cfg.draft_vocab_size < vocab:
        hot = torch.arange(cfg.draft_vocab_size)  # draft_id_to_target_id stays zeros
        notes.append("No d2t: vLLM keeps draft_id_to_target_id at zeros, so draft id i is "
                     "served as target id i (llama_eagle3.py:304-307, :419-420).")
    n_layers = tinfo.num_layers if tinfo else cfg.recorded_num_layers()
    capture, default = engine_capture(profile, cfg, n_layers)
    if default:
        notes.append(f"{profile.name} captures its default aux layers {capture}.")
    return EngineState(
        engine=profile.name, state=state, sources=sources, dropped=sorted(dropped),
        hot_token_ids=hot, capture_points=capture,
        applies={f: applies(profile, cfg, f) for f in (
            "norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")},
        config=cfg, notes=notes)


def _config_refusals(profile: EngineProfile, cfg: DraftConfig) -> None:
    if profile.config_layout == "flat" and cfg.layout == "speculators" and \
            profile.name != "vllm":
        raise EngineRefusal(f"{profile.name} picks the model class from architectures[0] "
                            f"({cfg.architectures}) and has none for a speculators config; "
                            f"convert with `eagle3lab convert --to sglang`.")
    if profile.config_layout == "speculators" and cfg.layout != "speculators":
        raise EngineRefusal(f"{profile.name} loads speculators configs; convert with "
                            f"`eagle3lab convert --to speculators` first.")
    if cfg.hidden_size is None:
        raise EngineRefusal("The config has no hidden_size; no engine can build this draft.")


def _swap_in_target(profile: EngineProfile, cfg: DraftConfig, state: dict[str, Any],
                    sources: dict[str, str], target) -> list[str]:
    notes: list[str] = []
    own = sources.get("embed_tokens.weight", "fresh").startswith("checkpoint:")
    if profile.embedding == "target-unless-hidden-differs":
        differs = cfg.target_hidden_size_stated and cfg.target_hidden_size != cfg.hidden_size
        want_target = not differs
    else:  # own-else-target (vLLM), own-else-verifier (speculators)
        want_target = not own
    if want_target:
        if target is None:
            notes.append(f"{profile.name} uses the target's embedding; no target given, so the "
                         f"draft's {'own' if own else 'fresh'} embedding stands in for it.")
        else:
            state["embed_tokens.weight"] = target_tensor(target, "embed").clone()
            sources["embed_tokens.weight"] = "target"
    tied = profile.name.startswith("sglang") and cfg.tie_word_embeddings
    head_from_target = (profile.name.startswith("sglang") and cfg.draft_vocab_size is None) or (
        profile.name == "vllm" and sources.get("lm_head.weight", "fresh") == "fresh"
        and cfg.draft_vocab_size is not None and cfg.vocab_size is not None
        and cfg.draft_vocab_size >= cfg.vocab_size)
    if tied:
        state["lm_head.weight"] = state.get("embed_tokens.weight")
        sources["lm_head.weight"] = "tied:embed_tokens.weight"
        notes.append("tie_word_embeddings: SGLang's head is the (target's) embedding.")
    elif head_from_target:
        if target is None:
            notes.append(f"{profile.name} takes the head from the target; no target given.")
        else:
            state["lm_head.weight"] = target_tensor(target, "head").clone()
            sources["lm_head.weight"] = "target"
    if INPUT_NORM in state and not applies(profile, cfg, "norm_before_fc"):
        state.pop(INPUT_NORM)
    return notes


def build_model(es: EngineState, *, attn: str = "sdpa"):
    """A speculators Eagle3DraftModel that computes what the engine computes (CPU ok)."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    cfg = es.config
    if cfg.layout == "speculators":
        spec = dict(cfg.raw)
    else:
        spec = to_speculators_config(cfg, None, {"ids": None, "capture_points": None,
                                                 "convention": "vllm", "num_layers": None})
    spec.pop("eagle3lab", None)
    spec["eagle_aux_hidden_state_layer_ids"] = es.capture_points
    for flag, on in es.applies.items():
        spec[flag] = on
    head = es.state.get("lm_head.weight")
    if head is not None and es.hot_token_ids is None and cfg.vocab_size and \
            head.shape[0] == cfg.vocab_size:
        spec["draft_vocab_size"] = cfg.vocab_size
    config = Eagle3SpeculatorConfig(**spec)
    config.transformer_layer_config._attn_implementation = attn
    model = Eagle3DraftModel(config)
    state = {k: v for k, v in es.state.items() if k not in ("d2t", "t2d")}
    if es.hot_token_ids is not None and model.use_draft_vocab:
        vocab = model.t2d.numel()
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[es.hot_token_ids] = True
        model.load_vocab_mappings(t2d, es.hot_token_ids - torch.arange(es.hot_token_ids.numel()))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("verifier_") and k not in ("d2t", "t2d")]
    if missing or unexpected:
        raise EngineRefusal(f"The emulated state does not fit speculators' Eagle3DraftModel "
                            f"(missing {missing}, unexpected {unexpected}).")
    return model.eval()
