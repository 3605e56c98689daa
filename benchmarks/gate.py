"""gate: what the correctness gate (tuner/gate.py) costs, and that it rejects no correct kernel.

Cost per candidate: at each --shapes shape the config tuner.attention runs is compiled, then the
gate (tuner.gate.validate_kernel) and the timing (tuner.measure.time_kernel) each run twice; the
second run's wall time counts (the first warms caches and compiles prepare's launch).

No false reject: every feasible config of each family for this GPU's arch at each --sweep-shapes
problem (can_implement's verdict, the same enumeration as the search) is compiled and gated on
fresh random inputs (a new seed per run), in --procs processes sharing the GPU (the gate's work
is small launches and Python). --sweep-configs N takes N configs spread evenly over a family's
feasible space (0: all of them); --shard i/n sweeps every n-th of those from the i-th, so the
whole space can be split over several runs. Reported: runs passed, every failure with its seed,
and the largest value of each gated metric over the passing runs beside its threshold.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial

from benchmarks import common
from benchmarks.common import cell, markdown_table, shape_text

HELP = "the gate's cost per candidate; every feasible config passes the gate (no false reject)"
DEFAULT_SHAPES = ("1,4097,8,128", "1,4096/8192/30272,56,128")
QUICK_SHAPES = ("1,4097,8,128", "1,8192,56,128")
SWEEP_SHAPES = ("1,1/77/4097,2,128",)
METRICS = ("rel_rms", "worst_row", "head_slope_excess", "lse_excess")


def _shard(text: str) -> tuple[int, int]:
    import argparse

    index, _, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/n, e.g. 0/4, got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"need 0 <= i < n, got {text!r}")
    return i, n


def add_arguments(parser) -> None:
    parser.add_argument("--sweep-shapes", nargs="*", type=common.shape_arg, default=None,
                        metavar="SHAPE", help=f"problems of the sweep (default "
                        f"{' '.join(SWEEP_SHAPES)}; none: --sweep-shapes, no sweep)")
    parser.add_argument("--families", default=None,
                        help="comma-separated families to sweep (default: every family of "
                        "the arch)")
    parser.add_argument("--sweep-configs", type=int, default=None,
                        help="configs per family, spread evenly over its feasible space "
                        "(0: all; default 240, --quick 48)")
    parser.add_argument("--shard", type=_shard, default=(0, 1), metavar="i/n",
                        help="sweep only every n-th config from the i-th (default 0/1)")
    parser.add_argument("--procs", type=int, default=min(8, os.cpu_count() or 1),
                        help="processes of the sweep (default min(8, cores))")


def spread(items: list, count: int) -> list:
    """count items spread evenly over the list (all of them for count 0 or >= its length)."""
    if count <= 0 or count >= len(items):
        return list(items)
    return [items[(i * len(items)) // count] for i in range(count)]


def _wall(fn):
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - t0


def cost_rows(args, gpu) -> list:
    import torch

    from tuner.gate import validate_kernel
    from tuner.measure import time_kernel
    from tuner.runtime import config_for_problem
    from variants import load_family

    device = torch.device("cuda")
    rows = []
    for problem in common.shapes_of(args):
        best = config_for_problem(problem)
        kernel = load_family(best.family).compile(best.config, problem, gpu.profile.arch)
        for seed in (args.seed, args.seed + 1):
            report, gate_s = _wall(partial(validate_kernel, kernel, problem, device, seed))
            _, time_s = _wall(partial(time_kernel, kernel, problem, device, seed,
                                      gpu.profile.l2_bytes, repeats=args.repeats))
        print(f"  {shape_text(problem)}: gate {gate_s:.3f} s, timing {time_s:.3f} s", flush=True)
        rows.append([shape_text(problem), best.source, cell(gate_s), cell(time_s),
                     f"{gate_s / (gate_s + time_s):.0%}", "yes" if report.passed else
                     f"NO: {report.reason}", cell(report.rel_rms, ".4f")])
    return rows


def sweep_work(job) -> list[dict]:
    """One process's share of the sweep: (family, [(config dict, problem key)], arch, seed)."""
    import torch

    from tuner.gate import validate_kernel
    from tuner.measure import CandidateFailure, guarded
    from tuner.problem import Problem
    from variants import load_family

    family, pairs, arch, seed = job
    fam = load_family(family)
    # A family whose kernels run on the CPU (the test doubles) is gated there.
    device = torch.device(getattr(fam, "DEVICE", "cuda"))
    rows = []
    for i, (raw, key) in enumerate(pairs):
        problem = Problem.from_key(key)
        run_seed = seed + 7919 * i
        try:
            kernel = guarded("compile", fam.compile, fam.Config.from_dict(raw), problem, arch)
            report = validate_kernel(kernel, problem, device, run_seed)
            row = {"passed": report.passed, "reason": report.reason, "cases": report.cases}
        except CandidateFailure as exc:
            row = {"passed": False, "reason": f"{exc.outcome}: {exc.message}", "cases": []}
        rows.append({"family": family, "config": raw, "problem": key, "seed": run_seed, **row})
    return rows


