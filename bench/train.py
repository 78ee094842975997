"""Drafter training throughput: our loop (eagle3lab.train) vs speculators' own Trainer,
on the same shards in the same process, plus FLOP/s and MFU.

Prints tokens/s (positions processed per second, steady state after --warmup steps) of
  eagle3lab.train   the library's training loop (speculators' model, loss and packing)
  speculators       speculators.train.trainer.Trainer on a DataLoader over the same
                    shards (same packing, same collate); if it cannot run here, exactly why
and their ratio. FLOPs per token count the trainable matmuls x3 (forward + backward), the
frozen draft head x2, the frozen verifier head once, and causal attention over each
packed document; MFU = achieved FLOP/s / --peak-flops.

CPU, default shards (data/runs/default/shards/train, else a few synthetic conversations
through the default target):
    .venv/bin/python bench/train.py
GPU, a drafter for the default target, then one sized for an 8B target (random shards):
    .venv/bin/python bench/train.py --device cuda --steps 30 --peak-flops 989e12
    .venv/bin/python bench/train.py --device cuda --hidden 4096 --steps 30 --peak-flops 989e12
(989e12 = H100/H200 SXM dense BF16 peak.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Not bench/ itself on sys.path: a bench script named like a stdlib module (inspect.py)
# would shadow it. The repository root instead, so `eagle3lab` imports without install.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_SHARDS = Path(__file__).resolve().parent.parent / "data/runs/default/shards/train"


def synthetic_shards(root: Path, n: int = 24, draft_vocab_size: int = 8192) -> Path:
    """Shipped train prompts answered by 160 tokens of another prompt's text, extracted
    through the default target (realistic lengths, no generation)."""
    from eagle3lab.data.extract import extract
    from eagle3lab.data.prompts import chat_prompt_ids, conversation_record, load_prompts
    from eagle3lab.data.vocab import build_shard_vocab
    from eagle3lab.targets.adapter import load_target

    tgt = load_target("smollm2-135m-instruct", device="cpu")
    tok = tgt.tokenizer
    prompts = load_prompts("train", limit=2 * n)
    root.mkdir(parents=True, exist_ok=True)
    conv = root / "conversations.jsonl"
    with open(conv, "w") as f:
        for i in range(n):
            p, other = prompts[i], prompts[-1 - i]
            resp = tok((other.prompt + " ") * 4).input_ids[:160] + [tok.eos_token_id]
            f.write(json.dumps(conversation_record(
                p, chat_prompt_ids(tok, p.prompt), resp, "", "stop", None)) + "\n")
    extract(conversations=conv, out=root / "shards", target=tgt, progress=False)
    build_shard_vocab(data=root / "shards", draft_vocab_size=draft_vocab_size)
    return root / "shards"


def random_shards(root: Path, *, hidden: int, layers: int, heads: int, kv_heads: int,
                  intermediate: int, vocab: int, draft_vocab: int, samples: int,
                  seq: int) -> Path:
    """A config-only Llama target of the given shape (with random embed/norm weights, tied
    head) and random bf16 shards + vocab map in the eagle3lab format."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, LlamaConfig

    from eagle3lab.data.shards import FORMAT, FORMAT_VERSION, shard_name, write_manifest, write_shard
    from eagle3lab.data.vocab import build_shard_vocab
    from eagle3lab.targets.adapter import config_sha256
    from eagle3lab.targets.auxlayers import resolve_aux_layers

    tdir = root / "target"
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, intermediate_size=intermediate,
                      vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=8192,
                      rope_theta=500000.0, architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(tdir)
    cfg = AutoConfig.from_pretrained(tdir)  # hash what a reader of the directory sees
    g = torch.Generator().manual_seed(0)
    save_file({"model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=g) * 0.02)
               .to(torch.bfloat16), "model.norm.weight": torch.ones(hidden)},
              str(tdir / "model.safetensors"))
    aux = resolve_aux_layers(layers)
    sdir = root / "shards"
    sdir.mkdir(parents=True)
    entries = []
    for k in range(samples):
        s = {"input_ids": torch.randint(0, vocab, (seq,), generator=g),
             "loss_mask": torch.ones(seq, dtype=torch.uint8),
             "hidden_states": torch.randn(seq, 3 * hidden, generator=g),
             "verifier_last_hidden_states": torch.randn(seq, hidden, generator=g),
             "sample_index": k}
        entries.append(write_shard(sdir / shard_name(k), [s], torch.bfloat16))
    write_manifest(sdir, {
        "format": FORMAT, "version": FORMAT_VERSION,
        "target": {"name": f"random-llama-h{hidden}", "path": str(tdir),
                   "config_sha256": config_sha256(cfg.to_dict()), "num_layers": layers,
                   "hidden_size": hidden, "vocab_size": vocab},
        "aux_layers": aux.to_dict(), "dtype": "bfloat16", "shards": entries})
    build_shard_vocab(data=sdir, draft_vocab_size=draft_vocab)
    return sdir


