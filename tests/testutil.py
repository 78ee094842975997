"""Test helpers shared by all test directories (a module, not a conftest, so that it
imports the same way from every directory)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def make_tiny_llama(path: Path, tokenizer_src: Path, *, layers: int = 8, hidden: int = 64,
                    head_scale: float = 1.0, seed: int = 0) -> Path:
    """A random-weight Llama with the real SmolLM2 tokenizer (vocab 49152), saved as HF dir.

    head_scale multiplies the tied embedding/head: > 1 makes next-token distributions sharp
    (a learnable task for training tests)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    if head_scale != 1.0:
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(head_scale)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_src / name).exists():
            shutil.copy(tokenizer_src / name, path / name)
    return path


def write_conversations(path: Path, tokenizer, n: int = 10, seed: int = 0) -> Path:
    """Synthetic conversations in `regenerate`'s record format (no generation needed)."""
    import random

    from eagle3lab.data.prompts import Prompt, chat_prompt_ids, conversation_record

    rng = random.Random(seed)
    words = "the a model token draft layer state speed test data run fast slow good".split()
    with open(path, "w") as f:
        for i in range(n):
            p = Prompt(f"c{i}", " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
            answer = " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))
            resp = tokenizer(answer).input_ids + [tokenizer.eos_token_id]
            rec = conversation_record(p, chat_prompt_ids(tokenizer, p.prompt), resp, answer,
                                      "stop", None)
            f.write(json.dumps(rec) + "\n")
    return path


def fork_ranks(fn, *, world: int = 2, env: dict | None = None, limit_s: float = 120,
               stop_when=None) -> None:
    """`eagle3lab.distributed.fork_ranks` with a test's time limit: the ranks of a torchrun
    job forked from this process (the libraries are not imported again per rank), each
    calling fn(rank); waits until every rank has ended or stop_when() is true (the others
    are then killed: a hung rank). A rank that raises fails the test with its traceback;
    ranks still running after limit_s fail it with a TimeoutError."""
    from eagle3lab.distributed import fork_ranks as fork

    fork(fn, world=world, env=env, limit_s=limit_s, stop_when=stop_when)


def study_poll(work: Path, out: Path, *, seconds: int | str = 0, timeout: int = 300,
               rc: int = 0, **env: str):
    """bench/study_poll.sh SECONDS as the device runs it: $OUT = `out` (made here),
    STUDY_WORK = `work`, python3 = this interpreter, `env` on top (STUDY_WINNER=...,
    STUDY_CARRY_OUT=...); the finished process, its exit code checked against `rc`."""
    import os
    import subprocess
    import sys

    out.mkdir()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OUT": str(out),
           "STUDY_WORK": str(work),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **env}
    script = Path(__file__).resolve().parents[1] / "bench" / "study_poll.sh"
    r = subprocess.run(["bash", str(script), str(seconds)], env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == rc, r.stdout[-4000:] + r.stderr[-4000:]
    return r


def torchrun(nproc: int, *args, module: str | None = "eagle3lab", timeout: float = 600):
    """`python -m torch.distributed.run --nproc-per-node N --master-port FREE -m eagle3lab
    ARGS` (module None: ARGS start with a script) on the CPU (gloo; one OpenMP thread per
    rank); the finished process, checked."""
    import os
    import subprocess
    import sys

    from eagle3lab.distributed import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), *(["-m", "--", module] if module else ["--"]),
           *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def edit_config(path: Path, fn) -> Path:
    """Apply `fn` to a checkpoint's config.json (a dict, edited in place) and save it."""
    cfg = json.loads((path / "config.json").read_text())
    fn(cfg)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


def edit_state(path: Path, fn) -> Path:
    """Apply `fn` to a checkpoint's model.safetensors state dict and save it back."""
    from safetensors.torch import load_file, save_file

    f = path / "model.safetensors"
    state = load_file(str(f))
    fn(state)
    save_file(state, str(f), metadata={"format": "pt"})
    return path


def eager_and_static(target, draft, prompts, *, steps: int, topk: int, draft_tokens,
                     max_new_tokens: int, batch_size: int = 2):
    """The same prompts decoded by the eager engine one at a time and by the static engine
    batched (`batch_size` rows): (eager results, static results), to compare."""
    from eagle3lab.specdec.load import load_engine

    shape = dict(steps=steps, topk=topk, draft_tokens=draft_tokens)
    eager = load_engine(target=target, draft=draft, **shape)
    old = [eager.generate(p, max_new_tokens=max_new_tokens) for p in prompts]
    static = load_engine(target=target, draft=draft, **shape, engine="static",
                         batch_size=batch_size)
    return old, static.generate_many(prompts, max_new_tokens=max_new_tokens)


def tiny_study_answers(gen: Path, target: Path, runs: dict[str, dict], *,
                       prompts: int = 12) -> Path:
    """Answers of the tiny `target` to `prompts` short prompts, one file gen/NAME.jsonl per
    entry of `runs` (regenerate's extra arguments: {"limit": 3}, {"temperature": 0.8}): the
    conversations a tiny at-scale study plans from (bench/study_gpu.py plan)."""
    from eagle3lab.data.regenerate import regenerate

    gen.mkdir(parents=True, exist_ok=True)
    src = gen.parent / "study-prompts.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Say {i} words."}) + "\n"
                           for i in range(prompts)))
    for name, extra in runs.items():
        regenerate(prompts=str(src), out=str(gen / f"{name}.jsonl"), target=str(target),
                   max_new_tokens=12, batch_size=4, progress=False, **extra)
    return src
