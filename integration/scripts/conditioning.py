"""How far e2e_check.py's prompt logprobs move when attention is exact up to bf16 rounding: the noise floor of the
end-to-end comparison, per test model. CPU only (transformers' implementations of the same architectures), ~1 min
per model on 2 cores:

    python integration/scripts/conditioning.py                       # the default set below
    python integration/scripts/conditioning.py --models bloom-alibi-h64-tied --prompt-len 700

Each model is built from its config in models/ with e2e_check.py's weights (`_harness.reinit_weights`), and scores one
random prompt (teacher-forced log-probability of each next token, as e2e_check.py's prompt logprobs):
- `bf16 vs fp64`: the whole model in bf16 against the same weights in float64;
- `1-ulp attention`: the bf16 model twice, the second time with every attention output (the input of the output
  projection) multiplied by (1 + u * 2^-8), u uniform in [-1, 1]: what two attention kernels that are both exact
  up to bf16 rounding may differ by. A correct backend can be this far from another correct one;
- `fp32, tf32 attention`: the same with the model in fp32 and u * 2^-11 (a kernel with tf32 dots, as Triton's
  default for fp32 on NVIDIA, next to one with full fp32 dots): the noise floor of the fp32 rows.
Prints a table and writes conditioning.json in --out (default ./conditioning-results).

Models: the configs e2e_check.py runs, plus `bloom-alibi-h64-tied` (the Bloom config as it was until the tied
embedding was cut: with e2e_check.py's N(0, 1) embeddings a tied LM head makes every logit ~ +-700, where one bf16
step of a logit is 4 nats).
"""

from __future__ import annotations

import argparse
import json
import sys

import _harness as h

DEFAULT_MODELS = ("llama-h64", "bloom-alibi-h64", "bloom-alibi-h64-tied")
VARIANTS = {"bloom-alibi-h64-tied": ("bloom-alibi-h64", {"tie_word_embeddings": True})}


def build(name: str, dtype):
    import torch
    import transformers

    base, overrides = VARIANTS.get(name, (name, {}))
    config_dict = {**json.loads((h.resolve_model(base) / "config.json").read_text()), **overrides}
    config = transformers.AutoConfig.for_model(**config_dict)
    architecture = getattr(transformers, config_dict["architectures"][0])
    torch.manual_seed(0)
    model = architecture(config).to(dtype).eval()
    h.reinit_weights(model)
    return model


def output_projections(model) -> list:
    """The linear layer right after attention in each block (its input is the attention output)."""
    found = []
    for name, module in model.named_modules():
        parent, _, leaf = name.rpartition(".")
        if leaf in ("o_proj", "dense") and ("attn" in parent or "attention" in parent):
            found.append(module)
    return found


def prompt_logprobs(model, ids, perturb: float = 0.0):
    import torch

    hooks = []
    if perturb:
        gen = torch.Generator().manual_seed(1)

        def pre_hook(module, args):
            x = args[0]
            u = torch.rand(x.shape, generator=gen) * 2 - 1
            return ((x.double() * (1 + u.double() * perturb)).to(x.dtype),)

        layers = output_projections(model)
        assert layers, "no attention output projection found"
        hooks = [m.register_forward_pre_hook(pre_hook) for m in layers]
    try:
        with torch.no_grad():
            logits = model(ids).logits[0].double()
    finally:
        for hook in hooks:
            hook.remove()
    logprobs = logits.log_softmax(-1)[:-1].gather(1, ids[0, 1:, None])[:, 0]
    return logprobs, logits


def measure(name: str, prompt_len: int) -> dict:
    import torch

    torch.manual_seed(0)
    ids = torch.randint(100, 30000, (1, prompt_len))
    exact, logits = prompt_logprobs(build(name, torch.float64), ids)
    model = build(name, torch.bfloat16)
    bf16, _ = prompt_logprobs(model, ids)
    perturbed, _ = prompt_logprobs(model, ids, perturb=2**-8)
    model = build(name, torch.float32)
    fp32, _ = prompt_logprobs(model, ids)
    fp32_perturbed, _ = prompt_logprobs(model, ids, perturb=2**-11)

    def spread(a, b):
        d = (a - b).abs()
        return round(float(d.max()), 4), round(float(d.mean()), 5)

    return {
        "model": name,
        "prompt_len": prompt_len,
        "max_abs_logit": round(float(logits.abs().max()), 1),
        "mean_prompt_logprob": round(float(exact.mean()), 2),
        "bf16_vs_fp64": spread(bf16, exact),
        "one_ulp_attention": spread(perturbed, bf16),
        "fp32_tf32_attention": spread(fp32_perturbed, fp32),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--prompt-len", type=int, default=700)
    parser.add_argument("--out", help="folder for conditioning.json (default ./conditioning-results)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    results = [measure(name, args.prompt_len) for name in args.models.split(",")]

    def spread(pair) -> str:
        return f"{pair[0]:.3f} / {pair[1]:.4f}"

    rows = [
        [
            r["model"],
            r["max_abs_logit"],
            r["mean_prompt_logprob"],
            spread(r["bf16_vs_fp64"]),
            spread(r["one_ulp_attention"]),
            spread(r["fp32_tf32_attention"]),
        ]
        for r in results
    ]
    print(f"\nprompt logprob spread, |d| max / mean in nats (prompt of {args.prompt_len} random tokens)")
    header = ["model", "max |logit|", "mean logprob", "bf16 vs fp64", "1-ulp attention", "fp32, tf32 attention"]
    table = h.print_table(header, rows)
    path = h.out_dir("conditioning", args.out) / "conditioning.json"
    path.write_text(json.dumps({"info": h.gpu_info(), "results": results, "table": table}, indent=1))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