def flops_per_token(info: dict, layer_cfg: dict, ttt: int, mean_doc_len: float) -> float:
    h, i = layer_cfg["hidden_size"], layer_cfg["intermediate_size"]
    hd = layer_cfg.get("head_dim") or h // layer_cfg["num_attention_heads"]
    q, kv = layer_cfg["num_attention_heads"] * hd, layer_cfg["num_key_value_heads"] * hd
    vd = info["drafter"]["draft_vocab_size"]
    layer = 2 * (2 * h * (q + 2 * kv) + q * h + 3 * h * i)  # qkv from 2H, o, gate/up/down
    attn = 2 * 2 * q * (mean_doc_len / 2 + 1)  # QK^T and AV over the causal context
    trainable = 2 * 3 * h * h + ttt * (layer + attn)  # fc once per token
    return 3 * trainable + ttt * 2 * (2 * h * vd) + 2 * h * vd


def bench_ours(data: Path, out: Path, *, steps: int, warmup: int, max_tokens: int, ttt: int,
               device: str, attn: str) -> dict:
    from eagle3lab.train import read_run, train

    train(data=str(data), out=str(out), max_steps=steps + warmup, epochs=1000,
          max_tokens_per_batch=max_tokens, ttt_steps=ttt, eval_every=0, eval_at_start=False,
          eval_fraction=0.05, device=device, progress=False, schedule="constant",
          pad_batches=device.startswith("cuda"), draft_attn=attn)
    return {**steady_rate(out, warmup), "info": read_run(out)}


def steady_rate(out: Path, warmup: int) -> dict:
    """tokens/s of a run from its metrics.jsonl, after `warmup` steps (steady state), and
    the tokens per step."""
    from eagle3lab.train.counts import read_metrics

    df = read_metrics(out)
    df = df[df["train_loss_0"].notna()].reset_index(drop=True)
    a, b = df.iloc[warmup - 1], df.iloc[-1]
    steps = int(b["step"] - a["step"])
    return {"tokens_per_s": (b["tokens"] - a["tokens"]) / (b["wall_s"] - a["wall_s"]),
            "steps": steps, "tokens_per_step": (b["tokens"] - a["tokens"]) / max(steps, 1)}


