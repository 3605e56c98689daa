import os, statistics, sys, torch
import tuner
from tuner import runtime
from tuner.problem import Problem
from tuner.measure import cuda_event_samples
mode = os.environ.get("FOLD_PROBE", "full")
for S in (8192, 30272):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, S, 56, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    cfg = tuner.load_best_config(S, heads=56)
    kernel = runtime._kernel_for(runtime.family_of(cfg), cfg, Problem(1, 56, S, 128), "auto")
    prepared = kernel.prepare(q, k, v)
    for _ in range(3):
        kernel.run(prepared)
    torch.cuda.synchronize()
    ms = [statistics.median(cuda_event_samples(lambda i: kernel.run(prepared), 15)) for _ in range(3)]
    print(f"{mode:10s} S={S} kernel ms {min(ms):.3f} (3 medians {', '.join(f'{x:.3f}' for x in ms)}) regs {kernel.resources.registers} spill {kernel.resources.spill_bytes}", flush=True)
