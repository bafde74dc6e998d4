"""End-to-end agreement of vLLM's CUSTOM backend (tritonfa) with FLASH_ATTN (FA3) and TRITON_ATTN.

Runs on a GPU host with vLLM 0.24.0 (integration/README.md, "GPU scripts"):

    python integration/scripts/e2e_check.py --suite llama8b   # dummy Llama-3-8B, bf16 and fp8 KV cache,
                                                              # CUSTOM eager and with CUDA graphs (~4 min)
    python integration/scripts/e2e_check.py --suite small     # head sizes 64/80/96/112, Gemma-2 (256, sliding
                                                              # window, softcap), Bloom (ALiBi, fp32) (~4 min)
    python integration/scripts/e2e_check.py --suite alibi     # Bloom bf16 and fp32, CUSTOM and TRITON_ATTN, each
                                                              # layer's attention checked against float64 (~2 min)

Each engine (model x kv-cache dtype x backend) runs in its own process (several at once, `--jobs`), with weights
re-initialized to well-conditioned random values (`_harness.reinit_weights`; vLLM's dummy weights make attention
nearly uniform), chunked prefill on a small token budget (512) so that prefills with cached context and decodes
share batches, and greedy decoding with logprobs. Compared with the reference backend (FLASH_ATTN, else
TRITON_ATTN), teacher-forced: the prompt logprobs (every prompt position, computed through the prefill path), and
the logprobs of the generated tokens while the greedy continuations agree (the decode path).

Tolerance, relative to the spread between the two vLLM backends themselves ("peer" = TRITON_ATTN vs FLASH_ATTN):
CUSTOM passes when max |dlogprob| <= 2 x peer max + 0.05 and mean |dlogprob| <= 2 x peer mean + 0.005 (nats), for
prompt and for decode logprobs; with no peer (one reference only) the bounds are 0.25 (max) and 0.02 (mean).
ALiBi models have no peer (FLASH_ATTN cannot run ALiBi), and the Bloom config is ~3x more sensitive to bf16
rounding of attention than the Llama ones (conditioning.py: two attention kernels that are each exact up to bf16
rounding can differ by ~0.45 nats max / 0.03 mean there): so Bloom runs in fp32 in `small` (fp32 or tf32 dots:
noise floor 0.002 / 0.0004 nats), and the `alibi` suite checks every layer's attention output in the engine
against float64 (`_attention_capture.py`: the verdict is per backend, not relative to another backend).
Results: a table on stdout and e2e_<suite>.json in --out (default ./e2e-results).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import time
from pathlib import Path

import _harness as h

SMALL_MODELS = ("llama-h64", "llama-h80", "llama-h96", "llama-h112", "gemma2-h256-sw-softcap")
ALIBI_MODEL = "bloom-alibi-h64"
ALIBI_BACKENDS = ("TRITON_ATTN", "CUSTOM")  # FLASH_ATTN cannot run ALiBi
SUITES = {
    # (model, kv_cache_dtype, backend, enforce_eager, model dtype, check attention against float64 in the engine)
    "llama8b": [
        ("llama-3-8b", kv, backend, eager, "bfloat16", False)
        for kv in ("auto", "fp8")
        for backend, eager in (("FLASH_ATTN", True), ("TRITON_ATTN", True), ("CUSTOM", True), ("CUSTOM", False))
    ],
    "small": [(model, "auto", backend, True, "bfloat16", False) for model in SMALL_MODELS for backend in h.BACKENDS]
    + [(ALIBI_MODEL, "auto", backend, True, "float32", False) for backend in ALIBI_BACKENDS],
    "alibi": [
        (ALIBI_MODEL, "auto", backend, True, dtype, True)
        for dtype in ("bfloat16", "float32")
        for backend in ALIBI_BACKENDS
    ],
}
PROMPT_LENS = (1, 7, 40, 64, 300, 700, 1100, 1500)  # with a 512-token budget: chunked prefills next to decodes
MAX_TOKENS = 16
NO_PEER_TOL = (0.25, 0.02)


def label(backend: str, eager: bool) -> str:
    return backend if eager else backend + "+graphs"


def short_dtype(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)


# ------------------------------------------------------------------------------------------------- worker


def worker(args) -> None:
    model, vocab = h.start_worker(args.model)
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=args.dtype,
        attention_backend=args.backend,
        kv_cache_dtype=args.kv_cache_dtype,
        enforce_eager=args.eager,
        max_model_len=2048,
        max_num_batched_tokens=512,
        max_num_seqs=16,
        enable_prefix_caching=False,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_gib * 2**30,
        seed=0,
    )
    init_s = time.perf_counter() - start
    in_use = h.backends_in_use(llm)
    llm.apply_model(h.reinit_weights)
    recorder = None
    if args.capture:
        # in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, TP 1): the wrapped layers record into this object
        import _attention_capture

        recorder = _attention_capture.Recorder()
        wrapped = llm.apply_model(lambda m: _attention_capture.install(m, recorder))
        assert sum(wrapped) > 0, "no attention layer found to check"

    prompts = h.token_prompts(vocab, PROMPT_LENS)
    params = SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, logprobs=5, prompt_logprobs=1, ignore_eos=True, detokenize=False
    )
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    gen_s = time.perf_counter() - start

    def chosen(logprob_steps, token_ids):
        return [float(step[tok].logprob) for step, tok in zip(logprob_steps, token_ids)]

    seqs = []
    for prompt, out in zip(prompts, outputs):
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        prompt_lp = out.prompt_logprobs or []
        seqs.append(
            {
                "tokens": tokens,
                "token_logprobs": chosen(completion.logprobs, tokens),
                "prompt_logprobs": chosen(list(prompt_lp)[1:], prompt[1:]),
            }
        )
    result = {"gpu": h.gpu_name(), "backends_in_use": in_use, "init_s": round(init_s, 1), "seqs": seqs}
    result["generate_s"] = round(gen_s, 2)
    if recorder is not None:
        result["attention_check"] = recorder.summary()
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------- compare


def distance(a: dict, b: dict) -> dict:
    """Teacher-forced |logprob| differences of run a against run b (same prompts)."""
    prompt_d, decode_d, first_agree, all_agree = [], [], 0, 0
    for sa, sb in zip(a["seqs"], b["seqs"]):
        prompt_d += [abs(x - y) for x, y in zip(sa["prompt_logprobs"], sb["prompt_logprobs"])]
        common = 0
        for ta, tb in zip(sa["tokens"], sb["tokens"]):
            if ta != tb:
                break
            common += 1
        # the logprob of step i is comparable while the tokens before it agree (step i itself may differ)
        steps = min(common + 1, len(sa["tokens"]))
        decode_d += [abs(x - y) for x, y in zip(sa["token_logprobs"][:steps], sb["token_logprobs"][:steps])]
        first_agree += bool(sa["tokens"][:1] == sb["tokens"][:1])
        all_agree += sa["tokens"] == sb["tokens"]
    n = len(a["seqs"])

    def stats(d):
        return (max(d), sum(d) / len(d)) if d else (0.0, 0.0)

    return {
        "prompt_max": stats(prompt_d)[0],
        "prompt_mean": stats(prompt_d)[1],
        "decode_max": stats(decode_d)[0],
        "decode_mean": stats(decode_d)[1],
        "first_token_agree": f"{first_agree}/{n}",
        "all_tokens_agree": f"{all_agree}/{n}",
    }


def verdict(d: dict, peer: dict | None) -> tuple[bool, str]:
    ok = True
    notes = []
    for part in ("prompt", "decode"):
        if peer is not None:
            tol_max, tol_mean = 2 * peer[f"{part}_max"] + 0.05, 2 * peer[f"{part}_mean"] + 0.005
        else:
            tol_max, tol_mean = NO_PEER_TOL
        if d[f"{part}_max"] > tol_max:
            ok = False
            notes.append(f"{part} max {d[f'{part}_max']:.3f} > {tol_max:.3f}")
        if d[f"{part}_mean"] > tol_mean:
            ok = False
            notes.append(f"{part} mean {d[f'{part}_mean']:.4f} > {tol_mean:.4f}")
    return ok, "; ".join(notes)


def attention_verdict(check: dict | None) -> tuple[bool, str]:
    """A backend passes the in-engine check when every checked call is within bf16 rounding of float64 (ratio <= 1),
    the layers' slopes are Bloom's, and chunked prefills with context, prefills and decodes were all seen."""
    if not check or not check.get("calls"):
        return False, "no attention call checked"
    kinds = check["kinds"]
    notes = [
        f"{k}: ratio {v['ratio']:.2f} ({v['calls']} calls, max |err| {v['max_abs_err']:.1e})" for k, v in kinds.items()
    ]
    ok = all(v["ratio"] <= 1.0 for v in kinds.values()) and check["slope_error"] < 1e-6
    missing = {"mixed", "prefill", "decode"} - set(kinds)
    if missing:
        ok = False
        notes.append(f"not seen: {sorted(missing)}")
    if check["slope_error"] >= 1e-6:
        notes.append(f"slopes differ from Bloom's by {check['slope_error']:.2e}")
    return ok, "; ".join(notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="llama8b")
    parser.add_argument("--models", help="comma-separated subset of the suite's models")
    parser.add_argument("--jobs", type=int, default=3, help="engines at once on the GPU")
    parser.add_argument("--timeout", type=float, default=480, help="seconds per engine")
    parser.add_argument("--out", help="folder for the JSON result (default ./e2e-results)")
    # worker-only
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--kv-cache-dtype", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--eager", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    parser.add_argument("--capture", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.28, help=argparse.SUPPRESS)
    parser.add_argument("--kv-cache-gib", type=int, default=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.eager, args.capture = bool(args.eager), bool(args.capture)
        worker(args)
        return 0

    jobs = [j for name in ([*SUITES] if args.suite == "all" else [args.suite]) for j in SUITES[name]]
    if args.models:
        keep = set(args.models.split(","))
        jobs = [j for j in jobs if j[0] in keep]
    h.setup_env()
    info = h.gpu_info()
    print(f"e2e_check: {len(jobs)} engines, {args.jobs} at a time; {json.dumps(info)}", flush=True)
    out = h.out_dir("e2e", args.out)
    logs = Path(tempfile.mkdtemp(prefix="e2e-logs-"))
    gpu_mem = round(min(0.9, 0.88 / max(args.jobs, 1)), 3)

    def run(job):
        model, kv, backend, eager, dtype, capture = job
        tag = f"{model}.{short_dtype(dtype)}.{kv}.{label(backend, eager)}"
        worker_args = [
            "--model", model, "--backend", backend, "--kv-cache-dtype", kv, "--eager", str(int(eager)),
            "--dtype", dtype, "--capture", str(int(capture)),
            "--gpu-memory-utilization", str(gpu_mem), "--kv-cache-gib", "4" if "8b" in model else "2",
        ]  # fmt: skip
        res = h.run_worker(Path(__file__), worker_args, logs / f"{tag}.json", args.timeout, logs / f"{tag}.log")
        status = "ok" if "error" not in res else res["error"]
        sys.stdout.write(f"  {tag}: {status} ({res.get('wall_s')} s)\n")
        sys.stdout.flush()
        return job, res

    results: dict = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for (model, kv, backend, eager, dtype, _), res in pool.map(run, jobs):
            results[(f"{model} {short_dtype(dtype)}", kv, label(backend, eager))] = res

    info["gpu"] = next((r["gpu"] for r in results.values() if r.get("gpu")), None)
    rows, summary, all_ok = [], [], True
    attention_rows = []
    for model, kv in dict.fromkeys((m, k) for m, k, _ in results):
        runs = {lab: r for (m, k, lab), r in results.items() if (m, k) == (model, kv)}
        for lab, r in runs.items():
            if "attention_check" in r:
                check_ok, check_note = attention_verdict(r["attention_check"])
                r["attention_ok"] = check_ok
                attention_rows.append([model, lab, {True: "PASS", False: "FAIL"}[check_ok], check_note])
                if lab.startswith("CUSTOM") and not check_ok:
                    all_ok = False
        good = {lab: r for lab, r in runs.items() if "error" not in r}
        ref_label = next((b for b in ("FLASH_ATTN", "TRITON_ATTN") if b in good), None)
        peer = None
        if ref_label == "FLASH_ATTN" and "TRITON_ATTN" in good:
            peer = distance(good["TRITON_ATTN"], good["FLASH_ATTN"])
        for lab, r in runs.items():
            entry = {"model": model, "kv_cache_dtype": kv, "backend": lab, "reference": ref_label}
            if "error" in r:
                entry.update(error=r["error"], log_tail=r.get("log_tail"))
                ok = False if lab.startswith("CUSTOM") else None
                rows.append([model, kv, lab, "-", "-", "-", "-", "-", "-", "-", r["error"]])
            elif lab == ref_label or ref_label is None:
                entry.update(backends_in_use=r["backends_in_use"], init_s=r["init_s"])
                entry.update({k: r[k] for k in ("attention_check", "attention_ok") if k in r})
                rows.append([model, kv, lab, ",".join(r["backends_in_use"]), r["init_s"], "ref", "", "", "", "", ""])
                ok = r.get("attention_ok")
            else:
                d = distance(r, good[ref_label])
                ok, note = verdict(d, peer) if lab.startswith("CUSTOM") else (None, "")
                if "attention_check" in r:  # judged by the check against float64 (see the docstring)
                    ok = r["attention_ok"]
                    note = "verdict: attention check (table below); logprobs informational" + (
                        f": {note}" if note else ""
                    )
                entry.update(d, backends_in_use=r["backends_in_use"], init_s=r["init_s"], ok=ok, note=note)
                entry.update({k: r[k] for k in ("attention_check", "attention_ok") if k in r})
                rows.append([
                    model, kv, lab, ",".join(r["backends_in_use"]), r["init_s"],
                    f"{d['prompt_max']:.3f}/{d['prompt_mean']:.4f}", f"{d['decode_max']:.3f}/{d['decode_mean']:.4f}",
                    d["first_token_agree"], d["all_tokens_agree"], {True: "PASS", False: "FAIL", None: ""}[ok], note,
                ])  # fmt: skip
            if lab.startswith("CUSTOM") and ok is not True:
                all_ok = False
            summary.append(entry)

    gpu = info.get("gpu")
    print(f"\ne2e agreement vs reference (FLASH_ATTN, else TRITON_ATTN); |dlogprob| max/mean in nats; {gpu}")
    # verdict column: the logprob tolerance, or for --suite alibi the CUSTOM row's in-engine attention check
    table = h.print_table(
        ["model", "kv", "backend", "in use", "init s", "prompt lp d", "decode lp d", "1st tok", "all tok", "verdict",
         "note"],
        rows,
    )  # fmt: skip
    if attention_rows:
        print(
            "\nattention in the engine vs float64 Bloom ALiBi (ratio = max |error| / bf16 rounding bound; <= 1 passes)"
        )
        table += "\n\n" + h.print_table(["model", "backend", "verdict", "per step kind"], attention_rows)
    path = out / f"e2e_{args.suite}.json"
    path.write_text(json.dumps({"info": info, "results": summary, "table": table, "all_custom_pass": all_ok}, indent=1))
    print(f"\nall CUSTOM rows pass: {all_ok}; written {path}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
