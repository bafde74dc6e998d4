"""Encoder-only attention end to end: embeddings of a bidirectional Llama (vLLM's `LlamaBidirectionalModel`,
`is_causal: false`: every attention layer an `EncoderOnlyAttention`) from CUSTOM (tritonfa) against FLASH_ATTN, with
TRITON_ATTN against FLASH_ATTN as the peer spread.

Runs on a GPU host with vLLM 0.24.0 (integration/README.md, "GPU scripts"), one engine per process (_harness):

    python integration/scripts/encoder_check.py --out DIR     # ~2 min: three small engines, one after the other

Each engine: dummy weights re-initialized to well-conditioned random values (`_harness.reinit_weights`), the pooling
runner, prompts of 1 to 1500 token ids embedded in one batch (so several sequences of different lengths share the
step: each sequence's queries must see its whole sequence and nothing of the others). Verdict: CUSTOM's max and
mean |difference| to FLASH_ATTN over every embedding element (the pooler's normalized output) at most twice the
peer's plus a floor (bf16: 2e-3 max, 2e-4 mean). Results: a table and encoder_check.json in --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import _harness as h

MODEL = "llama-bidir-h64"
PROMPT_LENS = (1, 7, 40, 64, 300, 700, 1100, 1500)
FLOOR = (2e-3, 2e-4)  # (max, mean) |difference| two bf16 backends may differ by beyond twice the peer's


def worker(args) -> None:
    model, vocab = h.start_worker(args.model)
    from vllm import LLM

    # the pooling runner needs a tokenizer (session 22, H100: every engine stopped at start-up with
    # skip_tokenizer_init); prompts stay token ids
    model = h.with_id_tokenizer(model, vocab, Path(args.result).with_suffix(".model"))
    start = time.perf_counter()
    llm = LLM(
        model=str(model), load_format="dummy", runner="pooling", dtype="bfloat16",
        attention_backend=args.backend, enforce_eager=True, max_model_len=2048, max_num_batched_tokens=8192,
        max_num_seqs=16, gpu_memory_utilization=args.gpu_memory_utilization, seed=0,
    )  # fmt: skip
    init_s = time.perf_counter() - start
    in_use = h.backends_in_use(llm)
    llm.apply_model(h.reinit_weights)
    prompts = h.token_prompts(vocab, PROMPT_LENS)
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    embeddings = [[float(x) for x in out.outputs.embedding] for out in outputs]
    result = {"gpu": h.gpu_name(), "backends_in_use": in_use, "init_s": round(init_s, 1), "embeddings": embeddings}
    Path(args.result).write_text(json.dumps(result))


def distance(a: list[list[float]], b: list[list[float]]) -> dict:
    """Max and mean |difference| over every element of two runs' embeddings (same prompts, same order)."""
    diffs = [abs(x - y) for ea, eb in zip(a, b, strict=True) for x, y in zip(ea, eb, strict=True)]
    return {"max": max(diffs), "mean": sum(diffs) / len(diffs)}


def verdict(d: dict, peer: dict) -> tuple[bool, str]:
    notes = []
    for part, floor in zip(("max", "mean"), FLOOR):
        bound = 2 * peer[part] + floor
        if d[part] > bound:
            notes.append(f"{part} {d[part]:.2e} > {bound:.2e}")
    return not notes, "; ".join(notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=480, help="seconds per engine")
    parser.add_argument("--out", help="folder for the JSON result (default ./encoder-results)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--model", default=MODEL, help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.25, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    out = h.out_dir("encoder", args.out)
    runs = {}
    for backend in ("FLASH_ATTN", "TRITON_ATTN", "CUSTOM"):
        runs[backend] = h.run_worker(
            Path(__file__), ["--model", args.model, "--backend", backend], out / f"encoder_{backend}.json",
            args.timeout, out / f"encoder_{backend}.log",
        )  # fmt: skip
    record = {"versions": h.gpu_info(), "model": args.model, "prompt_lens": PROMPT_LENS, "runs": {}}
    failed = [b for b, r in runs.items() if "error" in r]
    for backend, run in runs.items():
        record["runs"][backend] = {k: v for k, v in run.items() if k != "embeddings"}
    ok = not failed
    rows = []
    if not failed:
        reference = runs["FLASH_ATTN"]["embeddings"]
        peer = distance(runs["TRITON_ATTN"]["embeddings"], reference)
        mine = distance(runs["CUSTOM"]["embeddings"], reference)
        ok, notes = verdict(mine, peer)
        ok = ok and any(name.startswith("CUSTOM") for name in runs["CUSTOM"]["backends_in_use"])
        record.update(peer=peer, custom=mine, passed=ok, notes=notes)
        rows = [
            ["TRITON_ATTN (peer)", h.fmt(peer["max"], 5), h.fmt(peer["mean"], 6), "-", ""],
            ["CUSTOM", h.fmt(mine["max"], 5), h.fmt(mine["mean"], 6), "PASS" if ok else "FAIL", notes],
        ]
    else:
        record.update(passed=False, notes=f"engines failed: {failed}")
        for backend in failed:
            print(backend, "failed:", *runs[backend].get("log_tail", []), sep="\n  ")
    for backend, run in runs.items():
        print(f"{backend}: in use {run.get('backends_in_use')}")
    if rows:
        print(h.print_table(["backend vs FLASH_ATTN", "max |d|", "mean |d|", "verdict", "notes"], rows))
    path = out / "encoder_check.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("written", path)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
