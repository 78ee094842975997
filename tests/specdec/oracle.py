"""Drafters for engine tests. An oracle drafter: it knows the target's greedy continuation and
proposes it, corrupting a seeded fraction of its guesses. It implements the Drafter
interface (reset/cache_len/project/forward/crop/to_target_ids) with a full-vocabulary
head and ignores the features, so the only thing under test is the engine's verify loop
and cache handling: whatever the oracle proposes, the output must equal plain greedy."""

from __future__ import annotations

import copy
import random
from typing import Any

import torch


class OracleDrafter:
    def __init__(self, sequence: list[int], vocab: int, hidden: int, wrong: float = 0.3,
                 seed: int = 0):
        self.seq = sequence  # prompt + the target's greedy continuation
        self.vocab, self.hidden_size, self.draft_vocab_size = vocab, hidden, vocab
        self.wrong, self.rng = wrong, random.Random(seed)
        self.hot_ids = torch.arange(vocab)
        self.entries: list[int] = []
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def reset(self):
        self.entries = []

    @property
    def cache_len(self):
        return len(self.entries)

    def project(self, feats):
        return torch.zeros(feats.shape[0], self.hidden_size)

    def crop(self, n):
        self.entries = self.entries[:n]

    def to_target_ids(self, ids):
        return ids

    def forward(self, token_ids, hidden, positions, mask=None):
        n = token_ids.shape[0]
        logits = torch.full((n, self.vocab), -10.0)
        for r, (t, p) in enumerate(zip(token_ids.tolist(), positions.tolist())):
            self.entries.append(t)
            on_track = p < len(self.seq) and self.seq[p] == t
            nxt = self.seq[p + 1] if on_track and p + 1 < len(self.seq) else None
            if nxt is None or self.rng.random() < self.wrong:
                guess = self.rng.randrange(self.vocab)
                logits[r, guess] = 5.0
                if nxt is not None:
                    logits[r, nxt] = 4.0  # the right token is second best (trees find it)
            else:
                logits[r, nxt] = 5.0
                logits[r, (nxt + 1) % self.vocab] = 4.0
        return logits, torch.zeros(n, self.hidden_size)


def drafter_config_from_target(target_config, *, draft_vocab_size: int, aux_ids: list[int],
                               norm_before_fc: bool = False, verifier_path: str | None = None,
                               attn_implementation: str = "sdpa"):
    """An Eagle3SpeculatorConfig for a one-layer drafter of `target_config`'s shape."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    layer_cfg = copy.deepcopy(target_config)
    layer_cfg.num_hidden_layers = 1
    layer_cfg._attn_implementation = attn_implementation
    if hasattr(layer_cfg, "quantization_config"):
        del layer_cfg.quantization_config
    verifier = VerifierConfig(name_or_path=verifier_path, architectures=list(
        target_config.architectures or ["LlamaForCausalLM"]))
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer_cfg, draft_vocab_size=draft_vocab_size,
        norm_before_residual=False, norm_before_fc=norm_before_fc,
        target_hidden_size=target_config.hidden_size,
        eagle_aux_hidden_state_layer_ids=list(aux_ids),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy", verifier=verifier))


def random_drafter(target, *, draft_vocab_size: int | None = None, seed: int = 0,
                   d2t=None, t2d=None) -> Any:
    """An untrained speculators Eagle3DraftModel for `target` (embeddings from the target).

    In memory, for targets that exist only in memory (the statistical test's 12-token
    model); saved drafters come from eagle3lab.formats.demo.make_speculators_draft.
    """
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    torch.manual_seed(seed)
    vocab = target.vocab_size
    n = draft_vocab_size or vocab
    cfg = drafter_config_from_target(target.model.config, draft_vocab_size=n,
                                     aux_ids=target.aux_layers().vllm_ids)
    model = Eagle3DraftModel(cfg)
    if n != vocab:
        if d2t is None:  # the first n ids: a valid map (offsets all 0)
            d2t = torch.zeros(n, dtype=torch.long)
            t2d = torch.zeros(vocab, dtype=torch.bool)
            t2d[:n] = True
        model.load_vocab_mappings(t2d, d2t)
    with torch.no_grad():  # speculators leaves some heads uninitialised (torch.empty)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
        model.embed_tokens.weight.copy_(target.model.get_input_embeddings().weight)
    return model.to(target.device).eval()
