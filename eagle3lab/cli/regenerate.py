"""`eagle3lab regenerate`: the target answers the prompts (resumable JSONL).

The options are `RegenerateConfig`'s fields (`cli.common.add_config_options`), beside the
options several commands share (--target, --device, --dtype, --system-prompt,
--no-progress)."""

from __future__ import annotations

from eagle3lab.cli.common import (add_command, add_config_options, config_from_args,
                                  generation_options)


def add_parser(sub) -> None:
    from eagle3lab.data.regenerate import RegenerateConfig
    from eagle3lab.data.stage import STAGE_GROUPS

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
        "docs/vllm.md measured 15/16 identical in fp32, 2/16 in bf16 against vLLM). On a GPU "
        "--engine static decodes with eagle3lab's static-cache engine (CUDA graphs, "
        "--batch-size rows in flight, each refilled as its answer ends), in chunks of "
        "16 x --batch-size prompts.",
        parents=[generation_options()])
    add_config_options(p, RegenerateConfig, groups=STAGE_GROUPS)


def run(args) -> int:
    from eagle3lab.distributed import detect
    from eagle3lab.data.regenerate import RegenerateConfig, regenerate

    cfg = config_from_args(RegenerateConfig, args, "regenerate")
    engine_class = None
    if cfg.engine == "static":  # the data layer cannot import specdec: given beside the config
        from eagle3lab.specdec.batched import BatchedEngine as engine_class
    s = regenerate(cfg, progress=not args.no_progress, engine_class=engine_class)
    if not detect().main:  # rank 0 reports for all ranks
        return 0
    print(f"{s['out']}: {s['records']} records ({s['new_records']} new, {s['new_tokens']} new "
          f"tokens, {s['tokens_per_s'] or 0:.1f} tok/s)")
    return 0
