"""The static-cache, batched engine decodes exactly as the eager engine: same outputs, same
accept histograms, per request, at batch 1 and with ragged rows in a batch (chain and tree,
greedy and rejection sampling, plain), on a CPU in fp32 (where its forwards run eagerly);
on a GPU the same with CUDA graphs (the device tool runs those tests)."""

from collections import Counter

import pytest
import torch

from eagle3lab.errors import UserError
from eagle3lab.formats.demo import make_speculators_draft
from eagle3lab.specdec.accept import Arm, measure_acceptance, prompt_ids
from eagle3lab.specdec.batched import BatchedEngine
from eagle3lab.specdec.load import load_engine, resolve_engine
from eagle3lab.specdec.staticmodel import StaticKV, unsupported_reason, window_mask
from eagle3lab.workdir import default_drafter
from testutil import eager_and_static

CASES = [(3, 1, None, 0.0), (2, 3, 6, 0.0), (3, 1, None, 0.9)]  # steps, topk, D, temperature


def _prompts(target, n):
    return [ids for _, ids in prompt_ids(target.tokenizer, "eval", n, 1000)]


def _same(old, new):
    assert [r.output_ids for r in new] == [r.output_ids for r in old]
    assert [r.accept_histogram for r in new] == [r.accept_histogram for r in old]
    assert [r.verify_ct for r in new] == [r.verify_ct for r in old]
    assert [r.finish_reason for r in new] == [r.finish_reason for r in old]
    # the rejected drafts too (weak-spots shows them): None for plain decoding on both
    assert [r.mismatches for r in new] == [r.mismatches for r in old]


def test_window_mask_context_window_and_beyond():
    start = torch.tensor([2, 0])
    anc = torch.tensor([[[1, 0, 0], [1, 1, 0]], [[1, 0, 0], [0, 1, 1]]], dtype=torch.bool)
    m = window_mask(start, anc, kv_len=6)[:, 0].int().tolist()
    # row 0: context slots 0-1, window slots 2-4; row 1: no context, window 0-2
    assert m[0] == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    assert m[1] == [[1, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0]]


def test_static_kv_move_keeps_the_accepted_path_per_row():
    kv = StaticKV(layers=2, batch=2, kv_heads=1, max_len=8, head_dim=1, dtype=torch.float32,
                  device="cpu")
    kv.data[..., 0] = torch.arange(8, dtype=torch.float32)
    kv.move(torch.tensor([[3, 5, 6], [1, 2, 3]]), torch.tensor([[3, 4, 5], [1, 2, 3]]))
    assert kv.data[1, 1, 0, 0, :, 0].tolist() == [0, 1, 2, 3, 5, 6, 6, 7]
    assert kv.data[0, 0, 1, 0, :, 0].tolist() == list(range(8))


@pytest.mark.parametrize("steps,topk,draft_tokens,temperature", CASES)
def test_equals_eager_engine_tiny(tiny_target, tiny_draft, steps, topk, draft_tokens,
                                  temperature):
    eager = load_engine(target=tiny_target, draft=tiny_draft, steps=steps, topk=topk,
                        draft_tokens=draft_tokens)
    prompts = _prompts(tiny_target, 5)
    old = [eager.generate(p, max_new_tokens=12, temperature=temperature, seed=7 + i)
           for i, p in enumerate(prompts)]
    for batch in (1, 3):
        eng = load_engine(target=tiny_target, draft=tiny_draft, steps=steps, topk=topk,
                          draft_tokens=draft_tokens, engine="static", batch_size=batch)
        assert isinstance(eng, BatchedEngine) and eng.num_draft_tokens == eager.num_draft_tokens
        new = eng.generate_many(prompts, max_new_tokens=12, temperature=temperature,
                                seeds=[7 + i for i in range(len(prompts))])
        _same(old, new)
        assert eng.last_run["prompts"] == 5 and eng.last_run["batch_size"] == batch


def test_plain_and_last_layer_features_equal_eager(tiny_target, tiny_draft):
    prompts = _prompts(tiny_target, 3)
    plain = load_engine(target=tiny_target)
    old = [plain.generate(p, max_new_tokens=10) for p in prompts]
    new = load_engine(target=tiny_target, engine="static", batch_size=2).generate_many(
        prompts, max_new_tokens=10)
    _same(old, new)
    old = [plain.generate(p, max_new_tokens=10, temperature=0.9, seed=i)
           for i, p in enumerate(prompts)]
    new = load_engine(target=tiny_target, engine="static", batch_size=2).generate_many(
        prompts, max_new_tokens=10, temperature=0.9, seeds=list(range(len(prompts))))
    _same(old, new)
    eager = load_engine(target=tiny_target, draft=tiny_draft, features="last_layer")
    old = [eager.generate(p, max_new_tokens=10) for p in prompts]
    new = load_engine(target=tiny_target, draft=tiny_draft, features="last_layer",
                      engine="static", batch_size=2).generate_many(prompts, max_new_tokens=10)
    _same(old, new)


