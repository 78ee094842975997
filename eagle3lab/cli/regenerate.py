"""`eagle3lab regenerate`: the target answers the prompts (resumable JSONL)."""

from __future__ import annotations

from eagle3lab.cli.common import (add_command, generation_options, scale_options,
                                   server_options)


def add_parser(sub) -> None:
    p = add_command(
        sub, "regenerate", run,
        help="have the target answer prompts (training responses, resumable)",
        description="The target answers each prompt with its own chat template, batched, "
        "greedy (temperature 0) or sampled with a seed. Writes one JSONL record per prompt "
        "(prompt, response, token ids, assistant-only loss mask) to --out, plus "
        "OUT.meta.json with the parameters. Re-running continues where it stopped and never "
        "answers a prompt twice. Under torchrun (torchrun --nproc-per-node N -m eagle3lab "
        "regenerate ...) the batches are dealt to the ranks and rank 0 merges their answers "
        "into --out in the prompts' order. With --server URL a running SGLang, vLLM or "
        "`eagle3lab serve` server generates instead (the chat template is applied here and "
        "token ids are sent; the server must serve the target; --concurrency requests in "
        "flight; failed requests are retried with backoff): greedy records equal the "
        "in-process ones where both round alike (fp32; in bf16 an engine's kernels and "
        "transformers' round differently and greedy answers part after a near-tie: "
        "docs/vllm.md measured 15/16 identical in fp32, 2/16 in bf16 against vLLM).",
        parents=[generation_options(), scale_options(), server_options()])
    p.add_argument("--prompts", default="train",
                   help="'train' or 'eval' (shipped sets) or a JSONL file of {\"prompt\": ...}")
    p.add_argument("--out", required=True, help="output JSONL file (appended to on resume)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap")
    p.add_argument("--batch-size", type=int, default=16, help="prompts generated together")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (temperature > 0)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (per batch: seed + index)")
    p.add_argument("--samples", type=int, default=1, help="sampled answers per prompt "
                   "(ids PROMPT#k; needs --temperature > 0)")


def run(args) -> int:
    from eagle3lab.distributed import detect
    from eagle3lab.data.regenerate import regenerate

    s = regenerate(target=args.target, prompts=args.prompts, out=args.out, limit=args.limit,
                   max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                   temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                   system_prompt=args.system_prompt, samples=args.samples,
                   device=args.device, dtype=args.dtype,
                   progress=not args.no_progress, device_map=args.device_map,
                   dist_timeout=args.dist_timeout, server=args.server, api=args.api,
                   concurrency=args.concurrency, server_model=args.server_model,
                   retries=args.retries)
    if not detect().main:  # rank 0 reports for all ranks
        return 0
    print(f"{s['out']}: {s['records']} records ({s['new_records']} new, {s['new_tokens']} new "
          f"tokens, {s['tokens_per_s'] or 0:.1f} tok/s)")
    return 0
