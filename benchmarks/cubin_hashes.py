"""SHA-256 of the cubins of a sample of configs of every family and arch, compiled on this
machine without a GPU: run before and after a refactor that must not change generated code, and
diff the two files.

The sample is each family's default plus one change per knob value (every value of every knob
appears at least once), so a refactor that changes any knob's code path shows.

    python benchmarks/cubin_hashes.py --out before.json
    python benchmarks/cubin_hashes.py --out after.json && diff before.json after.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = (("wgmma", "sm_90a"), ("mma_sync", "sm_90a"), ("mma_sync", "sm_120a"))


def sample(fam, arch: str, problem) -> list:
    """The default, then per knob value the default with that value, or where that is
    infeasible the first feasible config holding it."""
    from tuner.gpus import PROFILES
    from variants.base import judge_space

    gpu = PROFILES[{"sm_90a": "h200", "sm_120a": "5080"}[arch]]
    feasible = [cfg for cfg, ok, _ in judge_space(fam, problem, gpu) if ok]
    default = fam.default(arch, problem)
    configs = [default]
    for name, values in fam.space(arch).items():
        for value in values:
            cfg = dataclasses.replace(default, **{name: value})
            if cfg not in feasible:
                cfg = next(c for c in feasible if getattr(c, name) == value)
            if cfg not in configs:
                configs.append(cfg)
    return configs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=0, help="at most N configs per target")
    ap.add_argument("--family", default="", help="only this family")
    args = ap.parse_args()
    os.environ["TUNER_CACHE_DIR"] = tempfile.mkdtemp(prefix="cubin-hashes-")
    from tuner.problem import Problem
    from variants import load_family

    problem = Problem(1, 2, 77)
    hashes = {}
    for family, arch in TARGETS:
        if args.family and family != args.family:
            continue
        fam = load_family(family)
        configs = sample(fam, arch, problem)
        if args.limit:
            configs = configs[: args.limit]
        for cfg in configs:
            # The build's own cubin: a split_tail build compiles its split_tail=False twin too
            # (two new cubins), and a twin compiled earlier in the sample adds none.
            cubin = fam.compile(cfg, problem, arch).cubin_path
            label = f"{family} {arch} {json.dumps(cfg.to_dict(), sort_keys=True)}"
            hashes[label] = hashlib.sha256(cubin.read_bytes()).hexdigest()
            print(hashes[label][:16], label, flush=True)
    Path(args.out).write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
