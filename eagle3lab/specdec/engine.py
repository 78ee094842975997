"""Speculative decoding with a real target verifying a real EAGLE-3 drafter.

Prevents trusting acceptance numbers that a wrong engine would produce: the output at
temperature 0 is token-for-token the target's plain greedy decoding (tests check it), so
every acceptance count comes from a correct verify loop. Mirrors SGLang's
`--speculative-num-steps S --speculative-eagle-topk K --speculative-num-draft-tokens D`:
chain drafting for K=1 (D is forced to S+1, as SGLang does), tree drafting for K>1 (K
children per frontier node, the K best paths kept per depth, the D-1 best-scoring drafted
nodes verified in one target forward with a tree attention mask). Temperature > 0 uses
rejection sampling that preserves the target's distribution (chain drafting).

`features="last_layer"` feeds the drafter what a server that captures no aux states feeds
it (the target's final normed hidden state); with `load_as` the drafter is built as that
engine would hold it (eagle3lab.formats.load_as). Both reproduce serving failures offline.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from eagle3lab.errors import UserError
from eagle3lab.specdec.kvcache import attention_mask, gather, keep
from eagle3lab.specdec.plain import sample_token, sampling_probs
from eagle3lab.specdec.result import GenerationResult
from eagle3lab.targets.auxlayers import AuxLayers

FEATURES = ("fused", "last_layer")


def check_features(features: str) -> None:
    if features not in FEATURES:
        raise UserError(f"features must be one of {FEATURES}, got {features!r}.")


def resolve_draft_shape(steps: int, topk: int, draft_tokens: int | None) -> int:
    """D (tokens verified per step, root included) as SGLang resolves it: S + 1 for chains
    (topk 1), else the given D, default min(S*K, 16) + 1; refuses impossible shapes."""
    if steps < 1 or topk < 1:
        raise UserError("steps and topk must be at least 1.")
    if topk == 1:
        return steps + 1  # SGLang forces D = S + 1 for chains
    if draft_tokens is None:
        draft_tokens = min(steps * topk, 16) + 1
    if not 2 <= draft_tokens <= steps * topk + 1:
        raise UserError(f"draft_tokens (D, root included) must be in 2..{steps * topk + 1} "
                        f"for steps={steps}, topk={topk}; got {draft_tokens}.")
    return draft_tokens


def accept_sampled(drafts: list[int], qs: list, logits, temperature: float, top_p: float,
                   hot, gen=None) -> tuple[int, int]:
    """Rejection sampling over a chain: accept draft d with prob min(1, p(d)/q(d)); on
    rejection sample from norm(max(p - q, 0)); all accepted: sample the bonus from p.
    logits: the target's rows for the verify inputs; qs: the draft distributions (drafter
    vocabulary); hot: draft id -> target id. Returns (accepted, the token emitted after)."""
    import torch

    for i, tok in enumerate(drafts):
        p = sampling_probs(logits[i].float().cpu(), temperature, top_p)
        q = torch.zeros_like(p)
        q[hot.cpu()] = qs[i].cpu()
        ratio = float(p[tok] / q[tok]) if q[tok] > 0 else 0.0
        if float(torch.rand((), generator=gen)) < min(1.0, ratio):
            continue
        resid = torch.clamp(p - q, min=0)
        resid = resid / resid.sum() if resid.sum() > 0 else p
        return i, int(torch.multinomial(resid, 1, generator=gen))
    p = sampling_probs(logits[len(drafts)].float().cpu(), temperature, top_p)
    return len(drafts), int(torch.multinomial(p, 1, generator=gen))


def select_tree(nodes: list[dict[str, Any]], count: int) -> tuple[list[int], list[int]]:
    """The `count` best-scoring drafted nodes, ancestor-closed, in verify order (by depth),
    and each verify input's parent (verify-input index; 0 = the root). A node's score never
    exceeds its parent's, so sorting by (score desc, depth asc) and adding ancestors first
    keeps the set ancestor-closed. nodes: dicts with parent (node index, -1 = root), depth,
    score."""
    chosen: list[int] = []
    for ni in sorted(range(len(nodes)), key=lambda i: (-nodes[i]["score"],
                                                       nodes[i]["depth"])):
        chain = []
        a = ni
        while a != -1 and a not in chosen:
            chain.append(a)
            a = nodes[a]["parent"]
        if len(chosen) + len(chain) > count:
            continue
        chosen.extend(reversed(chain))
        if len(chosen) == count:
            break
    chosen.sort(key=lambda i: (nodes[i]["depth"], i))
    where = {ni: k + 1 for k, ni in enumerate(chosen)}  # verify-input index (0 = root)
    parents = [0] * (len(chosen) + 1)
    for ni in chosen:
        parents[where[ni]] = where.get(nodes[ni]["parent"], 0)
    return chosen, parents


def walk_tree(tokens: list[int], parents: list[int], target_next: list[int]
              ) -> tuple[list[int], int]:
    """Greedy walk from the root: follow the child whose token is the target's argmax.
    Returns (verify-input indices kept, root first; the target's token after the last)."""
    children: dict[int, list[int]] = {}
    for r in range(1, len(parents)):
        children.setdefault(parents[r], []).append(r)
    path, cur = [0], 0
    while True:
        nxt = next((c for c in children.get(cur, [])
                    if tokens[c - 1] == target_next[cur]), None)
        if nxt is None:
            return path, target_next[cur]
        path.append(nxt)
        cur = nxt


class SpecEngine:
    """Target + drafter. `generate()` has the same signature and result as PlainEngine."""

    def __init__(self, target, drafter, *, capture_points: list[int] | None = None,
                 steps: int = 3, topk: int = 1, draft_tokens: int | None = None,
                 features: str = "fused"):
        check_features(features)
        draft_tokens = resolve_draft_shape(steps, topk, draft_tokens)
        self.target, self.drafter = target, drafter
        self.tokenizer = target.tokenizer
        self.steps, self.topk, self.draft_tokens = steps, topk, draft_tokens
        self.features = features
        points = capture_points or list(target.aux_layers().capture_points)
        self.aux = AuxLayers.from_capture_points(points, target.num_layers, "vllm")
        eos = target.model.generation_config.eos_token_id
        self.stop_token_ids = set(eos if isinstance(eos, list) else [eos]) - {None}

    @property
    def num_draft_tokens(self) -> int:
        return self.draft_tokens - 1

    # --- target side ---------------------------------------------------------------------
    def _verify(self, cache, store, ids: list[int], positions: list[int], allowed=None):
        """Target forward over new tokens -> (logits [n, V], drafter features [n, F])."""
        import torch

        t = self.target
        dev = t.device
        mask = attention_mask(allowed, t.dtype) if allowed is not None else None
        out = t.model(input_ids=torch.tensor([ids], device=dev),
                      position_ids=torch.tensor([positions], device=dev),
                      attention_mask=mask, past_key_values=cache, use_cache=True)
        if self.features == "fused":
            feats = torch.cat(store["aux"], dim=-1)[0]
        else:  # the final normed hidden state, as a server without aux capture passes it
            feats = t.model.model.norm(store["last"])[0]
        return out.logits[0], feats

    # --- the loop ------------------------------------------------------------------------
    def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None,
                 stop_token_ids: set[int] | None = None,
                 on_step: Callable[[list[int], int | None], None] | None = None
                 ) -> GenerationResult:
        """`on_step(tokens, accepted)`: called with the tokens each step emits (the
        prefill's token with accepted None; each verify step's with its accepted draft
        count), for a server that streams and counts per step as the engines do."""
        import torch
        from transformers import DynamicCache

        if temperature > 0 and self.topk > 1:
            raise UserError("Tree drafting (topk > 1) is verified greedily only; use topk 1 "
                            "(chain) for temperature > 0.")
        stops = self.stop_token_ids if stop_token_ids is None else set(stop_token_ids)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        d = self.drafter
        hist = [0] * (self.steps + 1)
        out: list[int] = []
        verify_ct = 0
        mismatches: list[list] = []
        finish = "length"
        cache = DynamicCache(config=self.target.model.config)
        d.reset()
        with torch.inference_mode(), self.target.capture(self.aux) as store:
            t0 = time.perf_counter()
            n = len(input_ids)
            logits, feats = self._verify(cache, store, list(input_ids), list(range(n)))
            x = sample_token(logits[-1].float().cpu(), temperature, top_p, gen)
            out.append(x)
            if on_step is not None:
                on_step([x], None)
            # step-0 entries: token at p with the target's features at p-1, position p
            d_logits, d_hidden = self._draft_catch_up(list(input_ids[1:]) + [x], feats,
                                                      first_position=1)
            t1 = time.perf_counter()
            L = n  # tokens in the target cache; x sits at position L
            verify_s = draft_s = 0.0
            while x not in stops and len(out) < max_new_tokens:
                ta = time.perf_counter()
                if self.topk == 1:
                    drafts, q = self._draft_chain(d_logits, d_hidden, L, temperature, gen)
                    tb = time.perf_counter()
                    logits, feats = self._verify(cache, store, [x] + drafts,
                                                 list(range(L, L + len(drafts) + 1)))
                    acc, bonus = self._accept_chain(drafts, q, logits, temperature, top_p, gen)
                    path = list(range(acc + 1))  # verify-input indices kept: x, d_1..d_acc
                    emitted = drafts[:acc] + [bonus]
                else:
                    tree = self._draft_tree(d_logits, d_hidden, L)
                    tb = time.perf_counter()
                    logits, feats = self._verify(cache, store, [x] + tree["tokens"],
                                                 [L + dd for dd in [0] + tree["depths"]],
                                                 tree["allowed"])
                    path, bonus = self._accept_tree(tree, logits)
                    acc = len(path) - 1
                    emitted = [tree["tokens"][i - 1] for i in path[1:]] + [bonus]
                    drafts = [tree["tokens"][r - 1] for r in range(1, len(tree["parents"]))
                              if tree["parents"][r] == path[-1]]  # the refused candidates
                tc = time.perf_counter()
                verify_s += tc - tb
                draft_s += tb - ta
                verify_ct += 1
                hist[acc] += 1
                if (acc < len(drafts) if self.topk == 1 else bool(drafts)) \
                        and len(out) + acc < max_new_tokens:
                    # the target refused a draft at this output position (cheap: ints)
                    rest = drafts[acc:] if self.topk == 1 else drafts
                    mismatches.append([len(out) + acc, [int(t) for t in rest], int(bonus)])
                # keep the context plus the accepted path in the target cache
                if self.topk == 1:
                    keep(cache, L + acc + 1)
                else:
                    gather(cache, torch.tensor(list(range(L)) + [L + i for i in path]))
                d.crop(L)  # drop the draft-step entries; the step-0 entry of x stays
                td = time.perf_counter()
                d_logits, d_hidden = self._draft_catch_up(
                    emitted, feats[torch.tensor(path, device=feats.device)],
                    first_position=L + 1)
                draft_s += time.perf_counter() - td
                done = False
                new: list[int] = []
                for tok in emitted:
                    new.append(tok)
                    if tok in stops or len(out) + len(new) >= max_new_tokens:
                        done = True
                        break
                out.extend(new)
                if on_step is not None:
                    on_step(new, acc)
                if done:
                    break
                L += acc + 1
                x = bonus
            if out and out[-1] in stops:
                finish = "stop"
            t2 = time.perf_counter()
        return GenerationResult(output_ids=out, finish_reason=finish, verify_ct=verify_ct,
                                accept_histogram=hist, num_draft_tokens=self.num_draft_tokens,
                                prefill_s=t1 - t0, decode_s=t2 - t1, verify_s=verify_s,
                                draft_s=draft_s,
                                mismatches=[m for m in mismatches if m[0] < len(out)])

    # --- drafting ------------------------------------------------------------------------
    def _draft_catch_up(self, tokens: list[int], feats, first_position: int):
        """Append step-0 entries (token p with features of p-1); return the last output."""
        import torch

        d = self.drafter
        dev = d.device
        hidden = d.project(feats.to(dev, d.dtype))
        logits, out = d.forward(torch.tensor(tokens, device=dev), hidden,
                                torch.arange(first_position, first_position + len(tokens),
                                             device=dev))
        return logits[-1], out[-1]

    def _draft_chain(self, d_logits, d_hidden, L: int, temperature: float, gen=None):
        """S draft tokens (target ids) and, when sampling, their draft distributions q."""
        import torch

        d = self.drafter
        drafts, qs = [], []
        for k in range(1, self.steps + 1):
            if temperature > 0:
                q = torch.softmax(d_logits.float() / temperature, dim=-1)
                i = int(torch.multinomial(q.cpu(), 1, generator=gen))
                qs.append(q)
            else:
                i = int(torch.argmax(d_logits))
            tok = int(d.to_target_ids(torch.tensor(i)))
            drafts.append(tok)
            if k < self.steps:
                logits, out = d.forward(torch.tensor([tok], device=d.device),
                                        d_hidden.unsqueeze(0),
                                        torch.tensor([L + k], device=d.device))
                d_logits, d_hidden = logits[0], out[0]
        return drafts, qs

    def _accept_chain(self, drafts, qs, logits, temperature, top_p, gen):
        """Greedy: accept while the draft equals the target's argmax. Sampling: accept d
        with prob min(1, p(d)/q(d)); on rejection sample from norm(max(p - q, 0))."""
        import torch

        if temperature <= 0:
            target_next = torch.argmax(logits, dim=-1).tolist()
            acc = 0
            while acc < len(drafts) and drafts[acc] == target_next[acc]:
                acc += 1
            return acc, target_next[acc]
        return accept_sampled(drafts, qs, logits, temperature, top_p, self.drafter.hot_ids,
                              gen)

    def _draft_tree(self, d_logits, d_hidden, L: int) -> dict[str, Any]:
        """Expand K children per frontier node for S depths, keep the K best per depth,
        then select the D-1 best-scoring nodes (ancestor-closed) for verification."""
        import torch

        d = self.drafter
        K, S = self.topk, self.steps
        c0 = d.cache_len
        # nodes: token (target id), parent (node index or -1 = root), depth, score, entry
        nodes: list[dict[str, Any]] = []
        logp = torch.log_softmax(d_logits.float(), dim=-1)
        top = torch.topk(logp, K)
        frontier = []
        for s, i in zip(top.values.tolist(), top.indices.tolist()):
            nodes.append({"token": int(d.to_target_ids(torch.tensor(i))), "parent": -1,
                          "depth": 1, "score": s, "entry": None, "hidden": d_hidden})
            frontier.append(len(nodes) - 1)
        for depth in range(1, S):
            base = d.cache_len
            allowed = torch.zeros(len(frontier), base + len(frontier), dtype=torch.bool)
            allowed[:, :c0] = True
            for r, ni in enumerate(frontier):
                nodes[ni]["entry"] = base + r
                a = ni
                while a != -1:
                    if nodes[a]["entry"] is not None:
                        allowed[r, nodes[a]["entry"]] = True
                    a = nodes[a]["parent"]
            toks = torch.tensor([nodes[ni]["token"] for ni in frontier], device=d.device)
            hid = torch.stack([nodes[ni]["hidden"] for ni in frontier])
            pos = torch.full((len(frontier),), L + depth, device=d.device)
            logits, outs = d.forward(toks, hid, pos, allowed.to(d.device))
            logp = torch.log_softmax(logits.float(), dim=-1)
            cand = []
            for r, ni in enumerate(frontier):
                top = torch.topk(logp[r], K)
                for s, i in zip(top.values.tolist(), top.indices.tolist()):
                    cand.append((nodes[ni]["score"] + s, ni, i, outs[r]))
            cand.sort(key=lambda c: -c[0])
            frontier = []
            for s, parent, i, h in cand[:K]:
                nodes.append({"token": int(d.to_target_ids(torch.tensor(i))), "parent": parent,
                              "depth": depth + 1, "score": s, "entry": None, "hidden": h})
                frontier.append(len(nodes) - 1)
        d.crop(c0)
        chosen, parents = select_tree(nodes, self.draft_tokens - 1)
        m = len(chosen) + 1
        allowed = torch.zeros(m, L + m, dtype=torch.bool)
        allowed[:, :L] = True
        allowed[0, L] = True
        for r in range(1, m):
            a = r
            while True:
                allowed[r, L + a] = True
                if a == 0:
                    break
                a = parents[a]
        return {"tokens": [nodes[ni]["token"] for ni in chosen],
                "depths": [nodes[ni]["depth"] for ni in chosen],
                "parents": parents, "allowed": allowed.to(self.target.device)}

    def _accept_tree(self, tree, logits) -> tuple[list[int], int]:
        """Greedy walk from the root: follow the child whose token is the target's argmax."""
        import torch

        return walk_tree(tree["tokens"], tree["parents"],
                         torch.argmax(logits, dim=-1).tolist())
