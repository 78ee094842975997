"""Small real checkpoints to demonstrate and test the doctor, built with speculators' classes.

Prevents the doctor being tested only on hand-made dictionaries that drift from what the
training library really writes: the speculators-format drafts here come from
`speculators.models.eagle3.Eagle3DraftModel(...).save_pretrained`, the SGLang-format ones
from `convert_checkpoint`, and the target is a real (tiny, random) transformers Llama.
Everything is seeded, tiny (hidden 64) and builds in about a second on a CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from eagle3lab.errors import UserError
from eagle3lab.formats.detect import RECORD_KEY
from eagle3lab.formats.targetinfo import target_tensor


def make_tiny_target(path: str | os.PathLike, *, layers: int = 8, hidden: int = 64,
                     vocab: int = 256, max_pos: int = 512, weights: bool = True,
                     seed: int = 0) -> Path:
    """A random tiny Llama saved with save_pretrained (config only if weights=False)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_pos, tie_word_embeddings=False,
                      architectures=["LlamaForCausalLM"])
    path.mkdir(parents=True, exist_ok=True)
    if weights:
        torch.manual_seed(seed)
        with _quiet_saving():
            LlamaForCausalLM(cfg).save_pretrained(path)
    else:
        cfg.save_pretrained(path)
    return path


@contextlib.contextmanager
def _quiet_saving():
    """No "Writing model shards" progress bar in notebooks and test logs."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def zipf_counts(vocab: int, *, seed: int = 0, exponent: float = 1.1):
    """Synthetic token counts (a shuffled Zipf law) standing in for real frequencies."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ranks = torch.randperm(vocab, generator=g) + 1
    return (1e6 / ranks.double() ** exponent).round().to(torch.int64)


def vocab_map(counts, draft_vocab: int):
    """(d2t offsets, t2d mask) for the draft_vocab most frequent tokens (ties: lower id)."""
    import torch

    keep = torch.sort(torch.sort(-counts, stable=True).indices[:draft_vocab]).values
    t2d = torch.zeros(counts.numel(), dtype=torch.bool)
    t2d[keep] = True
    return keep - torch.arange(draft_vocab), t2d


def make_speculators_draft(path: str | os.PathLike, *, target: str | os.PathLike,
                           draft_vocab: int = 128, aux_ids: list[int] | None = None,
                           norm_before_fc: bool = False, norm_before_residual: bool = False,
                           record: bool = True, seed: int = 0, counts=None) -> Path:
    """A speculators-format EAGLE-3 draft for `target`, saved by speculators itself.

    aux_ids are in speculators' (vLLM's) convention: capture point = id. Every parameter is
    filled with seeded values (no NaN placeholders), so round trips are meaningful.
    """
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    target = Path(target)
    tcfg = AutoConfig.from_pretrained(target)
    layer = type(tcfg)(**{**tcfg.to_dict(), "num_hidden_layers": 1})
    layer._attn_implementation = "sdpa"
    n = tcfg.num_hidden_layers
    ids = aux_ids if aux_ids is not None else [2, n // 2, n - 3]
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=draft_vocab,
        norm_before_fc=norm_before_fc, norm_before_residual=norm_before_residual,
        eagle_aux_hidden_state_layer_ids=ids,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            verifier=VerifierConfig(name_or_path=str(target.resolve()),
                                    architectures=list(tcfg.architectures or []))))
    torch.manual_seed(seed)
    model = Eagle3DraftModel(cfg)
    counts = zipf_counts(tcfg.vocab_size, seed=seed) if counts is None else counts
    d2t, t2d = vocab_map(counts, draft_vocab)
    model.load_vocab_mappings(t2d, d2t)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        try:  # as speculators' load_verifier_weights does: the verifier's own embedding
            model.embed_tokens.weight.copy_(target_tensor(target, "embed"))
        except UserError:  # a config-only target: keep the seeded values
            pass
    with _quiet_saving():
        model.save_pretrained(path)
    if record:
        _add_record(Path(path), {"aux_layers": {
            "capture_points": list(ids), "convention": "vllm", "requested_ids": list(ids),
            "num_layers": n}, "target": {"path": str(target.resolve()), "num_layers": n}})
    return Path(path)


def _add_record(path: Path, record: dict[str, Any]) -> None:
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[RECORD_KEY] = {**cfg.get(RECORD_KEY, {}), **record}
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def make_demo_pair(root: str | os.PathLike, *, seed: int = 0) -> dict[str, Path]:
    """A tiny target, a good SGLang-format draft and a faulty copy of it, under `root`.

    The faulty copy has a NaN in its head, a d2t rewritten as absolute ids instead of
    offsets, and its aux ids moved to the top level, where SGLang does not read them.
    """
    import torch
    from safetensors.torch import load_file, save_file

    # lazy: a test patches eagle3lab.formats.convert.convert_checkpoint
    from eagle3lab.formats.convert import convert_checkpoint

    root = Path(root)
    target = make_tiny_target(root / "target", seed=seed)
    spec = make_speculators_draft(root / "draft-speculators", target=target, seed=seed,
                                  aux_ids=[1, 4, 6])
    good = convert_checkpoint(spec, root / "draft-sglang", to="sglang", target=target).path
    bad = root / "draft-sglang-faulty"
    bad.mkdir(parents=True, exist_ok=True)
    state = load_file(str(good / "model.safetensors"))
    state["lm_head.weight"][3, 5] = float("nan")
    state["d2t"] = state["d2t"] + torch.arange(state["d2t"].numel())
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((good / "config.json").read_text())
    ids = cfg.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
    cfg["eagle_aux_hidden_state_layer_ids"] = ids
    (bad / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return {"target": target, "speculators": spec, "good": good, "faulty": bad}
