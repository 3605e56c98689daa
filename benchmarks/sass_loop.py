"""The wgmma consumers' strip loop in SASS, compiled without a GPU from a package tree: its
length, opcode mix and where the waits sit (the PV wgmma's DEPBAR, the stage releases, the first
and last exponential and P conversion), optionally beside the same loop of another tree.

For bisecting the kernel's speed across versions on the CPU before spending device time, e.g.
the per-head kernel of 3099e4a against main (benchmarks/RESULTS.md, nineteenth session):

    git archive 3099e4a variants tuner | tar -x -C /tmp/per-head
    python benchmarks/sass_loop.py --root . --against /tmp/per-head

The listing is only the device's if this machine's DSL loads the device's toolkit flavor: with
only the default cu12 libraries installed, ptxas 12 schedules the loop differently from the cu13
build that runs on the H200 (RESULTS.md, twentieth session). Install `nvidia-cutlass-dsl[cu13]`
beside it (with no driver the DSL then picks cu13); the header line names the flavor.

Each tree compiles in its own process (--root goes first on sys.path), with the family default at
B=1 H=56 S=8192 (Q by prepare, split_tail off where the tree has those knobs) and --knobs on top.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

_INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+(?:\.[A-Z0-9_]+)*)")
_LABEL = re.compile(r"\s*\.(L_x_\d+):")
_BACK_BRANCH = re.compile(r"BRA\s+`?\(\.(L_x_\d+)\)")
# Waits and releases whose place in the loop decides how much of the softmax overlaps the GEMMs.
_MARKS = re.compile(r"DEPBAR|SYNCS\.ARRIVE|SYNCS\.PHASECHK\.TRANS64\.TRYWAIT|BAR\.SYNC|BAR\.ARV"
                    r"|QGMMA.*gsb0")


def strip_loop(sass: str) -> list[str]:
    """The innermost loop of the consumer program (after its setmaxnreg increase) that holds
    both QGMMA and MUFU.EX2: the steady-state strip."""
    program = next(p for p in re.split(r"\n(?=\s*\.text\.)", sass) if "QGMMA" in p)
    consumers = program.partition("USETMAXREG.TRY_ALLOC")[2].splitlines()
    labels, lines = {}, []
    for line in consumers:
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = len(lines)
        elif _INSTRUCTION.match(line):
            lines.append(line)
    loops = []
    for end, line in enumerate(lines):
        branch = _BACK_BRANCH.search(line)
        if branch and labels.get(branch.group(1), end) < end:
            body = lines[labels[branch.group(1)]:end + 1]
            text = "\n".join(body)
            if "QGMMA" in text and "MUFU.EX2" in text:
                loops.append(body)
    if not loops:
        raise SystemExit("no consumer loop with QGMMA and MUFU.EX2 found")
    return min(loops, key=len)


def normalised(line: str) -> str:
    """An instruction without its address, register numbers, immediates and reuse flags."""
    line = re.sub(r"/\*[0-9a-f]+\*/", "", line)
    line = re.sub(r"\bU?R[0-9]+\b", "R", line)
    line = re.sub(r"\bU?P[0-9]\b", "P", line)
    line = re.sub(r"0x[0-9a-f]+|\.L_x_\d+", "X", line)
    return " ".join(line.replace(".reuse", "").split())


def pv_wait(body: list[str]) -> dict:
    """Where the strip's wait for its PV wgmma (wait_group(0), `DEPBAR.LE gsb0, 0x0`) sits after
    the wait for its QK (wait_group(1)): the instructions between them run under the PV wgmma,
    among them how many of the row max (FMNMX) and exponentials (MUFU.EX2). The source asks
    for the wait after the whole softmax; ptxas decides where it goes, and under cu13's ptxas
    the per-head kernel of 3099e4a runs its row max there and main's block-scale kernel nothing
    (benchmarks/RESULTS.md, twenty-second session). Empty without both waits (no overlap)."""
    qk = [i for i, line in enumerate(body) if "DEPBAR.LE gsb0, 0x1" in line]
    pv = [i for i, line in enumerate(body) if "DEPBAR.LE gsb0, 0x0" in line]
    if not qk or not pv or pv[0] < qk[0]:
        return {}
    under = body[qk[0] + 1:pv[0]]
    return {"qk_wait": qk[0], "pv_wait": pv[0], "between": len(under),
            "row_max_between": sum("FMNMX" in line for line in under),
            "exp2_between": sum("MUFU.EX2" in line for line in under)}


def summary(body: list[str]) -> dict:
    ops = Counter(_INSTRUCTION.match(line).group(1).split(".")[0] for line in body)
    where = {name: [i for i, line in enumerate(body) if key in line]
             for name, key in (("mufu", "MUFU.EX2"), ("f2fp", "F2FP"))}
    return {
        "instructions": len(body),
        "pv_wait": pv_wait(body),
        "opcodes": dict(ops.most_common()),
        "marks": [f"{i}: {normalised(line)}" for i, line in enumerate(body) if _MARKS.search(line)],
        "exp2_first_last": [where["mufu"][0], where["mufu"][-1]],
        "p_convert_first_last": [where["f2fp"][0], where["f2fp"][-1]] if where["f2fp"] else [],
        "normalised": [normalised(line) for line in body],
    }


def compile_loop(root: str, knobs: str, head_dim: int) -> dict:
    """Runs in a child process with `root` first on sys.path (see main)."""
    sys.path.insert(0, root)
    from default_candidates import knobs_arg

    from tuner.problem import Problem
    from variants import wgmma
    from variants.cubin import disassemble

    cfg = wgmma.default("sm_90a", Problem(1, 56, 8192, head_dim=head_dim))
    fields = cfg.to_dict()
    wanted = {"q_quant": "prepare", "split_tail": False}
    wanted.update(knobs_arg(knobs))
    cfg = dataclasses.replace(cfg, **{k: v for k, v in wanted.items() if k in fields})
    kernel = wgmma.compile(cfg, Problem(1, 2, 77, head_dim=head_dim), "sm_90a")
    return {"config": cfg.short(), **summary(strip_loop(disassemble(
        kernel.cubin_path.read_bytes())))}


def _in_child(root: str, knobs: str, head_dim: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TUNER_CACHE_DIR": cache}
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--root", root, "--knobs", knobs,
             "--head-dim", str(head_dim)], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".", help="the package tree to compile")
    ap.add_argument("--against", default="", help="another tree, compared line by line")
    ap.add_argument("--knobs", default="", help="knob=value,... on the default (YAML values)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(compile_loop(args.root, args.knobs, args.head_dim)))
        return
    loops = {root: _in_child(root, args.knobs, args.head_dim)
             for root in filter(None, (args.root, args.against))}
    # The checkout's, not the trees': the children load the DSL of this same environment, and a
    # tree from before dsl_toolkit() existed has none to ask.
    from variants.build import dsl_toolkit

    toolkit = dsl_toolkit()
    for root, loop in loops.items():
        print(f"== {root} ({toolkit} ptxas): {loop['config']}")
        print(f"strip loop: {loop['instructions']} instructions; exp2 at "
              f"{loop['exp2_first_last']}, P conversion at {loop['p_convert_first_last']}")
        if loop.get("pv_wait"):
            w = loop["pv_wait"]
            print(f"PV wait at {w['pv_wait']}, {w['between']} instructions after QK's wait at "
                  f"{w['qk_wait']}: {w['row_max_between']} of the row max and "
                  f"{w['exp2_between']} exponentials run under the PV wgmma")
        print("opcodes:", loop["opcodes"])
        print("waits and releases:", *loop["marks"], sep="\n  ")
    if args.against:
        import difflib

        a, b = (loops[r]["normalised"] for r in (args.root, args.against))
        changed = sum(1 for line in difflib.ndiff(a, b) if line[:1] in "+-")
        print(f"lines that differ (registers and immediates normalised): {changed}")


if __name__ == "__main__":
    main()
