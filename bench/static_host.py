"""The static engine's host work per verify step, apart from its forwards.

Prevents tuning the wrong side of the decoding loop: the at-scale study's live decodes on
the H200 (115 prompts, batch 128, 256 new tokens, a 135M target, a one-layer drafter)
took 9-21 s for 142-240 verify steps, read as 60-100 ms of host bookkeeping a step.
On the CPU (default), a tiny random Llama (hidden 32, 4 layers, vocabulary 512) and a
one-layer EAGLE-3 drafter for it keep the forwards cheap; every call of the engine's
forwards (`Graphs.run`: the captured steps on a GPU, eager here) is timed, and the rest of
the decoding loop (prefill excluded) is the host's share: the bookkeeping of each step,
the launching of its small tensor ops and the copy of its result. Per batch size and
draft shape it prints the host ms per verify step, the forwards' ms per step, rows x
steps per host second, the accept length, then cProfile's top functions (cumulative) of
one profiled run of the largest batch.

On a GPU (`--device cuda --shape smollm2`: SmolLM2-135M's shape, random weights) the
forwards are asynchronous replays, so it prints instead where a decode's wall time goes:
the engine's load, the prefills, the graph captures, the loop's ms per verify step and
the device's (CUDA events) ms per step.

The drafter's head is zero: a chain always drafts one token, a tree (top-k 4) always
has another one on its first path; the target's head rows of these tokens read one
coordinate each of its final state, so the target says them often, not always: rows
accept 0 to S drafts per step, and finish at different steps.

    .venv/bin/python -P bench/static_host.py [--batch-sizes 16 64 128]
        [--settings 3,1,4 4,4,12] [--max-new-tokens 64] [--profile 25]
    python3 -P bench/static_host.py --device cuda --dtype bfloat16 --shape smollm2 \
        --batch-sizes 128 --prompts 115 --prompt-len 300 --max-new-tokens 256

(-P keeps bench/ off sys.path.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

VOCAB = 512
SMOL_VOCAB = 49152
TREE_K = 4  # the tree width whose tie-break picks the tree's drafted token


def _tiny_pair(root: Path, seed: int, *, shape: str, device: str, dtype: str) -> tuple:
    """(target, drafter path): a random Llama (tiny, or SmolLM2-135M's shape) with a
    word-level tokenizer, and a drafter for it with a zero head (the module docstring)."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from eagle3lab.formats.demo import _quiet_saving, make_speculators_draft
    from eagle3lab.targets.adapter import load_target

    tiny = shape == "tiny"
    V = VOCAB if tiny else SMOL_VOCAB
    tdir = root / "target"
    torch.manual_seed(seed)
    cfg = (LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=2048, tie_word_embeddings=False)
           if tiny else  # SmolLM2-135M's shape
           LlamaConfig(vocab_size=V, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       max_position_embeddings=8192, tie_word_embeddings=True))
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.bos_token_id, cfg.eos_token_id = 1, 2
    model = LlamaForCausalLM(cfg)
    with _quiet_saving():
        model.save_pretrained(tdir)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0")),
        unk_token="t0", eos_token="t2", bos_token="t1")
    tok.save_pretrained(tdir)
    path = make_speculators_draft(root / "draft", target=tdir, draft_vocab=V // 4,
                                  aux_ids=[0, 1, 2] if tiny else None, seed=seed)
    w = _load_state(path / "model.safetensors")
    w["lm_head.weight"].zero_()
    _save_state(w, path / "model.safetensors")
    # draft id i is target id i + d2t[i]; a chain drafts argmax (id 0 on ties), a tree's
    # first node is top-k's first pick on ties (this torch's choice, asked here)
    first = int(torch.topk(torch.zeros(1, V // 4, device=device), TREE_K).indices[0, 0])
    with torch.no_grad():
        for dim, i in enumerate(sorted({0, first})):
            T = i + int(w["d2t"][i])
            model.lm_head.weight[T] = 0.0
            model.lm_head.weight[T, dim] = 10.0
    with _quiet_saving():
        model.save_pretrained(tdir)
    return load_target(str(tdir), device=device, dtype=dtype), path


def _load_state(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _save_state(state: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file(state, str(path), metadata={"format": "pt"})


def _prompts(n: int, seed: int, vocab: int = VOCAB, longest: int = 40) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(3, vocab, (int(torch.randint(max(longest // 5, 2), longest + 1, (1,),
                                                       generator=g)),),
                          generator=g).tolist() for _ in range(n)]


def _measure(eng, prompts: list[list[int]], max_new: int) -> dict:
    """One generate_many with its forwards timed: host ms per verify step and the rest."""
    fwd = [0.0]
    real = eng.graphs.run

    def run(key, fn, tensors, **static):
        t = time.perf_counter()
        try:
            return real(key, fn, tensors, **static)
        finally:
            fwd[0] += time.perf_counter() - t

    eng.graphs.run = run
    try:
        res = eng.generate_many(prompts, max_new_tokens=max_new)
    finally:
        del eng.graphs.run
    lr = eng.last_run
    steps = max(lr["steps"], 1)
    verify = sum(r.verify_ct for r in res)
    longest = max(res, key=lambda r: r.verify_ct)
    if eng.device.type == "cuda":  # forwards are replays, asynchronous: the loop's time
        loop = lr["wall_s"] - lr["prefill_s"] - lr["capture_s"]
        return {"steps": lr["steps"], "loop_ms_per_step": round(1e3 * loop / steps, 3),
                "device_ms_per_step": round(1e3 * (longest.verify_s + longest.draft_s)
                                            / max(longest.verify_ct, 1), 3),
                "wall_s": round(lr["wall_s"], 3), "prefill_s": round(lr["prefill_s"], 3),
                "capture_s": round(lr["capture_s"], 3), "graphs": lr["graphs"],
                "tau": round(sum(len(r.output_ids) - 1 for r in res) / max(verify, 1), 3),
                "tokens": sum(len(r.output_ids) for r in res)}
    host = lr["wall_s"] - lr["prefill_s"] - fwd[0]
    return {"steps": lr["steps"], "host_ms_per_step": round(1e3 * host / steps, 3),
            "forward_ms_per_step": round(1e3 * fwd[0] / steps, 3),
            "row_steps_per_host_s": round(verify / host) if host > 0 else None,
            "tau": round(sum(len(r.output_ids) - 1 for r in res) / max(verify, 1), 3),
            "tokens": sum(len(r.output_ids) for r in res)}


def _fastest(measures: list[dict]) -> dict:
    """The repeat with the least loop time per step: host ms on the CPU (forwards timed
    apart), the whole loop's ms on CUDA (replays are asynchronous: `_measure`'s two forms)."""
    return min(measures, key=lambda m: m["host_ms_per_step"] if "host_ms_per_step" in m
               else m["loop_ms_per_step"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--settings", nargs="+", default=["3,1,4", "4,4,12"],
                    help="steps,topk,draft_tokens per draft shape")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per point (the "
                    "fastest is kept)")
    ap.add_argument("--profile", type=int, default=25, help="cProfile's top N functions "
                    "of the largest batch (0: no profile)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=("tiny", "smollm2"), default="tiny",
                    help="the random target: tiny (cheap forwards) or SmolLM2-135M's shape")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=0, help="prompts per run (0: the batch "
                    "size; more: rows refilled)")
    ap.add_argument("--prompt-len", type=int, default=40, help="longest prompt")
    args = ap.parse_args(argv)
    import torch

    from eagle3lab.errors import UserError
    from eagle3lab.specdec.batched import check_batch_size
    from eagle3lab.specdec.load import load_engine

    for b in args.batch_sizes:
        check_batch_size(b)
    if args.repeats < 1:
        raise UserError(f"--repeats must be at least 1 (timed runs per point), got "
                        f"{args.repeats}.")
    shapes = []
    for s in args.settings:
        try:
            steps, topk, d = (int(v) for v in s.split(","))
        except ValueError:
            raise UserError(f"--settings takes steps,topk,draft_tokens (e.g. 3,1,4), "
                            f"got {s!r}.") from None
        shapes.append((steps, topk, d))
    torch.set_num_threads(args.threads)
    target, draft = _tiny_pair(Path(tempfile.mkdtemp(prefix="static-host-")), args.seed,
                               shape=args.shape, device=args.device, dtype=args.dtype)
    V = VOCAB if args.shape == "tiny" else SMOL_VOCAB
    out: dict = {"max_new_tokens": args.max_new_tokens, "threads": args.threads,
                 "points": []}
    for steps, topk, d in shapes:
        for B in args.batch_sizes:
            t0 = time.perf_counter()
            eng = load_engine(target=target, draft=str(draft), steps=steps, topk=topk,
                              draft_tokens=d, engine="static", batch_size=B)
            load_s = time.perf_counter() - t0
            prompts = _prompts(args.prompts or B, args.seed, V, args.prompt_len)
            eng.generate_many(prompts[:2], max_new_tokens=4)  # buffers sized, warm
            best = _fastest([_measure(eng, prompts, args.max_new_tokens)
                             for _ in range(args.repeats)])
            point = {"shape": f"{steps},{topk},{d}", "batch": B, "load_s": round(load_s, 3),
                     **best}
            out["points"].append(point)
            print(json.dumps(point), flush=True)
    if args.profile:
        import cProfile
        import io
        import pstats

        steps, topk, d = shapes[-1]
        B = max(args.batch_sizes)
        eng = load_engine(target=target, draft=str(draft), steps=steps, topk=topk,
                          draft_tokens=d, engine="static", batch_size=B)
        prompts = _prompts(args.prompts or B, args.seed, V, args.prompt_len)
        eng.generate_many(prompts[:2], max_new_tokens=4)
        prof = cProfile.Profile()
        prof.enable()
        eng.generate_many(prompts, max_new_tokens=args.max_new_tokens)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(args.profile)
        print(f"cProfile, shape {steps},{topk},{d}, batch {B} "
              f"({eng.last_run['steps']} steps):")
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("static_host.py", main))
