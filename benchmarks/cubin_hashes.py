"""Hashes of the compiled code of a sample of configs of every family and arch, compiled on this
machine without a GPU: save them before a refactor that must not change generated code, check
them after.

    python benchmarks/cubin_hashes.py --save before.json      # before the edit
    python benchmarks/cubin_hashes.py --check before.json     # after it: exit 1 on a difference

--check compiles the saved file's builds, each label's config read back with from_dict (a knob
added since takes its default, the kernel built before it existed), so a new knob value, which
changes the sample, leaves what is compared as it was.

Per build two digests: the cubin's bytes and its SASS (nvdisasm -c, each kernel's symbol name
replaced by its index). Line moves do not reach the cubin (no line table is emitted); the
kernel symbols name the kernel object's module and class (variants.wgmma.kernel.WgmmaAttention),
so a refactor that renames those changes the cubin but not the SASS: --check passes when the
SASS matches and says which builds matched by SASS only.

The sample: per (family, arch) and per problem (head_dim 128 and 64, full and causal), the
default, then greedily the feasible config that adds the most knob values not yet covered
(fewest knobs changed from the default on a tie), until every value feasible for that problem
appears; for head_dim 128 without a mask also the default with one knob changed per value. A
split_tail build's twin (the split_tail=False program it launches when the tail stays whole)
is hashed too.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = (("wgmma", "sm_90a"), ("mma_sync", "sm_90a"), ("mma_sync", "sm_120a"))
GPU_OF_ARCH = {"sm_90a": "h200", "sm_120a": "5080"}
# (head_dim, causal) of the sampled problems; the first also gets the one-knob sweep.
PROBLEM_KINDS = ((128, False), (128, True), (64, False), (64, True))
SEQ_LEN = 77  # a ragged last tile; lengths are runtime values, so any would do


def _values(cfg) -> set:
    return {(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def _changed(cfg, base) -> int:
    return len(_values(cfg) - _values(base))


def cover(feasible: list, default) -> list:
    """The default, then the feasible config adding the most uncovered knob values (fewest
    knobs changed from the default on a tie, then space order), until all are covered."""
    # Each config's values and distance from the default, once: a space holds 100k configs.
    scored = [(_values(c), -_changed(c, default), c) for c in feasible]
    wanted = set().union(*(values for values, _, _ in scored))
    configs = [default]
    covered = _values(default)
    while covered < wanted:
        values, _, best = max(scored, key=lambda s: (len(s[0] - covered), s[1]))
        configs.append(best)
        covered |= values
    return configs


def sweep(feasible: list, default, space: dict) -> list:
    """Per knob value the default with that value, or where that is infeasible the first
    feasible config holding it."""
    configs = []
    feasible_set = set(feasible)
    for name, values in space.items():
        for value in values:
            cfg = dataclasses.replace(default, **{name: value})
            if cfg not in feasible_set:
                cfg = next((c for c in feasible if getattr(c, name) == value), None)
            if cfg is not None and cfg not in configs:
                configs.append(cfg)
    return configs


def sample(fam, arch: str) -> list:
    """(problem, config) pairs of the sample for one family and arch, without repeats."""
    from tuner.gpus import PROFILES
    from tuner.problem import Problem
    from variants.base import judge_space

    gpu = PROFILES[GPU_OF_ARCH[arch]]
    pairs = []
    for i, (head_dim, causal) in enumerate(PROBLEM_KINDS):
        problem = Problem(1, 2, SEQ_LEN, head_dim=head_dim, causal=causal)
        feasible = [cfg for cfg, ok, _ in judge_space(fam, problem, gpu) if ok]
        default = fam.default(arch, problem)
        configs = cover(feasible, default)
        if i == 0:
            configs += sweep(feasible, default, fam.space(arch))
        for cfg in configs:
            if (problem, cfg) not in pairs:
                pairs.append((problem, cfg))
    return pairs


_SYMBOL = re.compile(r"\b(kernel_cutlass_kernel_\w+)")


def sass_digest(cubin: bytes) -> str:
    """sha256 of the cubin's SASS with each kernel symbol replaced by its index."""
    from variants.cubin import disassemble

    sass = disassemble(cubin)
    names: dict[str, str] = {}
    sass = _SYMBOL.sub(lambda m: names.setdefault(m.group(1), f"KERNEL{len(names)}"), sass)
    return hashlib.sha256(sass.encode()).hexdigest()


def digests(cubin_path: Path) -> dict:
    blob = cubin_path.read_bytes()
    return {"cubin": hashlib.sha256(blob).hexdigest(), "sass": sass_digest(blob)}


