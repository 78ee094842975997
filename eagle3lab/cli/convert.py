"""`eagle3lab convert`: speculators <-> SGLang checkpoints, by rename tables plus checks."""

from __future__ import annotations

from eagle3lab.cli.common import add_command


def add_parser(sub) -> None:
    p = add_command(
        sub, "convert", run,
        help="convert a drafter between the speculators and SGLang formats",
        description="Rename every tensor by a fixed table (any key without a rule, or a "
        "required rule without a key, fails and writes nothing), copy tensors bit for bit, "
        "translate the config (architectures, draft_vocab_size, target_hidden_size, aux "
        "layer ids moved to where the engine reads them and shifted to its convention), "
        "refuse drafts trained with a norm the engine ignores, inspect the result for its "
        "engine and only then move it into place atomically.")
    p.add_argument("src", metavar="SRC", help="source checkpoint directory (a speculators "
                   "save_path means its checkpoint_best epoch)")
    p.add_argument("dst", metavar="DST", help="output directory (written atomically)")
    p.add_argument("--to", required=True, choices=("sglang", "speculators"),
                   help="output format: sglang (midlayer.*, LlamaForCausalLMEagle3, "
                   "eagle_config ids) or speculators (layers.0.*, as vLLM loads it)")
    p.add_argument("--target", default=None,
                   help="target directory with config.json, or a preset name: fills "
                   "target_hidden_size and the verifier, and checks aux ids against its layers")
    p.add_argument("--engine", default=None,
                   choices=("sglang", "sglang-0.5.23", "vllm", "speculators"),
                   help="the engine the output must pass inspect for (default: sglang for "
                   "--to sglang, vllm for --to speculators); sglang-0.5.23 also allows "
                   "norm_before_fc/fc_norm/norm_output, which that release applies")
    p.add_argument("--force", action="store_true", help="replace a non-empty DST")


def run(args) -> int:
    from eagle3lab.formats.convert import convert_checkpoint

    res = convert_checkpoint(args.src, args.dst, to=args.to, target=args.target,
                             engine=args.engine, force=args.force)
    aux = res.aux
    ids = (f"aux ids {aux['ids']} ({aux['convention']} convention; capture points "
           f"{aux['capture_points']} from {aux['source']})" if aux["ids"] is not None
           else "no aux ids recorded: the engine uses its defaults")
    print(f"{res.path}: {len(res.renamed)} tensors ({sum(k != v for k, v in res.renamed.items())}"
          f" renamed, {len(res.dropped)} dropped: {res.dropped}); {ids}; passes inspect for "
          f"{res.report.engine} ({len(res.report.findings)} warning(s)).")
    return 0