@pytest.mark.real
def test_shipped_drafter_on_the_real_target_equals_eager(real_target):
    """High acceptance (tau ~2): multi-token acceptance, ragged rows, refills, stops; a
    chain and the widest tree (the tiny tests above cover the narrower tree, 3 x 6)."""
    draft = default_drafter("smollm2-135m-instruct")
    prompts = _prompts(real_target, 3)
    for steps, topk, d in [(3, 1, None), (4, 4, 12)]:
        old, new = eager_and_static(real_target, draft, prompts, steps=steps, topk=topk,
                                    draft_tokens=d, max_new_tokens=20)
        _same(old, new)
        assert sum(r.accept_length for r in new) / len(new) > 1.5


def test_measure_acceptance_static_batched_counts_equal_eager(tiny_target, tiny_draft):
    kw = dict(target=tiny_target, arms=[Arm("a", str(tiny_draft))], limit=4,
              max_new_tokens=8, steps=2, progress=False)
    eager = measure_acceptance(**kw)
    batched = measure_acceptance(**kw, engine="static", batch_size=3)
    for key in ("completion_tokens", "verify_ct", "accept_histogram", "tau"):
        assert batched["arms"][0]["stats"][key] == eager["arms"][0]["stats"][key]
    assert batched["arms"][0]["matches_plain"] == eager["arms"][0]["matches_plain"]
    assert batched["settings"]["engine"] == "static"
    runs = {r["name"]: r for r in batched["batch"]["runs"]}
    assert runs["plain"]["prompts"] == runs["a"]["prompts"] == 4
    assert runs["a"]["completion_tokens"] == eager["arms"][0]["stats"]["completion_tokens"]
    assert runs["a"]["tokens_per_s"] > 0 and runs["plain"]["speedup"] == 1.0
    with pytest.raises(UserError, match="static engine"):
        measure_acceptance(**kw, engine="eager", batch_size=2)
    with pytest.raises(UserError, match="engine"):
        measure_acceptance(**kw, engine="fast")


def test_engine_choice_and_refusals(tiny_target, tiny_draft):
    assert resolve_engine("auto", tiny_target) == "eager"  # CPU: the pinned path
    assert unsupported_reason(tiny_target.model.config) is None
    eng = load_engine(target=tiny_target, draft=tiny_draft, topk=2, steps=2,
                      engine="static")
    with pytest.raises(UserError, match="greedily"):
        eng.generate([1, 2, 3], max_new_tokens=4, temperature=0.5)
    with pytest.raises(UserError, match="batch size"):
        BatchedEngine(tiny_target, None, batch_size=0)
    cfg = type(tiny_target.model.config)(**{**tiny_target.model.config.to_dict(),
                                            "model_type": "gemma"})
    cfg.model_type = "gemma"
    assert "not one the static engine" in unsupported_reason(cfg)
    cfg = tiny_target.model.config
    cfg.sliding_window = 16  # shorter than a prompt + answer: refused when the buffer is sized
    try:
        with pytest.raises(UserError, match="sliding-window attention"):
            BatchedEngine(tiny_target, None).generate([1, 2, 3], max_new_tokens=4)
    finally:
        del cfg.sliding_window
    mapped = type("Mapped", (), {"hf_device_map": {"model.layers.0": 0, "model.layers.1": 1}})
    assert "spread over 2 devices" in unsupported_reason(tiny_target.model.config,
                                                         model=mapped())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (device tool)")