def label(family: str, arch: str, problem, cfg) -> str:
    return (f"{family} {arch} d{problem.head_dim} {'causal' if problem.causal else 'full'} "
            f"{json.dumps(cfg.to_dict(), sort_keys=True)}")


_TWIN = " (its split_tail=False twin)"
_LABEL = re.compile(r"^(\S+) (\S+) d(\d+) (full|causal) (\{.*\})$")


def compute(families: set[str], limit: int = 0, match: str = "") -> dict:
    from variants import load_family

    builds = []
    for family, arch in TARGETS:
        if families and family not in families:
            continue
        pairs = [(p, c) for p, c in sample(load_family(family), arch)
                 if re.search(match, label(family, arch, p, c))]
        builds += [(family, arch, p, c, label(family, arch, p, c))
                   for p, c in pairs[: limit or None]]
    return _digest_builds(builds)


def recompute(saved: dict) -> dict:
    """The saved builds compiled now, under their saved labels: each config read back with
    from_dict (a knob added since takes its default)."""
    from tuner.problem import Problem
    from variants import load_family

    builds = []
    for name in saved:
        if name.endswith(_TWIN):
            continue  # compiled with the build it belongs to
        family, arch, head_dim, mask, knobs = _LABEL.match(name).groups()
        problem = Problem(1, 2, SEQ_LEN, head_dim=int(head_dim), causal=mask == "causal")
        cfg = load_family(family).Config.from_dict(json.loads(knobs))
        builds.append((family, arch, problem, cfg, name))
    return _digest_builds(builds)


def _digest_builds(builds: list) -> dict:
    """label -> digests of each (family, arch, problem, config, label) and of its twin."""
    os.environ["TUNER_CACHE_DIR"] = tempfile.mkdtemp(prefix="cubin-hashes-")
    from variants import load_family

    out = {}
    for family, arch, problem, cfg, name in builds:
        kernel = load_family(family).compile(cfg, problem, arch)
        found = {"": kernel}
        if kernel._single_launch is not None:
            found[_TWIN] = kernel._single_launch
        for suffix, build in found.items():
            out[name + suffix] = digests(build.cubin_path)
            print(out[name + suffix]["cubin"][:16], name + suffix, flush=True)
    return out


def check(saved: dict, now: dict) -> int:
    """Print the differences; 0 when every saved build has the same SASS now."""
    bad = 0
    by_sass = 0
    for label, want in saved.items():
        got = now.get(label)
        if got is None:
            print("MISSING", label)
            bad += 1
        elif got["sass"] != want["sass"]:
            print("SASS DIFFERS", label)
            bad += 1
        elif got["cubin"] != want["cubin"]:
            print("same SASS, cubin differs", label)
            by_sass += 1
    for label in now.keys() - saved.keys():
        print("NEW (not in the saved file)", label)
    same = len(saved) - bad
    print(f"{same} of {len(saved)} builds identical ({same - by_sass} byte for byte, "
          f"{by_sass} by SASS only)")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", metavar="FILE", help="write the sample's digests to FILE")
    mode.add_argument("--check", metavar="FILE", help="compare the sample against FILE")
    mode.add_argument("--list", action="store_true", help="print the sample, compile nothing")
    ap.add_argument("--family", action="append", default=[], help="only this family (repeat)")
    ap.add_argument("--limit", type=int, default=0, help="at most N configs per target")
    ap.add_argument("--match", default="", metavar="REGEX",
                    help="only the sampled builds whose label matches (quick checks)")
    args = ap.parse_args()
    if args.list:
        from variants import load_family

        for family, arch in TARGETS:
            if args.family and family not in args.family:
                continue
            pairs = [(p, c) for p, c in sample(load_family(family), arch)
                     if re.search(args.match, label(family, arch, p, c))]
            for problem, cfg in pairs[: args.limit or None]:
                print(label(family, arch, problem, cfg))
        return
    if args.save:
        now = compute(set(args.family), args.limit, args.match)
        Path(args.save).write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"{len(now)} builds saved to {args.save}")
        return
    saved = json.loads(Path(args.check).read_text())
    names = [k for k in saved if re.search(args.match, k)
             and (not args.family or k.split()[0] in args.family)]
    if args.limit:
        parents = [k for k in names if not k.endswith(_TWIN)][: args.limit]
        names = [k for k in names if k.removesuffix(_TWIN) in parents]
    saved = {k: saved[k] for k in names}
    sys.exit(check(saved, recompute(saved)))


if __name__ == "__main__":
    main()
