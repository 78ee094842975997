"""The offline engine at GPU speed: static KV caches, CUDA graphs, many prompts in flight.

Prevents two wrong readings on a GPU: a "spec vs plain" ratio that measures HF eager's
Python overhead (every step costs the same 20-34 ms there, whatever is computed), and
acceptance measurements on a real target that take an hour because prompts go one at a
time. `BatchedEngine` decodes plainly (no drafter) or speculatively (chain or tree,
greedy, or rejection sampling for chains) with the forwards of `staticmodel`, B rows at
once; each row holds one prompt at its own length (ragged), accepts its own number of
drafts per step, and is refilled with the next prompt when it finishes (plain decoding
can prefill the rows refilled at once in one left-padded forward, `prefill_rows`: at a
large batch one eager prefill per prompt costs more than the decode steps). Per request it
returns the same `GenerationResult` (raw counts) as `SpecEngine`/`PlainEngine`, and it
follows their algorithm step for step (the same drafting, tree selection, acceptance
rule, per-request sampling generator and draw order), so on a CPU in fp32 its outputs
and acceptance counts equal theirs (tests check it); `generate` has their signature. It
keeps their rejected drafts too (`mismatches`): on the pipelined path each step's drafts
(a tree's tokens and parents) go to the host with its result, a few ints per row.

Greedy decoding (plain, chains and trees: the speed-critical cases) keeps its whole state
on the device: one captured step per verify (with the acceptance rule, and for trees the
walk and the move of the accepted path's keys/values) and one per drafting (the
catch-up, then the next chain or tree, tree selection included), pipelined so that step
t is enqueued before the host accounts step t-1 (the device never waits for the host's
bookkeeping; a row's first chain or tree is drafted with its prefill). Rejection sampling
(chains, temperature > 0) draws on the host, per request, in SpecEngine's order.

Timing: a request's decode_s runs from the end of its prefill to its last token; at batch
size B it includes the other rows' work (a batch-B figure); verify_s/draft_s are the
step's time in target forwards (+ acceptance) / drafting, charged to every row in
flight: on the pipelined path measured with CUDA events (device time), elsewhere between
device synchronisations. A step shape's first use captures its graph (~0.1 s, once; a
serving engine does it at start): that time is left out of decode_s, verify_s and
draft_s and reported apart. `last_run` holds the whole run's wall time and its capture
seconds (the batch-B throughput is taken over the wall time less the captures).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from eagle3lab.errors import UserError
from eagle3lab.specdec.engine import accept_sampled, check_features, resolve_draft_shape
from eagle3lab.specdec.plain import sample_token
from eagle3lab.specdec.result import GenerationResult
from eagle3lab.specdec.staticmodel import (DrafterForward, Graphs, TargetForward, move_slots,
                                           round_up, unsupported_reason)
from eagle3lab.targets.auxlayers import AuxLayers

#: kv_len buckets: attention reads the cache up to the next multiple of this.
KV_BUCKET = 128
#: A grouped prefill's padded tokens at most (rows x longest prompt): bounds its masks.
PREFILL_TOKENS = 32768


def check_batch_size(batch_size) -> None:
    """Refuse a batch size that is not a whole number >= 1 (--batch-size)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch size (--batch-size) must be a whole number of at least 1, "
                        f"got {batch_size!r}.")


class _Row:
    """One request in flight (host-side state)."""

    def __init__(self, req: int, ids: list[int], gen, stops: set[int]):
        self.req, self.ids, self.gen, self.stops = req, ids, gen, stops
        self.out: list[int] = []
        self.hist: list[int] = []
        self.verify_ct = 0
        self.L = len(ids)  # tokens in the target cache; x sits at position L
        self.x = 0
        self.done = False
        self.finish = "length"
        self.prefill_s = self.verify_s = self.draft_s = 0.0
        self.t_decode = 0.0
        self.capture0 = 0.0  # graph-capture seconds so far when its decoding began
        self.decode_s = 0.0
        self.mismatches: list[list] = []  # [position, refused drafts, target id] per step


def refusal(target, max_len: int | None = None) -> str | None:
    """Why this engine cannot run `target` on sequences of up to `max_len` tokens (its cache
    holds them rounded up to KV_BUCKET, which a sliding window must cover), None where it
    can: the engine's own check, for a caller choosing an engine before building one."""
    return unsupported_reason(target.model.config, model=target.model,
                              max_len=round_up(max_len, KV_BUCKET) if max_len else None)