def test_cuda_graphs_equal_eager_on_gpu(tiny_target_dir, tmp_path):
    """On a GPU in fp32: captured steps give the eager engine's outputs and counts."""
    from eagle3lab.targets.adapter import load_target

    tgt = load_target(str(tiny_target_dir), device="cuda")
    draft = make_speculators_draft(tmp_path / "d", target=tiny_target_dir, draft_vocab=512)
    prompts = _prompts(tgt, 6)
    for steps, topk, d, temp in CASES:
        eager = load_engine(target=tgt, draft=draft, steps=steps, topk=topk, draft_tokens=d,
                            engine="eager")
        old = [eager.generate(p, max_new_tokens=16, temperature=temp, seed=i)
               for i, p in enumerate(prompts)]
        for batch in (1, 4):
            eng = load_engine(target=tgt, draft=draft, steps=steps, topk=topk, draft_tokens=d,
                              engine="auto", batch_size=batch)
            assert eng.graphs.enabled
            new = eng.generate_many(prompts, max_new_tokens=16, temperature=temp,
                                    seeds=list(range(len(prompts))))
            assert len(eng.graphs) > 0
            _same(old, new)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_graph_captures_are_left_out_of_the_timings(tiny_target, tiny_draft, temperature,
                                                    monkeypatch):
    """A step shape's first use captures its graph (on a GPU: ~0.1 s, once); that time is
    counted apart (last_run capture_s) and left out of decode_s, verify_s and draft_s, on
    the pipelined greedy path and the sampling path. On this CPU nothing is captured, so
    Graphs.run is wrapped to act as a capture on each key's first use: the engine's clock
    jumps by an hour and capture_s counts that hour (no sleeping, so no timing noise: the
    real work here takes well under a second)."""
    import time
    import types

    from eagle3lab.specdec import batched

    hour, jumped = 3600.0, [0.0]
    monkeypatch.setattr(batched, "time", types.SimpleNamespace(
        perf_counter=lambda: time.perf_counter() + jumped[0]))
    eng = load_engine(target=tiny_target, draft=tiny_draft, steps=3, engine="static",
                      batch_size=2)
    real, seen = eng.graphs.run, set()

    def run(key, fn, tensors, **static):
        if key not in seen:
            seen.add(key)
            jumped[0] += hour
            eng.graphs.capture_s += hour
        return real(key, fn, tensors, **static)

    eng.graphs.run = run
    res = eng.generate_many(_prompts(tiny_target, 3), max_new_tokens=10,
                            temperature=temperature, seeds=[0, 1, 2])
    captured = hour * len(seen)
    assert len(seen) >= 2 and eng.last_run["capture_s"] == pytest.approx(captured)
    assert captured < eng.last_run["wall_s"] < captured + hour
    for r in res:  # each row saw captures while it decoded; none is in its timings
        assert 0 < r.decode_s < hour and 0 <= r.verify_s and 0 <= r.draft_s
        assert r.verify_s + r.draft_s < hour


