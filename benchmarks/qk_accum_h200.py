"""Where the LSE error on large scores comes from: the FP8 tensor-core accumulator, measured.

Two measurements on the local GPU (the H200 for benchmarks/RESULTS.md):

1. cuBLAS FP8 GEMM (torch._scaled_mm, e4m3 x e4m3 -> fp32) on the same kind of codes the kernels
   read, against an exact float64 product: the error relative to sum_k |a_k b_k| for K = 32 ..
   1024, with the tensor core accumulating alone (use_fast_accum=True, as wgmma chained over a
   row does) and with cuBLAS promoting partial sums to fp32 (False). Random-sign and all-positive
   operands: a truncating accumulator shows a bias on the latter.
2. Our kernels on peaked inputs (k = c q: row i's largest score is c scale |q_i|^2, LSE ~ that
   score): LSE error against float64 attention on the gate's quantization, relative to the row's
   score magnitude, for c = 1, 6, 100; wgmma at head_dim 128 and 64 (K of QK^T halves) and
   mma_sync (on sm_90 emulated through the FP16 tensor path with fp32 accumulation).

    python benchmarks/qk_accum_h200.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.measure import poisoned_outputs  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from variants.reference import quantize_reference  # noqa: E402


def fp8_codes(shape, gen, positive=False):
    x = torch.randn(shape, generator=gen, device="cuda")
    if positive:
        x = x.abs()
    return (x * (448 / x.abs().amax())).clamp(-448, 448).to(torch.float8_e4m3fn)


def gemm_error(k_dim: int, fast: bool, positive: bool, gen) -> dict:
    m = n = 1024
    a = fp8_codes((m, k_dim), gen, positive)
    b = fp8_codes((n, k_dim), gen, positive)
    one = torch.tensor(1.0, device="cuda")
    got = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                           use_fast_accum=fast).double()
    a64, b64 = a.double(), b.double()
    exact = a64 @ b64.t()
    magnitude = a64.abs() @ b64.abs().t()
    rel = (got - exact) / magnitude
    return {"K": k_dim, "fast_accum": fast, "positive": positive,
            "max_rel": float(rel.abs().max()), "mean_abs_rel": float(rel.abs().mean()),
            "mean_signed_rel": float(rel.mean())}


def exact_lse(ref_in) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 LSE (batch, heads, S) and the row's score magnitude max_j scale sum|q||k|."""
    q, k, _ = (x.double() for x in ref_in.dequantized())
    lse, mag = [], []
    for h in range(q.shape[2]):
        s = (q[0, :, h] @ k[0, :, h].t()) * ref_in.softmax_scale
        lse.append(torch.logsumexp(s, -1))
        mag.append(((q[0, :, h].abs() @ k[0, :, h].abs().t()) * ref_in.softmax_scale).amax(-1))
    return torch.stack(lse)[None], torch.stack(mag)[None]


def kernel_lse_error(family: str, head_dim: int, gain: float, seq: int, heads: int,
                     seed: int) -> dict:
    from variants import load_family

    fam = load_family(family)
    problem = Problem(1, heads, seq, head_dim)
    cfg = fam.default("sm_90a", problem)
    kernel = fam.compile(cfg, problem, "sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((1, seq, heads, head_dim), generator=gen, device="cuda")
    k = (gain * q).bfloat16()
    q = q.bfloat16()
    v = torch.randn((1, seq, heads, head_dim), generator=gen, device="cuda").bfloat16()
    out, lse = poisoned_outputs(1, heads, seq, head_dim, "cuda")
    kernel.run(kernel.prepare(q, k, v), out=out, lse=lse)
    torch.cuda.synchronize()
    want, magnitude = exact_lse(quantize_reference(q, k, v))
    err = (lse.double() - want).abs()
    worst = int(err.argmax())
    return {"family": family, "head_dim": head_dim, "gain": gain, "S": seq, "heads": heads,
            "max_lse": float(want.max()), "max_lse_err": float(err.max()),
            "max_err_over_magnitude": float((err / magnitude).max()),
            "magnitude_at_worst": float(magnitude.flatten()[worst]),
            "mean_signed_err": float((lse.double() - want).mean())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    gemm = [gemm_error(kd, fast, pos, gen) for pos in (False, True) for fast in (True, False)
            for kd in (32, 64, 128, 256, 1024)]
    kernels = []
    for family, head_dim in (("wgmma", 128), ("wgmma", 64), ("mma_sync", 128)):
        for gain in (1.0, 6.0, 100.0):
            try:
                kernels.append(kernel_lse_error(family, head_dim, gain, args.seq, args.heads,
                                                seed=int(gain)))
            except Exception as exc:  # noqa: BLE001 - report and go on with the others
                kernels.append({"family": family, "head_dim": head_dim, "gain": gain,
                                "error": f"{type(exc).__name__}: {exc}"[:300]})
    gpu = torch.cuda.get_device_name()
    lines = [f"# QK^T accumulator error, measured on {gpu}", "",
             "## cuBLAS FP8 GEMM (torch._scaled_mm) vs exact, error / sum|a b|", "",
             "| operands | K | fast_accum | max | mean abs | mean signed |",
             "|---|---|---|---|---|---|"]
    for r in gemm:
        lines.append(f"| {'positive' if r['positive'] else 'random sign'} | {r['K']} | "
                     f"{r['fast_accum']} | {r['max_rel']:.2e} | {r['mean_abs_rel']:.2e} | "
                     f"{r['mean_signed_rel']:.2e} |")
    lines += ["", f"## Kernel LSE on peaked inputs (k = c q), B=1 H={args.heads} S={args.seq}",
              "", "| family | head_dim | c | max LSE | max LSE error | error / score magnitude "
              "| mean signed error |", "|---|---|---|---|---|---|---|"]
    for r in kernels:
        if "error" in r:
            lines.append(f"| {r['family']} | {r['head_dim']} | {r['gain']:g} | {r['error']} |")
            continue
        lines.append(f"| {r['family']} | {r['head_dim']} | {r['gain']:g} | {r['max_lse']:.1f} | "
                     f"{r['max_lse_err']:.4g} | {r['max_err_over_magnitude']:.2e} | "
                     f"{r['mean_signed_err']:.3g} |")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    (out / "qk_accum.md").write_text(text + "\n")
    (out / "qk_accum.json").write_text(json.dumps({"gpu": gpu, "gemm": gemm,
                                                   "kernels": kernels}, indent=1))


if __name__ == "__main__":
    main()
