"""The quantization kernels alone (issue 15): GPU time per launch of prepare's amax and cast
kernels at one shape, from the profiler, beside the bytes each must move and the copy bandwidth.

    python3 benchmarks/quant_profile.py [--shape 1,4096,56,128] [--v-layout prepared|kernel]
    python3 benchmarks/quant_profile.py --sweep   # chunks per CTA of both kernels, side by side
"""

from __future__ import annotations

import argparse

import torch
from call_timing import gpu_kernels


def main() -> None:
    from variants.prepare import quantize_inputs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,4096,56,128")
    parser.add_argument("--v-layout", default="prepared", choices=["prepared", "kernel"])
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    if args.sweep:
        return sweep(shape)
    fm = args.v_layout == "prepared"
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)

    def prep():
        return quantize_inputs(q, k, v, pad_to=128, permute_keys=fm, v_feature_major=fm,
                               validate=False)

    calls = 10

    def prepare_then_copy():
        for _ in range(calls):
            prep()
        dst.copy_(src)

    def kind(name: str) -> str:
        if "copy" in name.lower() or "memcpy" in name.lower():
            return "copy 2 GiB"
        return ("amax" if "HeadAbsMax" in name else "cast" if "ScaledCast" in name
                else "cast+amax" if "CastThenAmax" in name else name[:40])

    # Per call of prepare_then_copy: `calls` prepares and one 2 GiB copy.
    rows = gpu_kernels(prepare_then_copy, 1, name=kind)
    total = {name: us for name, us, _ in rows}
    count = {name: n for name, _, n in rows}
    tensor_bytes = q.numel() * 2
    copy_bw = 2 * src.numel() * 2 / (total["copy 2 GiB"] * 1e-6)
    print(f"shape {shape}, V {args.v_layout}, measured on {torch.cuda.get_device_name()}; "
          f"copy bandwidth {copy_bw / 1e12:.2f} TB/s")
    print("| kernel | launches per prepare | us per launch | GB/s (bf16 read, + fp8 write "
          "for cast) |\n|---|---|---|---|")
    # Bytes per launch in units of one bf16 input: amax reads it; cast reads it and writes its
    # codes (half as many bytes); cast+amax does a cast and the next input's amax.
    moves = {"amax": 1.0, "cast": 1.5, "cast+amax": 2.5}
    for name in moves:
        if name not in count:
            continue
        n = count[name] // calls
        us = total[name] / count[name]
        moved = tensor_bytes * moves[name]
        print(f"| {name} | {n} | {us:.1f} | {moved / (us * 1e-6) / 1e9:.0f} |")
    for name in total:
        if name not in (*moves, "copy 2 GiB"):
            print(f"| {name} | {count[name] // calls} | {total[name] / count[name]:.1f} | |")


def sweep(shape) -> None:
    """Each kernel at CHUNKS_PER_CTA 1, 2, 4, 8 on the same input (CUDA events, median of 20),
    its output checked equal to the first variant's."""
    from tuner.measure import cuda_event_samples
    from variants.launch import FastLaunch
    from variants.quantize_kernel import compile_kernel

    batch, seq, heads, dim = shape
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream
    amax = torch.zeros(batch * heads, device="cuda")
    descale = torch.empty(batch * heads * 3, device="cuda")
    print(f"shape {shape}, measured on {torch.cuda.get_device_name()}; one input, us")
    print("| kernel | chunks per CTA | us | GB/s |\n|---|---|---|---|")
    for name, fm in (("amax", False), ("cast", False), ("cast", True)):
        want = None
        for cpc in (1, 2, 4, 8):
            fn, slots = compile_kernel(name, torch.bfloat16, dim, "sm_90a", fm, fm,
                                       chunks_per_cta=cpc)
            launch = FastLaunch(fn, slots)
            out = torch.empty(batch * seq * heads * dim, dtype=torch.uint8, device="cuda")
            if name == "amax":
                def run(i, launch=launch):
                    launch(x.data_ptr(), amax.data_ptr(), batch, seq, heads, stream)
            else:
                def run(i, launch=launch, out=out):
                    launch(x.data_ptr(), amax.data_ptr(), descale.data_ptr(), out.data_ptr(),
                           batch, seq, seq, heads, 1, stream)
            amax.zero_()
            run(0)
            result = (amax if name == "amax" else out).clone()
            if want is None:
                want = result
            ok = torch.equal(result, want)
            for i in range(3):
                run(i)
            us = sorted(cuda_event_samples(run, 20))[10] * 1e3
            moved = x.numel() * (2 if name == "amax" else 3)
            label = name + (" feature-major" if fm else "")
            print(f"| {label} | {cpc} | {us:.1f} | {moved / (us * 1e-6) / 1e9:.0f} |"
                  + ("" if ok else " OUTPUT DIFFERS"))


if __name__ == "__main__":
    main()