@pytest.fixture(scope="module")
def coin_pair(tmp_path_factory, tiny_target_dir):
    """(target dir, drafter dir): a drafter whose head is zero, so that its chains are
    its draft id 0, T, every time; and the tiny target with its head row of T reading one
    coordinate of its final state, so that it says T at some positions and not at
    others: accepted runs of T, refusals, and T as a stop token inside accepted drafts."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("coin")
    draft = make_speculators_draft(root / "draft", target=tiny_target_dir, draft_vocab=512)
    w = load_file(str(draft / "model.safetensors"))
    T = int(w["d2t"][0])
    w["lm_head.weight"].zero_()
    save_file(w, str(draft / "model.safetensors"), metadata={"format": "pt"})
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    model.config.tie_word_embeddings = False  # T's embedding as it was
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        model.lm_head.weight[T] = 0.0
        model.lm_head.weight[T, 0] = 5.0
    target = root / "target"
    model.save_pretrained(target)
    for f in tiny_target_dir.iterdir():
        if f.suffix != ".safetensors" and not (target / f.name).exists():
            shutil.copy(f, target / f.name)
    return target, draft, T


def test_batch_accounting_with_stops_inside_accepted_drafts(coin_pair):
    """The pipelined path accounts the whole batch at once from one copy per step
    (`_HostRows`): a stop token among a step's accepted drafts or the token limit cuts
    that row there while the others go on; rows finish at different steps and are
    refilled. Outputs, finish reasons, counts and rejected drafts equal the eager
    engine's, at a batch larger than the tiny tests' and with every row refilled."""
    from eagle3lab.targets.adapter import load_target

    tdir, draft, T = coin_pair
    tgt = load_target(str(tdir), device="cpu")
    prompts = _prompts(tgt, 12)
    eager = load_engine(target=tgt, draft=str(draft), steps=3)
    cuts = []  # steps whose accepted drafts a stop or the limit cut short
    counts, reasons = Counter(), Counter()  # verify steps per request, finish reasons

    def cut(tokens, acc):
        cuts.append(acc is not None and len(tokens) < acc + 1)

    for stops, max_new in (({T}, 24), (set(), 9)):
        old = [eager.generate(p, max_new_tokens=max_new, stop_token_ids=stops, on_step=cut)
               for p in prompts]
        assert any(cuts) and len({r.verify_ct for r in old}) > 1
        counts.update(r.verify_ct for r in old)
        cuts.clear()
        for batch in (5, 8):
            new = load_engine(target=tgt, draft=str(draft), steps=3, engine="static",
                              batch_size=batch).generate_many(
                prompts, max_new_tokens=max_new, stop_token_ids=stops)
            _same(old, new)
        reasons.update(r.finish_reason for r in old)
    assert len(counts) > 4 and set(reasons) == {"stop", "length"}


def test_on_step_streams_as_the_eager_engine(coin_pair, tiny_draft):
    """One request streamed (the reference server's `on_step`): the static engine calls
    it with the same tokens and accepted counts, step by step, as the eager engine, a stop
    token cutting a step's accepted drafts included (plain, chain; a tree with the random
    drafter, whose candidates never tie)."""
    from eagle3lab.targets.adapter import load_target

    tdir, draft, T = coin_pair
    tgt = load_target(str(tdir), device="cpu")
    for kw in ({}, dict(draft=str(draft), steps=3),
               dict(draft=str(tiny_draft), steps=3, topk=2, draft_tokens=5)):
        for p in _prompts(tgt, 3):
            calls = {}
            for engine in ("eager", "static"):
                got = []
                res = load_engine(target=tgt, engine=engine, **kw).generate(
                    p, max_new_tokens=12, stop_token_ids={T},
                    on_step=lambda tokens, acc: got.append((list(tokens), acc)))
                assert [t for tokens, _ in got for t in tokens] == res.output_ids
                calls[engine] = got
            assert calls["static"] == calls["eager"]


@pytest.mark.slow
def test_compiled_steps_compile_once_per_step_shape(tiny_target, tiny_draft, tmp_path,
                                                    monkeypatch):
    """With `compile` (a GPU's path: each captured step torch.compile'd, dynamic=False), a
    batch-1 measurement compiles each step once per step shape (its attention span,
    kv_len) and no more: the KV buffer is sized once for the longest prompt (grown prompt
    by prompt, its new shape recompiled every step: prompts of 41, 134, then 35 tokens
    did), and no mask is first made inside a compiled step (which compiled the tree's
    drafting step twice). Emulated on the CPU: `Graphs.run` calls the compiled step as a
    GPU's capture does, with a backend that counts dynamo's compiles."""
    import torch._dynamo

    from eagle3lab.data.prompts import resolve_prompts_path
    from eagle3lab.specdec import staticmodel

    compiles, keys = Counter(), set()

    def run(self, key, fn, tensors, **static):
        name = fn.__name__
        keys.add((name, key))
        which = (fn.__func__, id(fn.__self__))
        if which not in self._compiled:
            def count(gm, example_inputs, name=name):
                compiles[name] += 1
                return gm.forward

            self._compiled[which] = torch.compile(fn, dynamic=False, backend=count)
        return self._compiled[which](**tensors, **static)

    monkeypatch.setattr(staticmodel.Graphs, "run", run)
    lines = resolve_prompts_path("eval").read_text().splitlines()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(lines[i] for i in (2, 101, 36)) + "\n")

    def measure():
        compiles.clear()
        keys.clear()
        torch._dynamo.reset()
        try:
            return measure_acceptance(target=tiny_target, draft=tiny_draft, prompts=prompts,
                                      limit=None, max_new_tokens=8, steps=2, topk=3,
                                      draft_tokens=6, engine="static", progress=False)
        finally:
            torch._dynamo.reset()

    r = measure()
    assert [p["prompt_tokens"] for p in r["arms"][0]["per_request"]] == [41, 134, 35]
    shapes = Counter(name for name, _ in keys)
    assert set(shapes) == {"_plain_fn", "_tree_verify_fn", "_tree_draft_fn"}
    assert min(shapes.values()) == 2  # two attention spans: 128 and 256 slots
    assert compiles == shapes
    # compiled at batch 1 (`whole_span`, set where the GPU compiles): each step attends
    # over the whole buffer, so it compiles once, and decodes the same tokens
    init = BatchedEngine.__init__

    def whole(self, *a, **kw):
        init(self, *a, **kw)
        self.whole_span = self.batch_size == 1

    monkeypatch.setattr(BatchedEngine, "__init__", whole)
    again = measure()
    assert compiles == Counter(dict.fromkeys(shapes, 1))
    for k in ("target_text", "accept_histogram"):
        assert [q[k] for q in again["arms"][0]["per_request"]] == \
            [q[k] for q in r["arms"][0]["per_request"]]
