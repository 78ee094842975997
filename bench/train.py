"""Drafter training throughput: our loop (eagle3lab.train) vs speculators' own Trainer,
on the same shards in the same process, plus FLOP/s and MFU.

Prints tokens/s (positions processed per second, steady state after --warmup steps) of
  eagle3lab.train   the library's training loop (speculators' model, loss and packing)
  speculators       speculators.train.trainer.Trainer on a DataLoader over the same
                    shards (same packing, same collate); if it cannot run here, exactly why
and their ratio. FLOPs per token count the trainable matmuls x3 (forward + backward), the
frozen draft head x2, the frozen verifier head once, and causal attention over each
packed document (the useful work: a dense mask computes more); MFU = achieved FLOP/s /
--peak-flops.

--draft-attn takes several kernels (comma-separated: sdpa, eager, simple_flex_attention,
auto), measured one after the other on the same shards: the loop's tokens/s of each (a
kernel that cannot train here says why) and each one's ratio to the first; then the
drafter step alone (`step_times`: one packed batch of --max-tokens tokens in documents of
--doc-len, random states, the loop's dtype and autocast) per kernel: forward + backward
and forward only, milliseconds and ratios. The step isolates the attention's share: the
dense-mask kernels' cost grows with the square of the packed length, flex's with it.
--json writes every number.

CPU, default shards (data/runs/default/shards/train, else a few synthetic conversations
through the default target):
    .venv/bin/python bench/train.py
GPU, a drafter for the default target, then one sized for an 8B target (random shards):
    .venv/bin/python bench/train.py --device cuda --steps 30 --peak-flops 989e12
    .venv/bin/python bench/train.py --device cuda --max-tokens 16384 --ttt 5 \
        --draft-attn sdpa,simple_flex_attention --skip-speculators     # the kernels
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


def synthetic_shards(root: Path, n: int = 24, draft_vocab_size: int = 8192,
                     target: str = "smollm2-135m-instruct") -> Path:
    """Shipped train prompts answered by 160 tokens of another prompt's text, extracted
    through `target` (default: the default target; realistic lengths, no generation)."""
    from eagle3lab.data.extract import extract
    from eagle3lab.data.prompts import chat_prompt_ids, conversation_record, load_prompts
    from eagle3lab.data.vocab import build_shard_vocab
    from eagle3lab.targets.adapter import load_target

    tgt = load_target(target, device="cpu")
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


ATTNS = ("sdpa", "eager", "simple_flex_attention", "auto")


def parse_attns(text: str) -> list[str]:
    """--draft-attn's comma-separated kernels, in order, each once."""
    out = []
    for a in (x.strip() for x in text.split(",") if x.strip()):
        if a not in ATTNS:
            raise SystemExit(f"--draft-attn: unknown kernel {a!r}; choose from "
                             f"{', '.join(ATTNS)} (comma-separated)")
        if a not in out:
            out.append(a)
    if not out:
        raise SystemExit("--draft-attn: name at least one kernel")
    return out


def packed_batch(*, tokens: int, doc_len: int, hidden: int, n_aux: int, vocab: int,
                 device: str, dtype, seed: int = 0) -> dict:
    """One collated batch as the loop feeds the drafter: documents of `doc_len` tokens
    (the last one shorter) packed into `tokens`, each with its own positions and loss on
    every token; random states and ids."""
    import torch

    g = torch.Generator().manual_seed(seed)
    doc = torch.arange(tokens) // doc_len
    pos = torch.arange(tokens) % doc_len
    b = {"hidden_states": torch.randn(1, tokens, n_aux * hidden, generator=g).to(dtype),
         "input_ids": torch.randint(0, vocab, (1, tokens), generator=g),
         "document_ids": doc[None], "loss_mask": torch.ones(1, tokens, dtype=torch.long),
         "position_ids": pos[None],
         "verifier_last_hidden_states": torch.randn(1, tokens, hidden, generator=g).to(dtype)}
    return {k: v.to(device) for k, v in b.items()}


