"""Train the accuracy suite's small Llama (transformers LlamaForCausalLM) on the committed stdlib corpus.

    python accuracy/train_tiny_llama.py --out accuracy/models/tiny-llama-s0 --seed 0   # GPU: ~2-4 min on an H200
    python accuracy/train_tiny_llama.py --smoke --out accuracy/models/tiny-smoke      # CPU: a few steps, ~20 s

Model (default): 8 layers, hidden 512, 4 query heads / 2 KV heads (GQA) of head size 128, SwiGLU 1536, vocab 8192
(the committed byte-level BPE), context 2048 (long enough for fp8's long-range error to show), tied embeddings:
~29M parameters. Data: `accuracy/data/corpus.jsonl.xz`
(CPython 3.12.1 stdlib source, sha256-checked against `accuracy/data/manifest.json`), train split only; each file
ends with <|endoftext|>, the token stream is cut into 2049-token windows, shuffled per epoch from the seed.

Deterministic: seeds for init and data order, `torch.use_deterministic_algorithms(True)`, eager attention (no
fused attention kernels with atomics), fixed CUBLAS workspace; the same seed, device type and library versions give
the same weights (`train_info.json` records their sha256). bf16 autocast on the GPU, fp32 on the CPU.

Writes to --out: config.json, generation_config.json, model.safetensors (bf16), the tokenizer files (so
`AutoTokenizer.from_pretrained(out)` and vLLM load the folder), heldout_ppl.jsonl (the held-out split), and
train_info.json (settings, loss curve, held-out token perplexity, hashes, versions).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_data import DATA, TOKENIZER, load_corpus, sha256_bytes  # noqa: E402


@dataclasses.dataclass
class Settings:
    hidden_size: int = 512
    num_layers: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 128
    intermediate_size: int = 1536
    seq_len: int = 2048
    batch_size: int = 16
    steps: int = 900  # 16 x 2048 tokens per step: ~29M tokens, ~4 passes over the ~7.6M training tokens
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 60
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 150
    eval_tokens: int = 1 << 30  # held-out tokens scored at each evaluation (all of them by default)
    train_char_limit: int = 0  # 0 = the whole train split


SMOKE = dict(
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    seq_len=64,
    batch_size=4,
    steps=6,
    lr=3e-3,
    warmup_steps=2,
    eval_every=3,
    eval_tokens=2048,
    train_char_limit=200_000,
)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_deterministic(seed: int) -> None:
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def tokenize_split(tokenizer, docs: list[dict], split: str, char_limit: int = 0) -> torch.Tensor:
    """One int32 stream: every file of `split`, in corpus order, each followed by <|endoftext|>."""
    ids: list[int] = []
    chars = 0
    for doc in docs:
        if doc["split"] != split:
            continue
        ids += tokenizer.encode(doc["text"], add_special_tokens=False)
        ids.append(tokenizer.eos_token_id)
        chars += len(doc["text"])
        if char_limit and chars >= char_limit:
            break
    return torch.tensor(ids, dtype=torch.int32)


def summed_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The summed next-token negative log-likelihood of `labels` (-100: not counted) under `logits` [..., vocab],
    with ops that are deterministic on CUDA: cross_entropy over [batch, vocab, tokens] runs nll_loss2d, which has
    no deterministic CUDA kernel (it raises under torch.use_deterministic_algorithms); a 1-D gather does."""
    vocab = logits.shape[-1]
    log_probs = logits.float().log_softmax(-1).reshape(-1)
    flat = labels.reshape(-1)
    index = torch.arange(flat.numel(), device=flat.device) * vocab + flat.clamp_min(0)
    return -(log_probs.gather(0, index) * (flat != -100)).sum()


def build_model(s: Settings, vocab_size: int, eos_id: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        max_position_embeddings=s.seq_len,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
    )
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config)


