"""The quantization alone (issue 15): GPU time of prepare's one launch (variants/
block_quantize_kernel.py: block amax and e4m3 cast of q, k and v) at each shape, from the
profiler, beside the bytes it must move, the copy bandwidth measured in the same run and the
other launches prepare makes (there should be none).

    python3 benchmarks/quant_profile.py [--shapes 1,4096,56,128 ...] [--v-layout prepared|kernel]
"""

from __future__ import annotations

import argparse

import torch
from call_timing import gpu_kernels
from e2e_h200 import memory_floor

SHAPES = ("1,4096,56,128", "1,8192,56,128", "1,16384,56,128", "2,4608,24,128", "4,1024,32,128",
          "1,30272,56,64")


def kind(name: str) -> str:
    if "copy" in name.lower() or "memcpy" in name.lower():
        return "copy 2 GiB"
    return "block quant" if "BlockQuant" in name else name[:60]


def profile(shape, feature_major: bool) -> list[str]:
    from variants.prepare import quantize_inputs

    seq = shape[1]
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    calls = 10

    def prepare_then_copy():
        for _ in range(calls):
            quantize_inputs(q, k, v, pad_to=128, permute_keys=feature_major,
                            v_feature_major=feature_major, validate=False)
        dst.copy_(src)

    rows = gpu_kernels(prepare_then_copy, 1, name=kind)
    total = {name: us for name, us, _ in rows}
    count = {name: n for name, _, n in rows}
    copy_bw = 2 * src.numel() * 2 / (total["copy 2 GiB"] * 1e-6)
    moved = memory_floor(shape, -(-seq // 128) * 128)["one_read"]
    lines = []
    for name in total:
        if name == "copy 2 GiB":
            continue
        us = total[name] / calls
        ours = name == "block quant"  # anything else is a launch prepare should not make
        rate = f"{moved / (us * 1e-6) / 1e9:.0f}" if ours else ""
        floor = f"{us / (moved / copy_bw * 1e6):.2f}" if ours else ""
        lines.append(f"| {', '.join(map(str, shape))} | {name} | {count[name] // calls} | "
                     f"{us:.1f} | {rate} | {floor} | {copy_bw / 1e12:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--v-layout", default="prepared", choices=["prepared", "kernel"])
    args = parser.parse_args()
    print(f"V {args.v_layout}, measured on {torch.cuda.get_device_name()}")
    print("| B, S, H, D | kernel | launches per prepare | us per prepare | GB/s (bf16 read + fp8 "
          "write + scales) | / floor | copy TB/s |\n|---|---|---|---|---|---|---|")
    for text in args.shapes:
        for line in profile(tuple(int(x) for x in text.split(",")),
                            args.v_layout == "prepared"):
            print(line, flush=True)


if __name__ == "__main__":
    main()
