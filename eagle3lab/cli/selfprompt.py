"""`eagle3lab self-prompt`: the target writes user prompts itself (resumable JSONL)."""

from __future__ import annotations

from eagle3lab.cli.common import (add_command, generation_options, scale_options,
                                   server_options)


def add_parser(sub) -> None:
    p = add_command(
        sub, "self-prompt", run,
        help="have the target write user prompts itself (more training data)",
        description="Magpie-style self-prompting: the target is fed its chat template up to "
        "the start of a user turn and, sampling, writes the user's message itself. A few "
        "hundred shipped prompts give a few hundred greedy answers; thousands of "
        "self-written prompts, answered greedily by `eagle3lab regenerate --prompts OUT`, "
        "give the drafter far more of the text it is judged on. A sample is kept only if it "
        "finished its turn, has at least --min-words words, is not a (normalised) duplicate "
        "and neither equals nor shares an 8-word run with the held-out --exclude prompts. "
        "Writes a prompts JSONL (id, prompt, category, batch, seed) to --out and "
        "OUT.meta.json with the parameters and the raw count of each drop reason. "
        "Re-running continues at the next batch and never repeats an id (raise --n to "
        "extend a file); other parameters are refused. Under torchrun (torchrun "
        "--nproc-per-node N -m eagle3lab self-prompt ...) each rank samples its own batches "
        "and rank 0 writes what one process would. With --server URL a running SGLang, vLLM "
        "or `eagle3lab serve` server samples instead (same prefix as token ids, per-row "
        "seeds; the server must serve the target).",
        parents=[generation_options("needs a chat template"), scale_options(),
                 server_options()])
    p.add_argument("--out", required=True, help="output prompts JSONL (appended to on resume)")
    p.add_argument("--n", "--num-prompts", dest="n", type=int, default=1000,
                   help="prompts to keep in --out in all (under torchrun write --num-prompts: "
                   "torchrun takes --n for an abbreviation of its own options)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling")
    p.add_argument("--max-new-tokens", type=int, default=96,
                   help="length cap of a prompt (longer samples are dropped as unfinished)")
    p.add_argument("--batch-size", type=int, default=64, help="prompts sampled together")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (batch b: seed + b)")
    p.add_argument("--min-words", type=int, default=4, help="shorter prompts are dropped")
    p.add_argument("--exclude", default="eval",
                   help="held-out prompts no kept prompt may overlap: 'eval', 'train', a "
                   "prompts JSONL, or 'none'")
    p.add_argument("--max-batches", type=int, default=None,
                   help="stop after this many batches in all, counting earlier runs "
                   "(None: enough for --n at a 25%% keep rate)")


def run(args) -> int:
    from eagle3lab.distributed import detect
    from eagle3lab.data.selfprompt import DROP_REASONS, synthesize_prompts

    s = synthesize_prompts(
        target=args.target, out=args.out, n=args.n, temperature=args.temperature,
        top_p=args.top_p, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
        seed=args.seed, min_words=args.min_words,
        exclude=None if args.exclude.lower() == "none" else args.exclude,
        system_prompt=args.system_prompt, max_batches=args.max_batches, device=args.device,
        dtype=args.dtype, progress=not args.no_progress, device_map=args.device_map,
        dist_timeout=args.dist_timeout, server=args.server, api=args.api,
        concurrency=args.concurrency, server_model=args.server_model,
        retries=args.retries)
    if not detect().main:  # rank 0 reports for all ranks
        return 0
    c = s["counts"]
    drops = ", ".join(f"{r} {c[r]}" for r in DROP_REASONS)
    print(f"{s['out']}: {s['prompts']} prompts after {s['batches']} batches (kept "
          f"{c['kept']} of {c['sampled']} sampled, keep rate {s['keep_rate'] or 0:.0%}; "
          f"dropped: {drops}; {s['seconds']:.1f} s)")
    return 0
