"""`eagle3lab self-prompt`: the target writes user prompts itself (resumable JSONL).

The options are `SelfPromptConfig`'s fields (`cli.common.add_config_options`), beside the
options several commands share (--target, --device, --dtype, --system-prompt,
--no-progress)."""

from __future__ import annotations

from eagle3lab.cli.common import (add_command, add_config_options, config_from_args,
                                  generation_options)


def add_parser(sub) -> None:
    from eagle3lab.data.selfprompt import SelfPromptConfig
    from eagle3lab.data.stage import STAGE_GROUPS

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
        parents=[generation_options("needs a chat template")])
    add_config_options(p, SelfPromptConfig, groups=STAGE_GROUPS)


def run(args) -> int:
    from eagle3lab.distributed import detect
    from eagle3lab.data.selfprompt import DROP_REASONS, SelfPromptConfig, synthesize_prompts

    s = synthesize_prompts(config_from_args(SelfPromptConfig, args, "self-prompt"),
                           progress=not args.no_progress)
    if not detect().main:  # rank 0 reports for all ranks
        return 0
    c = s["counts"]
    drops = ", ".join(f"{r} {c[r]}" for r in DROP_REASONS)
    print(f"{s['out']}: {s['prompts']} prompts after {s['batches']} batches (kept "
          f"{c['kept']} of {c['sampled']} sampled, keep rate {s['keep_rate'] or 0:.0%}; "
          f"dropped: {drops}; {s['seconds']:.1f} s)")
    return 0
