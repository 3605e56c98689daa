"""The accuracy budget of a search: a candidate that passed the gate must also keep its end-to-end
error on the accuracy data within `max_error`, else its outcome is `too_inaccurate` and it is
never timed.

The gate (tuner/gate.py) finds bugs: the kernel against an fp32 reference on the gate's own FP8
quantization of the same inputs. The budget is a quality choice: the kernel against fp32
attention on the original inputs (variants.reference.end_to_end_error, FP8 quantization
included), on data like the user's. Two sources of data:
  - "realistic" (the default): tuner.activations kind "realistic" (K channel bias, Q/K outlier
    channels) at a small shape of the problem's kind (realistic_problem), one fixed seed, so
    every candidate of every search is held to the same tensors;
  - "calibration:<sha256>" (`--calibration FILE`): the user's own captured calls of the problem
    (tuner/calibration.py); a candidate's error is the worst of the calls' errors (a budget is a
    promise about every call, not the average one).
The check runs in the GPU sandbox right after the gate (`check`), so a crash there is a typed
outcome like any other; its wall time is reported as `accuracy_s`, apart from the gate's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from tuner.errors import TunerError

# The default budget. FP8 attention's end-to-end relative RMS against fp32 on the realistic data
# (CPU emulation of the kernels' block quantization, docs/calibration.md): 0.49-0.65 with neither
# exact transform, 0.19-0.27 with one, 0.054-0.091 with K smoothing and the Q/K rotation both on
# (head_dim 64 the highest); 0.043-0.053 on random normal inputs. 0.12 passes both transforms
# with 1.3x margin at head_dim 64 and rejects either one alone by 1.5x.
DEFAULT_MAX_ERROR = 0.12
# The realistic data's shape: lengths at most this (both scaled by one factor, so cross-attention
# stays cross-attention), odd (every tile is ragged), 2 KV heads with the problem's group size.
REALISTIC_MAX_LEN = 1024
REALISTIC_KV_HEADS = 2
REALISTIC_SEED = 20261205
REALISTIC = "realistic"


def check_max_error(value, name: str = "max_error") -> float:
    """`value` as a float if it is a positive, finite relative RMS, else a TunerError naming
    `name`: the one check of a budget, whether it comes from the CLI, a Budget or the runtime."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TunerError(f"{name} must be a number (a relative RMS such as 0.1), got "
                         f"{type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise TunerError(f"{name} must be a positive, finite relative RMS (e.g. 0.1), got "
                         f"{value!r}")
    return float(value)


@dataclass(frozen=True)
class Budget:
    """What a search holds candidates to: `max_error` on `data` ("realistic", or
    "calibration:<sha256>" of the file at `path`)."""

    max_error: float = DEFAULT_MAX_ERROR
    data: str = REALISTIC
    path: str | None = None

    def __post_init__(self) -> None:
        check_max_error(self.max_error)

    @property
    def label(self) -> str:
        """Short text for study names and tables: "realistic<=0.1", or "calibration:" and the
        file's sha256 prefix, "<=0.05"."""
        return f"{self.data[:20]}<={self.max_error:g}"

    def to_task(self) -> dict:
        return {"max_error": self.max_error, "data": self.data, "path": self.path}


def _odd(n: int) -> int:
    return n if n % 2 else n + 1


def realistic_problem(problem):
    """The shape the realistic data takes for `problem`: batch 1, REALISTIC_KV_HEADS KV heads with
    the problem's group size, head_dim and mask, lengths capped at REALISTIC_MAX_LEN (by one
    factor) and made odd."""
    from tuner.problem import Problem

    factor = min(1.0, REALISTIC_MAX_LEN / max(problem.seq_len, problem.seq_len_kv))
    seq_len, seq_len_kv = (_odd(max(1, math.ceil(n * factor)))
                           for n in (problem.seq_len, problem.seq_len_kv))
    return Problem(1, REALISTIC_KV_HEADS * problem.group, seq_len, problem.head_dim,
                   problem.causal, seq_len_kv, REALISTIC_KV_HEADS)


def _data(spec: dict, problem, device):
    """(kernel inputs, reference inputs, softmax_scale, causal) of every call the check runs, on
    `device`: the same q, k, v twice, except for an fp32 capture, which the kernel takes rounded
    to bf16 and the reference as it was."""
    import torch

    if spec["data"] == REALISTIC:
        from tuner.activations import activations

        qkv = activations(REALISTIC, realistic_problem(problem), device, REALISTIC_SEED)
        yield qkv, qkv, None, problem.causal
        return
    from tuner.calibration import load_calls

    sha = spec["data"].removeprefix("calibration:")
    for call, *tensors in load_calls(spec["path"], sha, problem.key()):
        qkv = tuple(t.to(device) for t in tensors)
        kernel_in = tuple(t.to(torch.bfloat16) if t.dtype == torch.float32 else t for t in qkv)
        yield kernel_in, qkv, call.softmax_scale, call.causal


def check(kernel, problem, device, spec: dict) -> dict:
    """Run `kernel` on the budget's data; returns e2e_error (the worst call's), e2e_data,
    max_error, calls and accuracy_s. A fault in the candidate's prepare or run raises
    measure.CandidateFailure, as in the gate."""
    from tuner.measure import guarded, synchronizer
    from variants.reference import end_to_end_error

    sync = synchronizer(device)
    t0 = time.perf_counter()
    worst, calls = 0.0, 0
    for inputs, reference, scale, causal in _data(spec, problem, device):
        prepared = guarded("prepare", kernel.prepare, *inputs, scale, sync=sync)
        out, _ = guarded("run", kernel.run, prepared, want_lse=False, sync=sync)
        del prepared
        error = end_to_end_error(out, *reference, scale, causal=causal)
        worst = max(worst, error) if math.isfinite(error) else math.inf  # NaN output: no budget
        calls += 1
    if not calls:  # an error of 0 over no data would pass every candidate
        raise RuntimeError(f"the accuracy data {spec['data']} holds no call of "
                           f"{problem.key()}: nothing to hold the candidate to")
    return {"e2e_error": worst, "e2e_data": spec["data"], "max_error": spec["max_error"],
            "calls": calls, "accuracy_s": round(time.perf_counter() - t0, 4)}