def lr_at(step: int, s: Settings) -> float:
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def batches(stream: torch.Tensor, s: Settings, seed: int):
    """Endless (epoch, [batch, seq_len + 1]) windows of the stream, reshuffled every epoch from the seed."""
    window = s.seq_len + 1
    num = (len(stream) - 1) // s.seq_len
    starts = torch.arange(num) * s.seq_len
    epoch = 0
    while True:
        order = torch.randperm(num, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for i in range(0, num - s.batch_size + 1, s.batch_size):
            idx = starts[order[i : i + s.batch_size]]
            yield epoch, torch.stack([stream[j : j + window] for j in idx.tolist()]).long()
        epoch += 1


@torch.no_grad()
def heldout_nll(model, stream: torch.Tensor, s: Settings, device, autocast) -> tuple[float, int]:
    """Mean token NLL over disjoint seq_len windows of the held-out stream (each window starts without context)."""
    model.eval()
    total, count = 0.0, 0
    limit = min(len(stream) - 1, s.eval_tokens)
    chunks = [stream[i : i + s.seq_len + 1] for i in range(0, limit, s.seq_len)]
    chunks = [c for c in chunks if len(c) > 1]
    for i in range(0, len(chunks), s.batch_size):
        group = chunks[i : i + s.batch_size]
        length = max(len(c) for c in group)
        ids = torch.full((len(group), length), -100, dtype=torch.long)
        for row, c in enumerate(group):
            ids[row, : len(c)] = c.long()
        inputs = ids[:, :-1].clamp_min(0).to(device)
        labels = ids[:, 1:].to(device)
        with autocast():
            logits = model(input_ids=inputs).logits.float()
        total += summed_nll(logits, labels).item()
        count += int((labels != -100).sum())
    model.train()
    return total / max(count, 1), count


def file_sha256(path: Path) -> str:
    return sha256_bytes(path.read_bytes())


def train(args) -> dict:
    from transformers import AutoTokenizer

    device = pick_device(args.device)
    s = Settings(**(SMOKE if args.smoke else {}))
    for field in dataclasses.fields(Settings):
        value = getattr(args, field.name, None)
        if value is not None:
            setattr(s, field.name, value)
    make_deterministic(args.seed)
    manifest = json.loads((DATA / "manifest.json").read_text())
    tokenizer_sha = file_sha256(TOKENIZER / "tokenizer.json")
    if tokenizer_sha != manifest["tokenizer"]["tokenizer_json_sha256"]:
        raise SystemExit(f"{TOKENIZER}/tokenizer.json does not match the manifest's sha256: rebuild deliberately")
    docs = load_corpus(expected_sha256=manifest["corpus_sha256"])
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer.model_max_length = 1 << 30  # whole files are tokenized here, windows are cut afterwards
    t0 = time.perf_counter()
    train_stream = tokenize_split(tokenizer, docs, "train", s.train_char_limit)
    heldout_stream = tokenize_split(tokenizer, docs, "heldout")
    print(
        f"[train] tokens: train {len(train_stream):,}, held-out {len(heldout_stream):,} "
        f"({time.perf_counter() - t0:.1f} s)",
        flush=True,
    )

    model = build_model(s, len(tokenizer), tokenizer.eos_token_id).to(device)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"[train] {num_params / 1e6:.1f}M parameters on {device}; {s.steps} steps of {s.batch_size}x{s.seq_len}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=s.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=False,
    )

    def autocast():
        if device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    log = []
    data = batches(train_stream, s, args.seed)
    start = time.perf_counter()
    tokens_seen = 0
    for step in range(s.steps):
        epoch, batch = next(data)
        batch = batch.to(device, non_blocking=True)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, s)
        with autocast():
            logits = model(input_ids=batch[:, :-1]).logits
        loss = summed_nll(logits, batch[:, 1:]) / batch[:, 1:].numel()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        optimizer.step()
        tokens_seen += batch[:, 1:].numel()
        if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
            nll, count = heldout_nll(model, heldout_stream, s, device, autocast)
            elapsed = time.perf_counter() - start
            entry = {
                "step": step + 1,
                "epoch": epoch,
                "tokens": tokens_seen,
                "train_loss": loss.item(),
                "heldout_nll": nll,
                "heldout_ppl": math.exp(nll),
                "elapsed_s": round(elapsed, 1),
            }
            log.append(entry)
            print(
                f"[train] step {step + 1:5d} epoch {epoch} loss {loss.item():.4f} held-out ppl {math.exp(nll):.3f} "
                f"({count:,} tokens) {elapsed:.0f} s, {tokens_seen / elapsed:,.0f} tok/s",
                flush=True,
            )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    final_nll, final_count = heldout_nll(model, heldout_stream, s, device, autocast)
    model.config.dtype = torch.bfloat16
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the committed files exactly (class name included)
        shutil.copyfile(TOKENIZER / name, out / name)
    shutil.copyfile(DATA / "heldout_ppl.jsonl", out / "heldout_ppl.jsonl")
    import tokenizers
    import transformers

    info = {
        "settings": dataclasses.asdict(s),
        "smoke": args.smoke,
        "seed": args.seed,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "num_parameters": num_params,
        "train_tokens": len(train_stream),
        "heldout_tokens_scored": final_count,
        "heldout_token_ppl_bf16_weights": math.exp(final_nll),
        "log": log,
        "train_seconds": round(time.perf_counter() - start, 1),
        "corpus_sha256": manifest["corpus_sha256"],
        "tokenizer_json_sha256": tokenizer_sha,
        "weights_sha256": file_sha256(out / "model.safetensors"),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
    (out / "train_info.json").write_text(json.dumps(info, indent=1) + "\n")
    print(
        f"[train] wrote {out}: held-out token ppl (bf16 weights) {math.exp(final_nll):.3f}, "
        f"weights sha256 {info['weights_sha256'][:16]}",
        flush=True,
    )
    return info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="model folder to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument("--smoke", action="store_true", help="tiny model, a few steps on a slice (CPU check)")
    for name in ("steps", "batch_size", "seq_len", "eval_every", "eval_tokens", "train_char_limit"):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