def step_times(data: Path, attns: list[str], *, tokens: int, doc_len: int, ttt: int,
               device: str, reps: int, warmup: int) -> dict:
    """Per kernel, the drafter step alone on one packed batch (shards' target, aux layers
    and vocab map; the loop's dtype and autocast): forward + backward ("train_ms") and
    forward only ("forward_ms"), mean of `reps` after `warmup` untimed ones (CUDA: the
    first calls compile speculators' forward). A part that cannot run says why
    ("train_problem" / "forward_problem"); "auto" is timed as what it resolves to here."""
    import contextlib

    import torch
    from speculators.losses import resolve_loss_config

    from eagle3lab.data.foreign import open_shards
    from eagle3lab.errors import UserError
    from eagle3lab.train import build_drafter
    from eagle3lab.train.model import resolve_draft_attn

    shards = open_shards(data)
    d2t, t2d = shards.vocab_map()
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    auto = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda \
        else contextlib.nullcontext
    hidden = int(shards.hidden_size)
    batch = packed_batch(tokens=tokens, doc_len=doc_len, hidden=hidden,
                         n_aux=len(shards.aux.capture_points),
                         vocab=int(shards.manifest["target"]["vocab_size"]), device=device,
                         dtype=dtype)
    kw = {"ttt_steps": ttt, "ttt_step_loss_decay": 1.0,
          "loss_config": resolve_loss_config("kl_div", "eager")}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(fn) -> float:
        for _ in range(warmup):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        return (time.perf_counter() - t0) / reps * 1e3

    out = {}
    for attn in attns:
        kernel = resolve_draft_attn(attn, device=device, max_tokens=tokens) \
            if attn == "auto" else attn
        row = {"kernel": kernel, "train_ms": None, "forward_ms": None,
               "train_problem": None, "forward_problem": None}
        torch._dynamo.reset()  # each kernel compiles afresh (the recompile limit is per process)
        torch.manual_seed(0)
        model = build_drafter(target_path=shards.manifest["target"]["path"], aux=shards.aux,
                              d2t=d2t, t2d=t2d, ttt_steps=ttt, attn=kernel).to(device)

        def train_step(model=model):
            model.zero_grad(set_to_none=True)
            with auto():
                _, loss, _ = model(**batch, **kw)
            loss.backward()

        def forward(model=model):
            with torch.no_grad(), auto():
                model(**batch, **kw)

        try:  # refuses flex where it cannot train (the CPU: no backward), saying why
            resolve_draft_attn(kernel, device=device, max_tokens=tokens)
            row["train_ms"] = timed(train_step)
        except UserError as e:
            row["train_problem"] = str(e).splitlines()[0]
        except (ValueError, RuntimeError, NotImplementedError) as e:
            row["train_problem"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        try:
            row["forward_ms"] = timed(forward)
        except (ValueError, RuntimeError, NotImplementedError) as e:
            row["forward_problem"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        out[attn] = row
        del model
        if cuda:
            torch.cuda.empty_cache()
    return out


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
    ap.add_argument("--target", default="smollm2-135m-instruct",
                    help="the target the default shards are extracted through (a directory "
                         "or preset; on the device, where the target package is not "
                         "installed, its unpacked directory)")
    ap.add_argument("--draft-attn", "--attn", dest="attn", nargs="+", default=["sdpa"],
                    help="draft attention kernel(s), comma- or space-separated, measured side "
                    "by side: "
                    "sdpa, eager, simple_flex_attention (speculators' GPU default), auto")
    ap.add_argument("--doc-len", type=int, default=330,
                    help="the step benchmark's document length (packed to --max-tokens)")
    ap.add_argument("--step-reps", type=int, default=3,
                    help="timed drafter steps per kernel in the step benchmark (0: none)")
    ap.add_argument("--step-only", action="store_true",
                    help="only the step benchmark (no loop runs, no speculators Trainer)")
    ap.add_argument("--json", default=None, help="write every number to this JSON file")
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
    attns = parse_attns(",".join(args.attn))

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
        data = synthetic_shards(root / "synthetic", target=args.target)
        what = f"synthetic conversations through {args.target} (no default shards yet)"
    print(f"bench/train.py: {what}; device {device}; {args.max_tokens} tokens/step; "
          f"TTT {args.ttt}; {args.warmup} warmup + {args.steps} timed steps; draft attention "
          f"{', '.join(attns)}")
    from eagle3lab.data.shards import ShardSet
    from eagle3lab.errors import UserError
    from eagle3lab.train.model import resolve_draft_attn

    lengths = ShardSet(data).lengths()
    mean_doc = sum(min(x, args.max_tokens) for x in lengths) / len(lengths)
    results: dict = {"what": what, "device": device, "max_tokens": args.max_tokens,
                     "ttt": args.ttt, "loop": {}, "step": None}
    rates: dict[str, float] = {}
    for attn in ([] if args.step_only else attns):
        run = root / f"run-{attn}"
        try:
            ours = bench_ours(data, run, steps=args.steps, warmup=args.warmup,
                              max_tokens=args.max_tokens, ttt=args.ttt, device=device,
                              attn=attn)
        except UserError as e:  # flex where it cannot train: say why, measure the others
            print(f"  eagle3lab.train [{attn}]: cannot train here: {str(e).splitlines()[0]}")
            results["loop"][attn] = {"problem": str(e).splitlines()[0]}
            continue
        info = ours["info"]
        layer_cfg = json.loads((run / "final" / "config.json").read_text())[
            "transformer_layer_config"]
        fpt = flops_per_token(info, layer_cfg, args.ttt, mean_doc)
        if not rates:
            print(f"  drafter: hidden {info['drafter']['hidden_size']}, draft vocab "
                  f"{info['drafter']['draft_vocab_size']}, "
                  f"{info['drafter']['trainable_params']:,} trainable params, "
                  f"{fpt / 1e9:.3f} GFLOP/token (train step)")
        kernel = info["drafter"].get("draft_attn", attn)
        name = attn if kernel == attn else f"{attn} = {kernel}"
        line = f"  eagle3lab.train [{name}]: {ours['tokens_per_s']:10,.0f} tokens/s"
        flops = ours["tokens_per_s"] * fpt
        line += f"  {flops / 1e12:8.3f} TFLOP/s"
        if args.peak_flops:
            line += f"  MFU {flops / args.peak_flops:.1%}"
        print(line)
        rates[attn] = ours["tokens_per_s"]
        results["loop"][attn] = {"kernel": kernel, "tokens_per_s": ours["tokens_per_s"],
                                 "tokens_per_step": ours["tokens_per_step"],
                                 "tflops": flops / 1e12, "gflop_per_token": fpt / 1e9}
    base = next(iter(rates), None)
    for attn, r in rates.items():
        if attn != base:
            print(f"  ratio {attn} / {base} (loop tokens/s): {r / rates[base]:.3f}")
            results["loop"][attn]["ratio_to_first"] = r / rates[base]

    if args.step_reps > 0:
        step = step_times(data, attns, tokens=args.max_tokens, doc_len=args.doc_len,
                          ttt=args.ttt, device=device, reps=args.step_reps,
                          warmup=args.warmup)
        results["step"] = {"doc_len": args.doc_len, "reps": args.step_reps, "rows": step}
        print(f"  drafter step alone: {args.max_tokens} packed tokens in documents of "
              f"{args.doc_len}, TTT {args.ttt}, mean of {args.step_reps} after "
              f"{args.warmup} untimed")
        for attn, row in step.items():
            name = attn if row["kernel"] == attn else f"{attn} = {row['kernel']}"
            cells = []
            for part in ("train", "forward"):
                ms = row[f"{part}_ms"]
                cells.append(f"{part} {ms:9.1f} ms {args.max_tokens / ms * 1e3:10,.0f} tok/s"
                             if ms else f"{part}: cannot run ({row[f'{part}_problem']})")
            print(f"    {name:24} " + "   ".join(cells))
        first = step[attns[0]]
        for attn, row in list(step.items())[1:]:
            for part in ("train", "forward"):
                if row[f"{part}_ms"] and first[f"{part}_ms"]:
                    r = first[f"{part}_ms"] / row[f"{part}_ms"]
                    row[f"{part}_speedup_vs_first"] = r
                    print(f"  ratio {attn} / {attns[0]} ({part} step, tokens/s): {r:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"  results: {args.json}")

    if args.skip_speculators or not rates:
        return 0
    first_attn = resolve_draft_attn(base, device=device, max_tokens=args.max_tokens)
    kw = dict(steps=args.steps, warmup=args.warmup, max_tokens=args.max_tokens, ttt=args.ttt,
              device=device, attn=first_attn)
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
    print(f"  ratio eagle3lab [{base}] / speculators: {rates[base] / sp['tokens_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("train.py", main))