def bench_speculators(data: Path, *, steps: int, warmup: int, max_tokens: int, ttt: int,
                      device: str, attn: str, patch: bool) -> dict:
    """speculators' Trainer on our shards. patch=True applies the one change it needs on
    a CPU-only machine (device 'cpu' instead of local rank 0 = CUDA)."""
    import torch
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3.data import shift_batch
    from speculators.train import trainer as sp_trainer
    from speculators.train.data import CollateFn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from torch.utils.data import DataLoader, Dataset

    from eagle3lab.data.shards import ShardSet
    from eagle3lab.train import build_drafter

    shards = ShardSet(data)
    d2t, t2d = shards.vocab_map()

    class DS(Dataset):
        def __len__(self):
            return len(shards)

        def __getitem__(self, i):
            s = shards[i]
            n = s["input_ids"].shape[0]
            s["lengths"] = torch.tensor([n])
            s["position_ids"] = torch.arange(n)
            return s

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    loader = DataLoader(DS(), batch_sampler=MultipackDistributedBatchSamplerV2(
        max_tokens, shards.lengths(), 1, 0, seed=0), collate_fn=CollateFn(
        max_tokens, shards.hidden_size, len(shards.aux.capture_points), dtype, shift_batch))
    torch.manual_seed(0)
    model = build_drafter(target_path=shards.manifest["target"]["path"], aux=shards.aux,
                          d2t=d2t, t2d=t2d, ttt_steps=ttt, attn=attn)
    kw = {"ttt_steps": ttt, "ttt_step_loss_decay": 1.0,
          "loss_config": resolve_loss_config("kl_div", "eager")}
    tmp = tempfile.mkdtemp(prefix="sp-trainer-")
    if patch:  # the two CPU shims: a real device, and no accelerator synchronize
        sp_trainer.get_local_rank = lambda: device
        if not torch.accelerator.is_available():
            torch.accelerator.synchronize = lambda *a, **k: None
    cfg = sp_trainer.TrainerConfig(lr=1e-4, num_epochs=1000, save_path=tmp,
                                   train_call_kwargs=kw, val_call_kwargs=kw,
                                   scheduler_type="none", log_freq=10 ** 9,
                                   hidden_states_dtype=dtype, max_steps=warmup + steps)
    tr = sp_trainer.Trainer(model, cfg, loader, None)
    tokens, times = [], []
    model.register_forward_pre_hook(
        lambda m, a, k: tokens.append(int((k["document_ids"] != -1).sum())), with_kwargs=True)

    def tick():
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter())

    epoch = 0
    while tr.global_step < warmup + steps:
        tr.train_epoch(epoch, step_callback=tick)
        epoch += 1
    return {"tokens_per_s": sum(tokens[warmup:]) / (times[-1] - times[warmup - 1]),
            "steps": steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="train shards (default: the default run's, "
                    "else synthetic)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (>= 1)")
    ap.add_argument("--max-tokens", type=int, default=2048, help="packed tokens per step")
    ap.add_argument("--ttt", type=int, default=3, help="TTT steps")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager", "simple_flex_attention"],
                    help="draft attention kernel (flex: speculators' GPU default)")
    ap.add_argument("--hidden", type=int, default=None,
                    help="random shards for a target of this hidden size (4096: 8B-like)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--samples", type=int, default=16, help="random samples (one per shard)")
    ap.add_argument("--seq", type=int, default=2048, help="tokens per random sample")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help="accelerator peak FLOP/s for MFU (H100/H200 bf16 dense: 989e12)")
    ap.add_argument("--skip-speculators", action="store_true")
    args = ap.parse_args(argv)
    args.warmup = max(args.warmup, 1)

    from eagle3lab.targets.adapter import resolve_device

    device = resolve_device(args.device)
    root = Path(tempfile.mkdtemp(prefix="bench-train-"))
    if args.hidden:
        data = random_shards(root / "random", hidden=args.hidden, layers=args.layers,
                             heads=args.heads, kv_heads=args.kv_heads,
                             intermediate=args.intermediate, vocab=args.vocab,
                             draft_vocab=args.draft_vocab, samples=args.samples, seq=args.seq)
        what = f"random shards, {args.layers}-layer hidden-{args.hidden} target"
    elif args.data or DEFAULT_SHARDS.exists():
        data = Path(args.data or DEFAULT_SHARDS)
        what = f"shards {data}"
    else:
        data = synthetic_shards(root / "synthetic")
        what = "synthetic conversations through the default target (no default shards yet)"
    print(f"bench/train.py: {what}; device {device}; {args.max_tokens} tokens/step; "
          f"TTT {args.ttt}; {args.warmup} warmup + {args.steps} timed steps")

    ours = bench_ours(data, root / "run", steps=args.steps, warmup=args.warmup,
                      max_tokens=args.max_tokens, ttt=args.ttt, device=device, attn=args.attn)
    info = ours["info"]
    layer_cfg = json.loads((root / "run" / "final" / "config.json").read_text())[
        "transformer_layer_config"]
    from eagle3lab.data.shards import ShardSet

    lengths = ShardSet(data).lengths()
    mean_doc = sum(min(x, args.max_tokens) for x in lengths) / len(lengths)
    fpt = flops_per_token(info, layer_cfg, args.ttt, mean_doc)
    print(f"  drafter: hidden {info['drafter']['hidden_size']}, draft vocab "
          f"{info['drafter']['draft_vocab_size']}, {info['drafter']['trainable_params']:,} "
          f"trainable params, {fpt / 1e9:.3f} GFLOP/token (train step)")
    line = f"  eagle3lab.train : {ours['tokens_per_s']:10,.0f} tokens/s"
    flops = ours["tokens_per_s"] * fpt
    line += f"  {flops / 1e12:8.3f} TFLOP/s"
    if args.peak_flops:
        line += f"  MFU {flops / args.peak_flops:.1%}"
    print(line)

    if args.skip_speculators:
        return 0
    kw = dict(steps=args.steps, warmup=args.warmup, max_tokens=args.max_tokens, ttt=args.ttt,
              device=device, attn=args.attn)
    try:
        sp = bench_speculators(data, patch=False, **kw)
        note = "unmodified"
    except Exception as e:  # noqa: BLE001 - report exactly why it does not run
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno} `{f.line}`" for f in reversed(tb)
                      if "speculators" in f.filename), "")
        print(f"  speculators Trainer (unmodified) does not run here: {type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''} (at {where}). It moves the model "
              f"to device `local_rank` (the int 0, i.e. CUDA) and autocasts for 'cuda' when "
              f"no accelerator is present.")
        if device.startswith("cuda"):
            return 0
        try:
            sp = bench_speculators(data, patch=True, **kw)
            note = ("patched: device 'cpu' instead of local rank 0, and "
                    "torch.accelerator.synchronize made a no-op")
        except Exception as e2:  # noqa: BLE001
            tb = traceback.extract_tb(e2.__traceback__)
            where = next((f"{Path(f.filename).name}:{f.lineno} `{f.line}`" for f in
                          reversed(tb) if "speculators" in f.filename), "")
            print(f"  speculators Trainer does not run even with device 'cpu': "
                  f"{type(e2).__name__}: {e2} (at {where})")
            return 0
    print(f"  speculators      : {sp['tokens_per_s']:10,.0f} tokens/s  ({note})")
    print(f"  ratio eagle3lab / speculators: {ours['tokens_per_s'] / sp['tokens_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("train.py", main))
