"""`eagle3lab accept`: offline acceptance and speedup of a drafter against the target."""

from __future__ import annotations

import json

from eagle3lab.cli.common import (add_command, device_option, dtype_option, json_option,
                                  target_option)


def add_parser(sub) -> None:
    p = add_command(
        sub, "accept", run,
        help="measure a drafter's acceptance and speedup offline (CPU or GPU)",
        description="Decode prompts with the target alone and with the target verifying the "
        "drafter (speculative decoding, same prompts, same run), and report the accept length "
        "tau (INCLUDING the bonus token; floor 1.0), per-position acceptance (cumulative: "
        "positions 1..k all accepted; conditional: k given k-1), SGLang's accept histogram "
        "(H[n] = verify steps that accepted exactly n drafts), plain vs speculative tokens/s, "
        "the measured speedup and the one predicted from tau and the measured step costs. "
        "At temperature 0 the speculative output must equal the plain one ('same as plain'). "
        "A drafter that does not fit the target is refused with the doctor's finding codes.",
        parents=[target_option(), device_option(), dtype_option(
            "float32 (exact on CPU) or bfloat16 (GPUs; also the fastest on CPUs with native "
            "bf16, with --threads 1)"), json_option()])
    p.add_argument("--draft", default=None, help="drafter checkpoint (speculators or SGLang "
                   "format); default: the default drafter (data/drafters/TARGET for a preset "
                   "target, else the demo's trained one)")
    p.add_argument("--prompts", default="eval", help="'eval', 'train' or a prompts JSONL file")
    p.add_argument("--limit", type=int, default=24, help="number of prompts")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer")
    p.add_argument("--steps", type=int, default=3, help="draft steps S "
                   "(--speculative-num-steps)")
    p.add_argument("--topk", type=int, default=1, help="branching K (--speculative-eagle-topk)"
                   "; 1 = chain")
    p.add_argument("--draft-tokens", type=int, default=None, help="tokens verified per step, "
                   "root included (--speculative-num-draft-tokens); forced to S+1 for chains")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy verification; "
                   ">0 = rejection sampling (chains)")
    p.add_argument("--features", choices=["fused", "last_layer"], default="fused",
                   help="what the drafter is fed: the fused aux states (correct) or the "
                   "target's last hidden state (a server that captures no aux states)")
    p.add_argument("--load-as", default=None, help="load the drafter as this engine would "
                   "(sglang, sglang-0.5.23, vllm, speculators); default: as trained")
    p.add_argument("--compare-failures", action="store_true", help="also measure the "
                   "last_layer arm and an SGLang-config/speculators-keys copy loaded as sglang")
    p.add_argument("--render-as", default=None, metavar="PRESET|FILE",
                   help="render the prompts as serving will, to measure a chat-template drift "
                   "before a server starts: a preset (template: the tokenizer's template, no "
                   "system message; empty-system: an empty system message; trained: as the "
                   "drafter's eagle3lab.json records its data was rendered), a JSON settings "
                   "file {\"chat_template\": PATH|null, \"system_prompt\": TEXT|null, "
                   "\"template_kwargs\": {...}}, or a Jinja chat template file; default: the "
                   "tokenizer's template, no system message. Recorded in the output "
                   "('rendering')")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--engine", choices=["auto", "eager", "static"], default="auto",
                   help="auto: static on a GPU (Llama-family targets), eager elsewhere; "
                   "eager: HF forwards with dynamic caches, one prompt at a time (any target; "
                   "the CPU path); static: static KV caches, the target's verify step and the "
                   "drafter's step replayed as CUDA graphs on a GPU, prompts batched")
    p.add_argument("--batch-size", type=int, default=1, help="prompts in flight (static "
                   "engine). Above 1, acceptance is measured over the batch and tokens/s "
                   "and speedups are batch-B figures (throughput); measure batch-1 speed "
                   "with --batch-size 1")


def run(args) -> int:
    import tempfile

    from eagle3lab.specdec.accept import Arm, measure_acceptance, summary_rows
    from eagle3lab.specdec.load import check_draft
    from eagle3lab.workdir import drafter_or_default

    draft = drafter_or_default(args.draft, args.target)
    # located and read once, before --compare-failures resolves (maybe prepares) the
    # target; every arm on it shares the opened drafter
    drafter = check_draft(draft)
    arms = [Arm("draft", drafter, args.features, args.load_as)]
    with drafter, tempfile.TemporaryDirectory() as tmp:
        if args.compare_failures:
            from eagle3lab.specdec.failures import sglang_config_speculators_keys
            from eagle3lab.targets.adapter import resolve_target_path

            bad = sglang_config_speculators_keys(drafter.path, f"{tmp}/keys-mismatch",
                                                 target=resolve_target_path(args.target))
            arms += [Arm("last_layer features", drafter, "last_layer"),
                     Arm("sglang config + layers.0 keys", str(bad), "fused", "sglang")]
        r = measure_acceptance(target=args.target, arms=arms, prompts=args.prompts,
                               limit=args.limit, max_new_tokens=args.max_new_tokens,
                               steps=args.steps, topk=args.topk,
                               draft_tokens=args.draft_tokens, temperature=args.temperature,
                               seed=args.seed, device=args.device, dtype=args.dtype,
                               threads=args.threads, progress=not args.json,
                               engine=args.engine, batch_size=args.batch_size,
                               render_as=args.render_as)
    if args.json:
        print(json.dumps(r, indent=2, default=str))
        return 0
    import pandas as pd

    from eagle3lab.data.rendering import describe

    print(f"{r['requests']} prompts, {r['settings']}; tau includes the bonus token; acc@k = "
          f"P(draft positions 1..k all accepted)")
    print(f"rendered with {describe(r['rendering'])}")
    print(pd.DataFrame(summary_rows(r)).to_string(index=False))
    for a in r["arms"]:
        print(f"{a['name']}: accept histogram {a['stats']['accept_histogram']}")
    if "batch" in r:
        print(f"batch {r['batch']['size']} (throughput over the whole run; tok/s leaves out "
              f"the one-off CUDA graph captures):")
        for run in r["batch"]["runs"]:
            print(f"  {run['name']}: {run['tokens_per_s']:.1f} tok/s, "
                  f"{run['prompts_per_min']:.1f} prompts/min, x{run['speedup'] or 0:.2f} vs "
                  f"plain, {run['wall_s']:.1f} s (graph captures {run['capture_s']:.1f} s)")
    return 0