def sweep(args, gpu) -> str:
    import multiprocessing as mp

    from tuner.problem import Problem
    from variants import families_for_arch, load_family
    from variants.base import judge_space
    from variants.reference_bounds import REL_RMS_MAX, ROW_REL_MAX

    problems = ([p for g in args.sweep_shapes for p in g] if args.sweep_shapes is not None
                else [p for t in SWEEP_SHAPES for p in common.parse_shape(t)])
    if not problems:
        return "No sweep (--sweep-shapes was empty)."
    families = (args.families.split(",") if args.families
                else families_for_arch(gpu.profile.arch))
    count = common.sized(args.sweep_configs, 240, 48, args)
    index, shards = args.shard
    jobs, sizes = [], {}
    for family in families:
        fam = load_family(family)
        pairs = []
        for problem in problems:
            feasible = [c.to_dict() for c, ok, _ in judge_space(fam, problem, gpu.profile) if ok]
            chosen = spread(feasible, count)[index::shards]
            sizes[(family, problem.key())] = (len(chosen), len(feasible))
            pairs += [(raw, problem.key()) for raw in chosen]
        # One config's problems go to one process, which compiles the config once.
        groups: dict[str, list] = {}
        for raw, key in pairs:
            groups.setdefault(json.dumps(raw, sort_keys=True), []).append((raw, key))
        ordered = list(groups.values())
        jobs += [(family, [pair for group in ordered[i::args.procs] for pair in group],
                  gpu.profile.arch, args.seed + 1000003 * (len(jobs) + i))
                 for i in range(args.procs) if ordered[i::args.procs]]
    t0 = time.perf_counter()
    if not jobs:
        return "No sweep: no feasible config (or an empty shard)."
    if len(jobs) == 1:
        runs = sweep_work(jobs[0])
    else:
        with mp.get_context("spawn").Pool(min(args.procs, len(jobs))) as pool:
            runs = [r for part in pool.map(sweep_work, jobs) for r in part]
    wall = time.perf_counter() - t0
    limits = {"rel_rms": REL_RMS_MAX, "worst_row": ROW_REL_MAX,
              "head_slope_excess": 1.0, "lse_excess": 1.0}
    rows = []
    for family in families:
        mine = [r for r in runs if r["family"] == family]
        passed = [r for r in mine if r["passed"]]
        worst = [max((c.get(m, 0.0) for r in passed for c in r["cases"]), default=0.0)
                 for m in METRICS]
        covered = ", ".join(f"{shape_text(Problem.from_key(key))}: {n} of {total}"
                            for (f, key), (n, total) in sizes.items() if f == family)
        rows.append([family, covered, f"{len(passed)} of {len(mine)}",
                     " / ".join(f"{w:.4g} ({limits[m]:.4g})" for w, m in
                                zip(worst, METRICS, strict=True))])
    failures = [f"- {r['family']} {r['problem']} seed {r['seed']} {r['config']}: {r['reason']}"
                for r in runs if not r["passed"]]
    parts = [f"Sweep: shard {index}/{shards}, {len(runs)} runs in {wall:.0f} s wall, "
             f"{min(args.procs, len(jobs))} process(es).", "",
             markdown_table(["family", "configs (shape: swept of feasible)", "runs passed",
                             "largest " + " / ".join(METRICS) + " (threshold)"], rows)]
    if failures:
        parts += ["", f"Failures ({len(failures)}):", *failures[:40]]
    return "\n".join(parts)


def run(args, gpu) -> str:
    cost = markdown_table(["shape", "source", "gate s", "timing s", "gate share", "passed",
                           "rel RMS"], cost_rows(args, gpu))
    return "\n".join(["Cost per candidate (wall s of the second run, config tuner.attention "
                      "runs):", "", cost, "", sweep(args, gpu)])