class BatchedEngine:
    """Plain (drafter None) or speculative decoding of many prompts at once."""

    def __init__(self, target, drafter=None, *, capture_points: list[int] | None = None,
                 steps: int = 3, topk: int = 1, draft_tokens: int | None = None,
                 features: str = "fused", batch_size: int = 1, graphs: bool | None = None,
                 compile: bool = False, prefill_rows: int = 1):
        why = refusal(target)
        if why:
            raise UserError(f"The static engine cannot run the target {target.name}: {why}. "
                            f"Use the eager engine (--engine eager).")
        check_batch_size(batch_size)
        check_features(features)
        self.target, self.drafter = target, drafter
        self.tokenizer = target.tokenizer
        self.batch_size = batch_size
        #: rows newly filled at once prefilled together in one forward (plain decoding
        #: only; left-padded, `_prefill_rows`): one eager forward per prompt otherwise
        #: costs more than a decode step of the whole batch on a GPU
        self.prefill_rows = max(1, min(prefill_rows, batch_size)) if drafter is None else 1
        self.steps, self.topk = steps, topk
        self.draft_tokens = resolve_draft_shape(steps, topk, draft_tokens) if drafter else 1
        self.features = features
        self.aux = None
        if drafter is not None:
            points = capture_points or list(target.aux_layers().capture_points)
            self.aux = AuxLayers.from_capture_points(points, target.num_layers, "vllm")
        eos = target.model.generation_config.eos_token_id
        self.stop_token_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.device = target.device
        cuda = self.device.type == "cuda"
        self.graphs = Graphs(enabled=cuda if graphs is None else graphs and cuda,
                             compile=compile and cuda)
        #: compiled at batch 1, the device-resident steps attend over the whole KV buffer
        #: (`_step_kv_len`): torch.compile specialises on the span, and one compile per
        #: 128-slot span bucket cost ~28 s each on the H200 (115 prompts x 256 tokens: 12
        #: compiles, past a 420 s call). At batch 1 the whole buffer is a few percent of
        #: a step's bytes (SmolLM2-135M: 12 MB of cache at 512 slots against 270 MB of
        #: weights); at larger batches it is not, so they keep the buckets.
        self.whole_span = self.graphs.compile and batch_size == 1
        self.tf = TargetForward(target, self.aux.capture_points if self.aux else [],
                                features if drafter is not None else None)
        self.df = DrafterForward(drafter) if drafter is not None else None
        self.kv_t = self.kv_d = None
        self.max_len = 0
        self.last_run: dict[str, Any] = {}
        import torch

        if drafter is not None:
            self.hot = drafter.hot_ids.to(self.device)
            # the drafter cache's window: chain drafts / catch-up (S+1) or tree entries
            self.w_draft = max(steps + 1, topk * max(steps - 1, 1))
        self._tril: dict[Any, Any] = {}  # masks built once: tril(n), chain windows
        self._torch = torch
        if drafter is not None:
            # the verify/catch-up mask, made here rather than inside the first compiled
            # step that reads it: made there, it changed what that step's guards had
            # seen, and its next call (a graph's warm-up) compiled it a second time
            self._tri(self.steps + 1)

    def swap_problem(self, drafter, capture_points: list[int] | None = None) -> str | None:
        """Why `swap_drafter` cannot take `drafter`, or None."""
        if self.drafter is None:
            return "this engine decodes without a drafter"
        points = capture_points or list(self.target.aux_layers().capture_points)
        if list(points) != list(self.aux.capture_points):
            return (f"its capture points {list(points)} differ from this engine's "
                    f"{list(self.aux.capture_points)}")
        old, new = self.drafter.model.state_dict(), drafter.model.state_dict()
        if diff := sorted(set(old) ^ set(new)):
            return f"its weights differ in name ({', '.join(diff[:3])})"
        if bad := [k for k in old if (old[k].shape, old[k].dtype) != (new[k].shape,
                                                                      new[k].dtype)]:
            return f"its weights differ in shape or dtype ({', '.join(bad[:3])})"
        if drafter.hot_ids.shape != self.hot.shape:
            return "its vocabulary map differs in size"
        return None

    def swap_drafter(self, drafter, capture_points: list[int] | None = None) -> None:
        """Decode with `drafter` from now on, keeping this engine's caches and captured CUDA
        graphs: its weights and vocabulary map are copied INTO the tensors the graphs read
        (a new model object would leave the graphs reading the old one). It must have the
        same architecture and capture points (`swap_problem` says why not: a UserError)."""
        if why := self.swap_problem(drafter, capture_points):
            raise UserError(f"The static engine cannot swap in this drafter: {why}; load an "
                            f"engine for it (load_engine).")
        torch = self._torch
        new = drafter.model.state_dict()
        with torch.no_grad():
            for k, v in self.drafter.model.state_dict().items():
                v.copy_(new[k])
            self.hot.copy_(drafter.hot_ids.to(self.hot.device))
            if self.drafter.hot_ids is not self.hot:
                self.drafter.hot_ids.copy_(drafter.hot_ids.to(self.drafter.hot_ids.device))

    @property
    def num_draft_tokens(self) -> int:
        return self.draft_tokens - 1 if self.drafter is not None else 0

    # --- buffers -------------------------------------------------------------------------
    def _ensure(self, max_len: int) -> None:
        if max_len <= self.max_len:
            return

        t = self.target
        why = refusal(t, max_len)
        if why:  # a sliding window shorter than these sequences
            raise UserError(f"The static engine cannot run the target {t.name} here: {why}. "
                            f"Use the eager engine (--engine eager).")
        self.max_len = round_up(max_len, KV_BUCKET)
        self.graphs.clear()
        self.kv_t = None
        self.kv_t = self.tf.new_cache(batch=self.batch_size, max_len=self.max_len,
                                      dtype=t.dtype, device=self.device)
        if self.df is not None:
            self.kv_d = None
            self.kv_d = self.df.new_cache(batch=self.batch_size, max_len=self.max_len,
                                          dtype=self.drafter.dtype, device=self.device)

    def _tri(self, n: int):
        if n not in self._tril:
            self._tril[n] = self._torch.ones(n, n, dtype=self._torch.bool,
                                             device=self.device).tril()
        return self._tril[n]

    def _margin(self) -> int:
        """Slots past a row's prompt and new tokens that a step may touch: a step may be in
        flight for a row the host has not yet seen finish, so twice its span."""
        return 2 * (self.draft_tokens + (self.w_draft if self.drafter is not None else 0)) + 2

    def reserve(self, longest_prompt: int, max_new_tokens: int) -> None:
        """Size the KV caches now for prompts of up to `longest_prompt` tokens and
        `max_new_tokens` new ones, so that decoding prompts one at a time (`generate`) never
        grows them: growing drops every captured graph, and with `compile` each step is
        compiled again for the new buffer shape (torch.compile specialises on it)."""
        self._ensure(longest_prompt + max_new_tokens + self._margin())

    def _kv_len(self, longest: int) -> int:
        return min(round_up(longest, KV_BUCKET), self.max_len)

    def _step_kv_len(self, longest: int) -> int:
        """A device-resident step's attention span: the whole buffer when `whole_span`
        (one compile per step), else `_kv_len`'s bucket."""
        return self.max_len if self.whole_span else self._kv_len(longest)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)

    # --- the public calls ----------------------------------------------------------------
    def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None,
                 stop_token_ids: set[int] | None = None,
                 on_step: Callable[[list[int], int | None], None] | None = None
                 ) -> GenerationResult:
        """One prompt (row 0 of the batch); the signature of SpecEngine.generate."""
        return self.generate_many([list(input_ids)], max_new_tokens=max_new_tokens,
                                  temperature=temperature, top_p=top_p, seeds=[seed],
                                  stop_token_ids=stop_token_ids, on_step=on_step)[0]

    def generate_many(self, prompts: list[list[int]], *, max_new_tokens: int,
                      temperature: float = 0.0, top_p: float = 1.0,
                      seeds: list[int | None] | None = None,
                      stop_token_ids: set[int] | None = None,
                      on_step: Callable[[list[int], int | None], None] | None = None,
                      on_done: Callable[[int, GenerationResult], None] | None = None
                      ) -> list[GenerationResult]:
        """Decode every prompt, `batch_size` at a time (a finished row takes the next
        prompt). seeds[i]: prompt i's sampling generator seed (as SpecEngine's `seed`).
        on_step: only with batch size 1. on_done(i, result) as each prompt finishes."""
        import torch

        if temperature > 0 and self.drafter is not None and self.topk > 1:
            raise UserError("Tree drafting (topk > 1) is verified greedily only; use topk 1 "
                            "(chain) for temperature > 0.")
        if on_step is not None and self.batch_size > 1:
            raise UserError("on_step streams one request: use batch size 1.")
        if not prompts:
            return []
        stops = self.stop_token_ids if stop_token_ids is None else set(stop_token_ids)
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)
        self._ensure(max(len(p) for p in prompts) + max_new_tokens + self._margin())
        B = self.batch_size
        rows: list[_Row | None] = [None] * B
        results: list[GenerationResult | None] = [None] * len(prompts)
        queue = list(range(len(prompts)))
        queue.reverse()
        sample = dict(temperature=temperature, top_p=top_p)
        n_steps = 0
        t_start = time.perf_counter()
        capture_start = self.graphs.capture_s
        prefill_s = 0.0
        # greedy decoding keeps its whole state on the device (the module docstring);
        # sampling draws on the host
        fast = temperature <= 0
        self._L = torch.zeros(B, dtype=torch.long, device=self.device)
        self._x = torch.zeros(B, dtype=torch.long, device=self.device)
        self._live = torch.zeros(B, dtype=torch.long, device=self.device)
        self._rb = torch.arange(B, device=self.device)
        if self.drafter is not None:
            self._drafts = torch.zeros(B, self.steps, dtype=torch.long, device=self.device)
            D = self.draft_tokens
            # a greedy tree between steps: verify tokens, position offsets, ancestry, parents
            self._tree = {"tok": torch.zeros(B, D - 1, dtype=torch.long, device=self.device),
                          "off": torch.zeros(B, D, dtype=torch.long, device=self.device),
                          "anc": torch.zeros(B, D, D, dtype=torch.bool, device=self.device),
                          "par": torch.zeros(B, D, dtype=torch.long, device=self.device)}
            # the drafter per row after its catch-up: logits (sampling, trees), output
            # state, greedy next token (chains)
            self._dl = torch.zeros(B, self.drafter.draft_vocab_size, device=self.device,
                                   dtype=self.drafter.dtype)
            self._dh = torch.zeros(B, self.drafter.hidden_size, device=self.device,
                                   dtype=self.drafter.dtype)
            self._dtok = torch.zeros(B, dtype=torch.long, device=self.device)

        def finish(b: int) -> None:
            r = rows[b]
            if r.out and r.out[-1] in r.stops:
                r.finish = "stop"
            if self.drafter is None:  # PlainEngine's counts: one "verify" per token
                r.verify_ct, r.hist, r.verify_s = len(r.out), [len(r.out)], r.decode_s
            res = GenerationResult(
                output_ids=r.out, finish_reason=r.finish, verify_ct=r.verify_ct,
                accept_histogram=r.hist, num_draft_tokens=self.num_draft_tokens,
                prefill_s=r.prefill_s, decode_s=r.decode_s, verify_s=r.verify_s,
                draft_s=r.draft_s, mismatches=None if self.drafter is None else
                [m for m in r.mismatches if m[0] < len(r.out)])
            results[r.req] = res
            rows[b] = None
            self._live[b] = 0
            self._L[b] = 0  # an idle row computes at the start of its buffer, never past it
            if on_done is not None:
                on_done(r.req, res)

        def fill() -> None:
            nonlocal prefill_s
            while queue:  # the free rows, lowest first, `prefill_rows` prompts at a time
                group, longest = [], 0
                for b in (b for b in range(B) if rows[b] is None):
                    if not queue or len(group) == self.prefill_rows:
                        break
                    n = max(longest, len(prompts[queue[-1]]))
                    if group and n * (len(group) + 1) > PREFILL_TOKENS:
                        break
                    i, longest = queue.pop(), n
                    gen = (torch.Generator().manual_seed(seeds[i]) if seeds[i] is not None
                           else None)
                    r = _Row(i, list(prompts[i]), gen, stops)
                    r.hist = [0] * (self.steps + 1)  # acc <= S (tree: depth <= S)
                    rows[b] = r
                    group.append(b)
                if not group:
                    break
                t0 = time.perf_counter()
                if len(group) > 1:
                    self._prefill_rows([(b, rows[b]) for b in group], sample)
                else:
                    self._prefill(group[0], rows[group[0]], sample)
                for b in group:
                    r = rows[b]
                    self._L[b], self._x[b], self._live[b] = r.L, r.x, 1
                    if fast and self.drafter is not None:
                        self._first_drafts(b, r.L)  # its first chain or tree
                self._sync()
                dt = time.perf_counter() - t0
                prefill_s += dt
                for b in group:
                    r = rows[b]
                    r.prefill_s = dt
                    r.t_decode = time.perf_counter()
                    r.capture0 = self.graphs.capture_s
                    if on_step is not None:
                        on_step([r.x], None)
                    if r.x in stops or len(r.out) >= max_new_tokens:
                        r.decode_s = 0.0
                        finish(b)

        def retire() -> None:
            now = time.perf_counter()
            for b, r in enumerate(rows):
                if r is not None and r.done:
                    r.decode_s = now - r.t_decode - (self.graphs.capture_s - r.capture0)
                    finish(b)

        with torch.inference_mode():
            fill()
            if fast:
                # pipelined: step t is enqueued before the host accounts step t-1, so the
                # device never waits for the host's bookkeeping
                # per row: accepted, emitted (S+1), and the step's drafts (a chain's S; a
                # tree's D-1 tokens and D parents) for the rejected drafts
                width = 1 if self.drafter is None else self.steps + 2 + (
                    self.steps if self.topk == 1 else 2 * self.draft_tokens - 1)
                self._res_host = [torch.zeros(B, width, dtype=torch.long,
                                              pin_memory=self.device.type == "cuda")
                                  for _ in range(2)]
                pending = None
                slot = 0
                while True:
                    active = any(r is not None and not r.done for r in rows)
                    launched = self._launch_fast(rows, slot) if active else None
                    slot ^= 1
                    if pending is not None:
                        self._apply_fast(pending, rows, max_new_tokens, on_step)
                        n_steps += 1
                        retire()
                        fill()
                    elif launched is None:
                        break
                    pending = launched
                self._sync()
            while any(r is not None for r in rows):
                if self.drafter is None:
                    self._plain_step(rows, sample, max_new_tokens, on_step)
                else:  # sampling: chains only (refused above for trees)
                    self._chain_step(rows, sample, max_new_tokens, on_step)
                n_steps += 1
                retire()
                fill()
        wall = time.perf_counter() - t_start
        self.last_run = {"prompts": len(prompts), "batch_size": B, "wall_s": wall,
                         "prefill_s": prefill_s, "steps": n_steps,
                         "completion_tokens": sum(r.completion_tokens for r in results),
                         "graphs": len(self.graphs),
                         "capture_s": self.graphs.capture_s - capture_start}
        return results

    # --- prefill ---------------------------------------------------------------------------
    def _prefill(self, b: int, r: _Row, sample: dict) -> None:
        """Row b's prompt through the target (eager: one shape per prompt), its first token,
        and the drafter's catch-up over the prompt (token p with the features of p-1)."""
        torch = self._torch
        dev = self.device
        n = len(r.ids)
        ids = torch.tensor([r.ids], device=dev)
        pos = torch.arange(n, device=dev)[None]
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        logits, feats, _ = self.tf(self.kv_t.row(b), ids, pos, zero, pos, self._tri(n)[None],
                                   kv_len=self._kv_len(n), last_only=True)
        r.x = sample_token(logits[0, -1].float().cpu(), sample["temperature"], sample["top_p"],
                           r.gen)
        r.out.append(r.x)
        if self.drafter is None:
            return
        toks = torch.tensor([r.ids[1:] + [r.x]], device=dev)
        d_logits, d_out, d_tok = self.df(self.kv_d.row(b), toks, feats, pos + 1, zero, pos,
                                         self._tri(n)[None], self.hot, kv_len=self._kv_len(n),
                                         project=True)
        self._dl[b] = d_logits[0, -1]
        self._dh[b] = d_out[0, -1]
        self._dtok[b] = d_tok[0, -1]

    def _prefill_rows(self, group: list[tuple[int, _Row]], sample: dict) -> None:
        """`_prefill` of several rows in one target forward (plain decoding): the prompts
        left-padded to the longest, n, so that every row's last token is the forward's
        last; a row's prompt token k sits at position and slot k, sees slots 0..k, and its
        keys/values land in its own row of the cache; pad token i writes slot len+i, past
        the prompt, which the row's decoding overwrites before any token sees it (a pad
        sees only itself: no empty attention row, no NaN in the cache)."""
        torch = self._torch
        dev = self.device
        k, n = len(group), max(len(r.ids) for _, r in group)
        ids, pos, write = (torch.zeros(k, n, dtype=torch.long) for _ in range(3))
        anc = torch.zeros(k, n, n, dtype=torch.bool)
        tri = torch.ones(n, n, dtype=torch.bool).tril()
        for j, (_, r) in enumerate(group):  # built on the host, moved once
            m, pad = len(r.ids), n - len(r.ids)
            ids[j, pad:] = torch.tensor(r.ids)
            pos[j, pad:] = torch.arange(m)
            write[j] = torch.cat([torch.arange(m, n), torch.arange(m)])
            anc[j, pad:, :m] = tri[:m, :m]
            anc[j, torch.arange(pad), torch.arange(m, n)] = True
        kv_len = self._kv_len(n)
        tmp = self.tf.new_cache(batch=k, max_len=kv_len, dtype=self.target.dtype, device=dev)
        logits, _, _ = self.tf(tmp.data, ids.to(dev), pos.to(dev),
                               torch.zeros(k, dtype=torch.long, device=dev), write.to(dev),
                               anc.to(dev), kv_len=kv_len, last_only=True)
        rows = torch.tensor([b for b, _ in group], device=dev)
        self.kv_t.data[:, :, rows, :, :kv_len] = tmp.data
        last = logits[:, -1].float().cpu()
        for j, (_, r) in enumerate(group):
            r.x = sample_token(last[j], sample["temperature"], sample["top_p"], r.gen)
            r.out.append(r.x)

    # --- steps ---------------------------------------------------------------------------
    def _lengths(self, rows):
        """Per row: L (0 for idle rows), the last token x, and who is in flight."""
        live = [r is not None and not r.done for r in rows]
        L = [r.L if live[b] else 0 for b, r in enumerate(rows)]
        x = [r.x if live[b] else 0 for b, r in enumerate(rows)]
        return live, L, x

    def _emit(self, r: _Row, emitted: list[int], acc: int | None, max_new: int,
              on_step) -> None:
        new: list[int] = []
        for tok in emitted:
            new.append(tok)
            if tok in r.stops or len(r.out) + len(new) >= max_new:
                r.done = True
                break
        r.out.extend(new)
        if on_step is not None:
            on_step(new, acc)

    def _verify(self, L, x, drafts):
        """The target over the chain [x, drafts] per row (host lengths L, tokens x):
        returns its (logits, features, argmax)."""
        torch = self._torch
        dev = self.device
        D = self.draft_tokens
        Lt = torch.tensor(L, device=dev)
        ids = torch.cat([torch.tensor(x, device=dev)[:, None], drafts], dim=1)
        at = Lt[:, None] + torch.arange(D, device=dev)
        kv_len = self._kv_len(max(L) + D)
        return self.graphs.run(
            ("verify", D, kv_len), self.tf,
            {"ids": ids, "pos": at, "start": Lt, "write": at,
             "anc": self._tri(D)[None].expand(len(L), D, D)},
            kv=self.kv_t.data, kv_len=kv_len)

    # --- greedy, device-resident: plain, chains, trees ---------------------------------
    def _anc_chain(self, k: int):
        """[1, 1, W] window of draft step k: the k slots from the row's length on."""
        key = ("chain", k)
        if key not in self._tril:
            a = self._torch.zeros(1, 1, self.w_draft, dtype=self._torch.bool,
                                  device=self.device)
            a[:, :, :k] = True
            self._tril[key] = a
        return self._tril[key]

    def _chain_drafts(self, kv, tok, hid, L, kv_len: int):
        """S-1 greedy drafter steps after the first draft token `tok` [B] (state `hid`
        [B, H]) for rows at length L [B]: draft k sits at position L+k, slot L+k-1.
        Returns the S drafts [B, S] (target ids)."""
        torch = self._torch
        toks = [tok]
        for k in range(1, self.steps):
            anc = self._anc_chain(k).expand(tok.shape[0], 1, self.w_draft)
            _, out, nxt = self.df(kv, tok[:, None], hid[:, None], (L + k)[:, None], L,
                                  (L + k - 1)[:, None], anc, self.hot, kv_len=kv_len)
            tok, hid = nxt[:, 0], out[:, 0]
            toks.append(tok)
        return torch.stack(toks, dim=1)

    def _first_drafts(self, b: int, n: int) -> None:
        """Row b's first chain or tree after its prefill (eager, that row alone)."""
        L = self._torch.tensor([n], device=self.device)
        kv_len = self._kv_len(n + self.w_draft)
        if self.topk == 1:
            self._drafts[b] = self._chain_drafts(self.kv_d.row(b), self._dtok[b:b + 1],
                                                 self._dh[b:b + 1], L, kv_len)[0]
            return
        tree = self._tree_drafts(self.kv_d.row(b), self._dl[b:b + 1], self._dh[b:b + 1], L,
                                 kv_len)
        for k, v in tree.items():
            self._tree[k][b] = v[0]

    def _tree_drafts(self, kv, d_logits, d_hidden, L, kv_len: int) -> dict:
        """SpecEngine's tree drafting and selection on the device, for rows at length L:
        K children of the root, then per depth the K best of the frontier's K*K children
        (a stable sort: ties keep SpecEngine's candidate order); the D-1 best nodes by
        score (a stable sort over nodes made depth by depth, so the set is ancestor-closed
        as SpecEngine's is), in verify order (depth, then creation). Returns the verify
        tokens [B, D-1], position offsets [B, D], ancestry [B, D, D] (self included) and
        parents [B, D] (verify indices; the root is 0)."""
        torch = self._torch
        K, S, D, W = self.topk, self.steps, self.draft_tokens, self.w_draft
        B, dev = d_logits.shape[0], d_logits.device
        top = torch.topk(torch.log_softmax(d_logits.float(), dim=-1), K)
        scores, tokens = [top.values], [self.hot[top.indices]]
        parents = [torch.full((B, K), -1, dtype=torch.long, device=dev)]
        depths = [torch.ones(B, K, dtype=torch.long, device=dev)]
        rows = torch.zeros(B, K, W, dtype=torch.bool, device=dev)  # frontier's window rows
        hid = d_hidden[:, None].expand(B, K, d_hidden.shape[-1])
        ar = torch.arange(K, device=dev)
        slot_ar = torch.arange(W, device=dev)
        for t in range(1, S):  # the frontier (depth t) gets its entries at t-1 .. in the window
            # each frontier node's own entry (no index_put of a host scalar: captured)
            rows = rows | (slot_ar[None, :] == ((t - 1) * K + ar)[:, None])[None]
            frontier = (t - 1) * K + ar  # node indices of the frontier
            logits, outs, _ = self.df(kv, tokens[-1], hid, (L + t)[:, None].expand(B, K), L,
                                      (L + (t - 1) * K)[:, None] + ar, rows, self.hot,
                                      kv_len=kv_len)
            top = torch.topk(torch.log_softmax(logits.float(), dim=-1), K)
            cand = (scores[-1][:, :, None] + top.values).reshape(B, K * K)
            order = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :K]
            src = order // K  # the parent's place in the frontier
            scores.append(cand.gather(1, order))
            tokens.append(self.hot[top.indices.reshape(B, K * K).gather(1, order)])
            parents.append(frontier[src])
            depths.append(torch.full((B, K), t + 1, dtype=torch.long, device=dev))
            hid = outs.gather(1, src[:, :, None].expand(B, K, outs.shape[-1]))
            rows = rows.gather(1, src[:, :, None].expand(B, K, W))
        score, token = torch.cat(scores, dim=1), torch.cat(tokens, dim=1)
        parent, depth = torch.cat(parents, dim=1), torch.cat(depths, dim=1)
        n = score.shape[1]
        chosen = torch.sort(-score, dim=1, stable=True).indices[:, :D - 1]
        chosen = chosen.gather(1, torch.sort(depth.gather(1, chosen) * n + chosen,
                                             dim=1).indices)
        where = torch.zeros(B, n + 1, dtype=torch.long, device=dev)  # node -> verify index
        where.scatter_(1, chosen, torch.arange(1, D, device=dev).expand(B, D - 1))
        pnode = parent.gather(1, chosen)
        par = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev),
                         where.gather(1, torch.where(pnode < 0, n, pnode))], dim=1)
        anc = torch.eye(D, dtype=torch.bool, device=dev).expand(B, D, D)
        cur = torch.arange(D, device=dev).expand(B, D)
        node = torch.arange(D, device=dev)
        for _ in range(S):
            cur = par.gather(1, cur)
            anc = anc | (cur[:, :, None] == node)
        off = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev),
                         depth.gather(1, chosen)], dim=1)
        return {"tok": token.gather(1, chosen), "off": off, "anc": anc, "par": par}

    def _tree_verify_fn(self, x, tok, off, anc, par, L, *, kv, kv_len: int):
        """Target over the tree, SpecEngine's greedy walk on the device (from the root,
        the first child whose token is the target's argmax), the accepted path's
        keys/values moved next to the context: (accepted [B], emitted [B, S+1], the
        path's features [B, S+1, F])."""
        torch = self._torch
        B, D = off.shape
        S = self.steps
        dev = x.device
        ids = torch.cat([x[:, None], tok], dim=1)
        ar = torch.arange(D, device=dev)
        _, feats, amax = self.tf(kv, ids, L[:, None] + off, L, L[:, None] + ar, anc,
                                 kv_len=kv_len)
        cur = torch.zeros(B, dtype=torch.long, device=dev)
        going = torch.ones(B, dtype=torch.bool, device=dev)
        path = [cur]
        for _ in range(S):
            want = amax.gather(1, cur[:, None])
            hit = (par == cur[:, None]) & (ar > 0) & (ids == want)
            going = going & hit.any(dim=1)
            cur = torch.where(going, hit.long().argmax(dim=1), cur)
            path.append(torch.where(going, cur, -1))
        path = torch.stack(path, dim=1)  # [B, S+1], -1 after the last accepted node
        acc = (path[:, 1:] >= 0).sum(dim=1)
        bonus = amax.gather(1, cur[:, None])
        idx = torch.where(path >= 0, path, torch.arange(S + 1, device=dev)).clamp(max=D - 1)
        emitted = torch.where(torch.arange(S + 1, device=dev) < acc[:, None],
                              torch.cat([ids.gather(1, path[:, 1:].clamp(min=0)), bonus],
                                        dim=1), bonus)
        move_slots(kv, L[:, None] + idx, L[:, None] + torch.arange(S + 1, device=dev))
        path_feats = feats.gather(1, idx[:, :, None].expand(B, S + 1, feats.shape[-1]))
        return acc, emitted, path_feats

    def _catch_up_fn(self, emitted, feats, acc, L, *, kv, kv_len: int):
        """The drafter's step-0 entries for each row's emitted tokens [B, S+1] (slots L..,
        positions L+1..; padded, only the first acc+1 count) with the verify features of
        the tokens before them; returns its (logits, output state, greedy next token) at
        the last real entry."""
        torch = self._torch
        B, n = emitted.shape
        ar = torch.arange(n, device=L.device)
        logits, out, tok = self.df(kv, emitted, feats, L[:, None] + 1 + ar, L, L[:, None] + ar,
                                   self._tri(n)[None].expand(B, n, n), self.hot,
                                   kv_len=kv_len, project=True)
        rb = torch.arange(B, device=L.device)
        return logits[rb, acc], out[rb, acc], tok[rb, acc]

    def _tree_draft_fn(self, emitted, feats, acc, L, *, kv, kv_len: int):
        """The catch-up, then the next tree from the last accepted entry, at the new
        length L+acc+1."""
        d_logits, d_out, _ = self._catch_up_fn(emitted, feats, acc, L, kv=kv, kv_len=kv_len)
        return self._tree_drafts(kv, d_logits, d_out, L + acc + 1, kv_len)

    def _plain_fn(self, x, L, *, kv, kv_len: int):
        ones = self._torch.ones(x.shape[0], 1, 1, dtype=self._torch.bool, device=x.device)
        _, _, amax = self.tf(kv, x[:, None], L[:, None], L, L[:, None], ones, kv_len=kv_len)
        return amax[:, 0]

    def _verify_fn(self, x, drafts, L, *, kv, kv_len: int):
        """Target over [x, drafts] and greedy acceptance on the device: (accepted [B],
        emitted [B, S+1]: the accepted drafts, then the bonus, padded with it; features)."""
        torch = self._torch
        B, S = drafts.shape
        ar = torch.arange(S + 1, device=x.device)
        pos = L[:, None] + ar
        _, feats, amax = self.tf(kv, torch.cat([x[:, None], drafts], dim=1), pos, L, pos,
                                 self._tri(S + 1)[None].expand(B, S + 1, S + 1),
                                 kv_len=kv_len)
        acc = (drafts == amax[:, :S]).long().cumprod(dim=1).sum(dim=1)
        bonus = amax.gather(1, acc[:, None])
        emitted = torch.where(ar[None] < acc[:, None], torch.cat([drafts, bonus], dim=1),
                              bonus)
        return acc, emitted, feats

    def _draft_fn(self, emitted, feats, acc, L, *, kv, kv_len: int):
        """The catch-up, then the next chain from the last accepted entry, at the new
        length L+acc+1."""
        _, d_out, d_tok = self._catch_up_fn(emitted, feats, acc, L, kv=kv, kv_len=kv_len)
        return self._chain_drafts(kv, d_tok, d_out, L + acc + 1, kv_len)

    def _mark(self):
        """A point in the stream: a CUDA event on a GPU, the host clock elsewhere (where
        every operation has finished when the call returns)."""
        if self.device.type == "cuda":
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.device.type == "cuda" else b - a

    def _launch_fast(self, rows, slot: int) -> dict:
        """Enqueue one greedy step for every row (plain: one token; chain or tree: verify
        and acceptance, then the drafter's catch-up and next chain or tree) and the copy of
        its result to the host; nothing waits. The host learns a row's lengths one step late, so the
        attention span allows for the step in flight (S+1 tokens)."""
        torch = self._torch
        live = [r is not None and not r.done for r in rows]
        lag = self.draft_tokens
        longest = max((r.L for b, r in enumerate(rows) if live[b]), default=0) + lag
        c0 = self.graphs.capture_s
        t0 = self._mark()
        if self.drafter is None:
            kv_len = self._step_kv_len(longest + 1)
            nxt = self.graphs.run(("plain-greedy", kv_len), self._plain_fn,
                                  {"x": self._x, "L": self._L}, kv=self.kv_t.data,
                                  kv_len=kv_len)
            self._x.copy_(nxt)
            self._L.add_(self._live)
            res = nxt[:, None]
        else:
            kv_len = self._step_kv_len(longest + self.draft_tokens)
            chain = self.topk == 1
            acc, emitted, feats = self.graphs.run(
                ("verify-greedy" if chain else "tree-verify", kv_len),
                self._verify_fn if chain else self._tree_verify_fn,
                {"x": self._x, "L": self._L,
                 **({"drafts": self._drafts} if chain else self._tree)},
                kv=self.kv_t.data, kv_len=kv_len)
            # the drafts just verified go to the host with the result (before the next
            # chain or tree overwrites them): a few ints per row, for `mismatches`
            res = torch.cat([acc[:, None], emitted] + (
                [self._drafts] if chain else [self._tree["tok"], self._tree["par"]]), dim=1)
        host = self._res_host[slot][:, :res.shape[1]]
        host.copy_(res, non_blocking=True)
        t1 = self._mark()
        c1 = self.graphs.capture_s
        if self.drafter is not None:
            kv_len = self._step_kv_len(longest + self.steps + 1 + self.w_draft)
            inputs = {"emitted": emitted, "feats": feats, "acc": acc, "L": self._L}
            if self.topk == 1:
                self._drafts.copy_(self.graphs.run(("draft-greedy", kv_len), self._draft_fn,
                                                   inputs, kv=self.kv_d.data, kv_len=kv_len))
            else:
                tree = self.graphs.run(("tree-draft", kv_len), self._tree_draft_fn, inputs,
                                       kv=self.kv_d.data, kv_len=kv_len)
                for k, v in tree.items():
                    self._tree[k].copy_(v)
            self._x.copy_(emitted[self._rb, acc])
            self._L.add_((acc + 1) * self._live)
        t2 = self._mark()
        return {"rows": list(rows), "live": live, "host": host, "marks": (t0, t1, t2),
                "capture": (c1 - c0, self.graphs.capture_s - c1)}

    def _apply_fast(self, step: dict, rows, max_new, on_step) -> None:
        """Wait for a launched step and account it to the rows it was launched for (a row
        that finished or was refilled since ignores it)."""
        t0, t1, t2 = step["marks"]
        if self.device.type == "cuda":
            t2.synchronize()
        cv, cd = step["capture"]  # a first use of a step shape: its capture is left out
        verify_s = max(self._seconds(t0, t1) - cv, 0.0)
        draft_s = max(self._seconds(t1, t2) - cd, 0.0)
        res = step["host"].tolist()
        live = [step["live"][b] and rows[b] is r and not r.done
                for b, r in enumerate(step["rows"])]
        if self.drafter is None:
            for b, r in enumerate(rows):
                if live[b]:
                    r.L += 1
                    r.x = res[b][0]
                    self._emit(r, [r.x], None, max_new, on_step)
            return
        S = self.steps
        accs, emitted = [x[0] for x in res], [x[1:x[0] + 2] for x in res]
        if self.topk == 1:
            refused = [x[S + 2:][a:] for x, a in zip(res, accs)]
        else:
            D = self.draft_tokens
            refused = [self._refused_children(x[S + 2:S + 1 + D], x[S + 1 + D:S + 1 + 2 * D],
                                              e[:-1]) for x, e in zip(res, emitted)]
        self._account(rows, live, accs, emitted, verify_s, draft_s, max_new, on_step, refused)

    @staticmethod
    def _refused_children(tok: list[int], par: list[int], accepted: list[int]) -> list[int]:
        """A greedy tree step's refused candidates, as SpecEngine keeps them: the children
        of the last accepted node (verify order). The accepted path is walked again from
        the root as `_tree_verify_fn` walks it (the first child holding the accepted
        token); tok[i-1] is node i's token, par[i] its parent (node 0: the root)."""
        cur = 0
        for t in accepted:
            cur = next(i for i in range(1, len(par)) if par[i] == cur and tok[i - 1] == t)
        return [tok[i - 1] for i in range(1, len(par)) if par[i] == cur]

    def _plain_step(self, rows, sample, max_new, on_step) -> None:
        """One sampled token per row (temperature > 0; greedy plain decoding takes the
        device-resident path)."""
        torch = self._torch
        dev = self.device
        live, L, x = self._lengths(rows)
        Lt = torch.tensor(L, device=dev)
        B = len(rows)
        kv_len = self._kv_len(max(L) + 1)
        logits, _, _ = self.graphs.run(
            ("plain", kv_len), self.tf,
            {"ids": torch.tensor(x, device=dev)[:, None], "pos": Lt[:, None],
             "start": Lt, "write": Lt[:, None],
             "anc": torch.ones(B, 1, 1, dtype=torch.bool, device=dev)},
            kv=self.kv_t.data, kv_len=kv_len)
        rows_logits = logits[:, 0].cpu()
        nxt = [sample_token(rows_logits[b], sample["temperature"], sample["top_p"], r.gen)
               if live[b] else 0 for b, r in enumerate(rows)]
        for b, r in enumerate(rows):
            if not live[b]:
                continue
            r.L += 1
            r.x = nxt[b]
            self._emit(r, [nxt[b]], None, max_new, on_step)

    def _catch_up(self, L, emitted_rows, feats, acc):
        """`_catch_up_fn` for host-side rows (the sampling path): the drafter's state
        after each row's emitted tokens, for the next draws."""
        torch = self._torch
        dev = self.device
        n = self.steps + 1
        toks = torch.tensor([e + [e[-1]] * (n - len(e)) for e in emitted_rows], device=dev)
        kv_len = self._kv_len(max(L) + n)
        d_logits, d_out, _ = self.graphs.run(
            ("catchup", kv_len), self._catch_up_fn,
            {"emitted": toks, "feats": feats, "acc": torch.tensor(acc, device=dev),
             "L": torch.tensor(L, device=dev)}, kv=self.kv_d.data, kv_len=kv_len)
        self._dl.copy_(d_logits)
        self._dh.copy_(d_out)

    def _draft_step(self, L: list[int], Lt, toks, hidden, k: int, anc):
        """One drafter forward over q entries per row at draft depth k: position L+k,
        slots L+(k-1)q .. L+kq-1 (Lt: L on the device)."""
        torch = self._torch
        dev = self.device
        q = toks.shape[1]
        kv_len = self._kv_len(max(L) + self.w_draft)
        return self.graphs.run(
            ("draft", q, kv_len), self.df,
            {"ids": toks, "hidden": hidden, "pos": Lt[:, None] + k, "start": Lt,
             "write": Lt[:, None] + (k - 1) * q + torch.arange(q, device=dev), "anc": anc},
            kv=self.kv_d.data, hot=self.hot, kv_len=kv_len)

    def _chain_step(self, rows, sample, max_new, on_step) -> None:
        """One chain step with rejection sampling (temperature > 0; greedy chains take the
        device-resident path): the draws on the host, per row, in SpecEngine's order."""
        torch = self._torch
        dev = self.device
        S, T = self.steps, sample["temperature"]
        live, L, x = self._lengths(rows)
        B = len(rows)
        ca, ta = self.graphs.capture_s, time.perf_counter()
        Lt = torch.tensor(L, device=dev)
        # drafting: S tokens per row; the drafter's window slot k-1 holds draft step k
        qs: list[list] = [[] for _ in range(B)]
        drafted = []
        hid, logits_k = self._dh, self._dl
        for k in range(1, S + 1):
            q = torch.softmax(logits_k.float() / T, dim=-1)
            qc = q.cpu()
            idx = [int(torch.multinomial(qc[b], 1, generator=r.gen)) if live[b] else 0
                   for b, r in enumerate(rows)]
            for b in range(B):
                qs[b].append(q[b])
            tok = self.hot[torch.tensor(idx, device=dev)]
            drafted.append(tok)
            if k < S:
                anc = self._anc_chain(k).expand(B, 1, self.w_draft)
                logits_k, out, _ = self._draft_step(L, Lt, tok[:, None], hid[:, None], k, anc)
                logits_k, hid = logits_k[:, 0], out[:, 0]
        drafts = torch.stack(drafted, dim=1)
        self._sync()
        cb, tb = self.graphs.capture_s, time.perf_counter()
        logits, feats, _ = self._verify(L, x, drafts)
        drafted_host = drafts.tolist()
        accs, emitted_rows = [], []
        for b, r in enumerate(rows):
            if not live[b]:
                accs.append(0)
                emitted_rows.append([0])
                continue
            acc, bonus = accept_sampled(drafted_host[b], qs[b], logits[b], T, sample["top_p"],
                                        self.hot, r.gen)
            accs.append(acc)
            emitted_rows.append(drafted_host[b][:acc] + [bonus])
        cc, tc = self.graphs.capture_s, time.perf_counter()
        self._catch_up(L, emitted_rows, feats, accs)
        self._sync()
        cd, td = self.graphs.capture_s, time.perf_counter()
        # first uses of step shapes: their captures are left out
        self._account(rows, live, accs, emitted_rows, (tc - tb) - (cc - cb),
                      (tb - ta) - (cb - ca) + (td - tc) - (cd - cc), max_new, on_step,
                      [d[a:] for d, a in zip(drafted_host, accs)])

    def _account(self, rows, live, accs, emitted_rows, verify_s: float, draft_s: float,
                 max_new: int, on_step, refused: list[list[int]]) -> None:
        """One verify step's counts, times and tokens into each row it ran for; refused[b]:
        row b's drafts the target refused (from the first refused on; a tree's: the
        children of the last accepted node), kept as SpecEngine keeps `mismatches`."""
        for b, r in enumerate(rows):
            if not live[b]:
                continue
            acc = accs[b]
            r.verify_ct += 1
            r.hist[acc] += 1
            r.verify_s += verify_s
            r.draft_s += draft_s
            if refused[b] and len(r.out) + acc < max_new:
                r.mismatches.append([len(r.out) + acc, [int(t) for t in refused[b]],
                                     int(emitted_rows[b][-1])])
            self._emit(r, emitted_rows[b], acc, max_new, on_step)
            r.L += acc + 1
            r.x = emitted_rows[b][-1]

