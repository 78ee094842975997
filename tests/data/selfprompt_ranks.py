"""Self-prompting on the ranks of a torchrun job with the scripted model of
test_selfprompt.py (a random tiny target never ends a user turn): run by its test as
`torchrun --nproc-per-node 2 selfprompt_ranks.py TARGET_DIR OUT EXCLUDE N`."""

import sys

from test_selfprompt import KW, _rows, _ScriptedModel

from eagle3lab.data.selfprompt import synthesize_prompts, user_turn_prefix
from eagle3lab.target.adapter import load_target

if __name__ == "__main__":
    target_dir, out, exclude, n = sys.argv[1:5]
    tgt = load_target(target_dir, device="cpu")
    _, end = user_turn_prefix(tgt.tokenizer)
    tgt.model = _ScriptedModel(tgt.model, _rows(tgt.tokenizer, end))
    synthesize_prompts(target=tgt, out=out, n=int(n), exclude=exclude, **KW)
