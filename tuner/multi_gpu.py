"""`tuner search --workers N`: one search process per GPU of this host, all in one Optuna study.

Optuna's own distributed mode does the coordination (DESIGN.md: no scheduler of ours): each child
is a plain `tuner search` with the same arguments, pinned to one GPU by CUDA_VISIBLE_DEVICES, and
the study in the shared RDB storage hands out the trials and counts the budget. The children skip
the final decision (--no-decide); the parent makes it once, after all of them, on one GPU.
Several hosts need nothing from here: run `tuner search ... --storage postgresql://...` on each.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator

from tuner.errors import TunerError

# After a Ctrl-C the children (same process group) got it too; give them this long to record
# what they measured before they are told again.
INTERRUPT_GRACE_S = 10.0


def visible_devices(workers: int, on_cpu: bool) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each of `workers` children: one entry of this process's visible
    list each (indices or UUIDs, as given). Families that run on the CPU (test doubles) get no
    GPU at all, so that the several-process path can be tested without one."""
    if workers < 1:
        raise TunerError(f"--workers must be >= 1, got {workers}")
    if on_cpu:
        return [""] * workers
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [d.strip() for d in listed.split(",")] if listed is not None else []
    # CUDA stops at the first entry it cannot use: the first `count` are the visible ones.
    visible = names[:count] if listed is not None else [str(i) for i in range(count)]
    if workers > len(visible):
        shown = f" (CUDA_VISIBLE_DEVICES={listed})" if listed is not None else ""
        raise TunerError(f"--workers {workers} needs {workers} GPUs, {len(visible)} visible"
                         f"{shown}; use --workers {max(1, len(visible))} or fewer")
    return visible[:workers]


@contextlib.contextmanager
def pinned(device: str) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES for the worker processes spawned inside (the parent's decision)."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = device
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def child_args(argv: list[str], index: int, seed: int) -> list[str]:
    """The parent's own arguments, then overrides (argparse keeps the last value): one process,
    no decision, JSON for the parent to merge, and a seed of its own: with a shared seed the
    samplers' random start-up phases would propose the same configs in the same order."""
    return [sys.executable, "-m", "tuner", *argv, "--workers", "1", "--no-decide", "--json",
            "--seed", str(seed + index)]


def run_children(argv: list[str], devices: list[str], seed: int | None) -> list[dict]:
    """Run one child per device to the end; their --json documents, in device order."""
    seed = random.SystemRandom().randrange(2**31 - len(devices)) if seed is None else seed
    procs, outs, errs = [], [], []
    try:
        for i, device in enumerate(devices):
            # Files, not pipes: N children writing while we wait on one cannot block.
            outs.append(tempfile.TemporaryFile("w+"))
            errs.append(tempfile.TemporaryFile("w+"))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
            procs.append(subprocess.Popen(child_args(argv, i, seed), env=env, stdout=outs[-1],
                                          stderr=errs[-1], text=True))
        _wait_all(procs)
        docs = []
        for device, proc, out, err in zip(devices, procs, outs, errs, strict=True):
            out.seek(0)
            err.seek(0)
            if proc.returncode != 0:
                text = err.read()
                if "--debug" in argv:  # the child's traceback, as --debug promises
                    sys.stderr.write(text)
                lines = [ln for ln in text.splitlines() if ln.strip()]
                last = lines[-1] if lines else f"exit code {proc.returncode}"
                last = last.split(": error: ", 1)[-1]  # the child's own "tuner search: error:"
                raise TunerError(f"the search on CUDA_VISIBLE_DEVICES={device!r} failed: {last}")
            docs.append(json.loads(out.read()))
        return docs
    finally:
        for f in (*outs, *errs):
            f.close()


def _wait_all(procs: list[subprocess.Popen]) -> None:
    try:
        for p in procs:
            p.wait()
    except KeyboardInterrupt:
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGINT)  # only the parent was interrupted (kill -INT)
        for p in procs:
            p.wait()
        raise


def merged(docs: list[dict], index: int) -> tuple[str, Counter, int]:
    """What the children did for problem `index`: why they stopped, outcomes, trials measured."""
    results = [d["results"][index] for d in docs]
    stopped = "; ".join(sorted({r["stopped"] for r in results}))
    outcomes = sum((Counter(r["outcomes"]) for r in results), Counter())
    return stopped, outcomes, sum(r["measured_here"] for r in results)
