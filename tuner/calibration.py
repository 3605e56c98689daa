"""Calibration files: the q, k, v of a model's own attention calls (written by tuner.capture),
read back for the accuracy budget of `tuner search --calibration FILE`.

One safetensors file. Its metadata holds FORMAT, FORMAT_VERSION and `calls`, a JSON list with one
entry per recorded call: its tensor name prefix ("c0"), the problem key of the call
(tuner/problem.py: the whole call's shape and mask), its softmax_scale (null: head_dim^-0.5),
its causal flag and the (batch, KV head) slices kept. The tensors of a call are `<name>.q`
(slices, seq_len, group, head_dim) and `<name>.k`, `<name>.v` (slices, seq_len_kv, 1, head_dim):
slice i is batch b, KV head g of the call, whole sequences, with the group of query heads that
read it. Run as a batch of `slices` with `group` query heads over one KV head, a slice is the
problem's own attention (lengths, head_dim, group size, mask) on the call's own data.

`read(path)` checks the whole file before a search starts (format, metadata, every tensor's
dtype and shape against its recorded problem) and names the file and the fix on any fault; its
sha256 names the data a winner's error was measured on. `load_calls` reads one problem's calls
inside the sandbox.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.problem import Problem

FORMAT = "fp8-attn-tuner/calibration"
FORMAT_VERSION = "1"
DTYPES = ("bfloat16", "float16", "float32")
_CAPTURE_HINT = "capture one with `with tuner.capture(PATH): model(...)` (docs/calibration.md)"


class CalibrationError(TunerError):
    """A calibration file that cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class Call:
    """One recorded call, as its metadata entry says."""

    name: str
    problem: Problem
    softmax_scale: float | None
    causal: bool
    slices: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CalibrationFile:
    path: Path
    sha256: str
    calls: tuple[Call, ...]

    @property
    def data(self) -> str:
        """What a trial's e2e_data names: "calibration:<sha256 of the file>"."""
        return f"calibration:{self.sha256}"

    def problems(self) -> list[str]:
        return sorted({c.problem.key() for c in self.calls})

    def require(self, problems) -> None:
        """Every problem of a search must have calls in the file."""
        held = set(self.problems())
        missing = [p.key() for p in problems if p.key() not in held]
        if missing:
            held_flags = "; ".join(f"{key} ({search_flags(Problem.from_key(key))})"
                                   for key in self.problems())
            raise CalibrationError(
                f"calibration file {self.path} holds no calls of {', '.join(missing)}: search "
                f"the shapes it holds, {held_flags}, or capture a run with the shapes you search")


def search_flags(problem: Problem) -> str:
    """The `tuner search` options of one problem."""
    flags = (f"--seq-lens {problem.seq_len} --heads {problem.heads} --batch {problem.batch} "
             f"--head-dim {problem.head_dim}")
    if problem.seq_len_kv != problem.seq_len:
        flags += f" --kv-len {problem.seq_len_kv}"
    if problem.kv_heads != problem.heads:
        flags += f" --kv-heads {problem.kv_heads}"
    return flags + (" --causal" if problem.causal else "")


def _fail(path, what: str, fix: str = _CAPTURE_HINT) -> CalibrationError:
    return CalibrationError(f"calibration file {path}: {what}; {fix}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _calls(path, metadata: dict | None) -> list[Call]:
    if not metadata or metadata.get("format") != FORMAT:
        raise _fail(path, f"a safetensors file, but not a calibration file (its metadata has no "
                    f"format {FORMAT!r})")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise _fail(path, f"format version {metadata.get('format_version')!r}, this tuner reads "
                    f"{FORMAT_VERSION!r}", "capture it again with this tuner")
    try:
        entries = json.loads(metadata.get("calls", ""))
    except json.JSONDecodeError:
        raise _fail(path, "its `calls` metadata is not JSON") from None
    if not isinstance(entries, list) or not entries:
        raise _fail(path, "it records no calls (was the model run inside the capture?)")
    calls = []
    for i, e in enumerate(entries):
        try:
            problem = Problem.from_key(e["problem"])
            scale = e["softmax_scale"]
            slices = tuple((int(b), int(g)) for b, g in e["slices"])
            call = Call(str(e["name"]), problem, scale, e["causal"], slices)
        except (KeyError, TypeError, ValueError, TunerError) as exc:
            raise _fail(path, f"call {i} of its metadata is malformed ({exc})") from None
        if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)
                                      and scale > 0):
            raise _fail(path, f"call {call.name}: softmax_scale {scale!r} is not a positive "
                        "number")
        if call.causal is not problem.causal:
            raise _fail(path, f"call {call.name}: causal={call.causal!r} disagrees with its "
                        f"problem {problem.key()}")
        if not slices or any(not (0 <= b < problem.batch and 0 <= g < problem.kv_heads)
                             for b, g in slices):
            raise _fail(path, f"call {call.name}: slices {list(slices)} are not (batch, KV head) "
                        f"pairs of {problem.key()}")
        calls.append(call)
    return calls


def expected_shapes(call: Call) -> dict[str, tuple[int, ...]]:
    p, n = call.problem, len(call.slices)
    kv = (n, p.seq_len_kv, 1, p.head_dim)
    return {"q": (n, p.seq_len, p.group, p.head_dim), "k": kv, "v": kv}


def read(path) -> CalibrationFile:
    """The calls of a calibration file, every tensor checked against its problem (shapes and
    dtypes from the header: no tensor data is read), and the file's sha256."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise _fail(path, "no such file")
    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata()
            names = set(fh.keys())
            calls = _calls(path, metadata)
            for call in calls:
                for part, shape in expected_shapes(call).items():
                    name = f"{call.name}.{part}"
                    if name not in names:
                        raise _fail(path, f"tensor {name} of call {call.name} is missing")
                    got = fh.get_slice(name)
                    dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(
                        got.get_dtype())
                    if dtype is None:
                        raise _fail(path, f"tensor {name} is {got.get_dtype()}; calls hold "
                                    f"{', '.join(DTYPES)}")
                    if tuple(got.get_shape()) != shape:
                        raise _fail(path, f"tensor {name} has shape {tuple(got.get_shape())}, "
                                    f"its problem {call.problem.key()} with "
                                    f"{len(call.slices)} slices needs {shape}")
    except CalibrationError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' errors for a file that is no such file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise _fail(path, f"not a readable safetensors file, or cut off ({first})") from None
    return CalibrationFile(path, _sha256(path), tuple(calls))


# Calls loaded by this process (the sandbox serves many candidates of one problem): (path, sha256,
# problem key) -> [(call, q, k, v)] on the CPU.
_LOADED: dict[tuple, list] = {}


def load_calls(path: str, sha256: str, problem_key: str) -> list:
    """(call, q, k, v) of every call of `problem_key` in the file (CPU tensors), read once per
    process; the parent checked the file (read) before the search started."""
    key = (path, sha256, problem_key)
    if key not in _LOADED:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as fh:
            calls = [c for c in _calls(path, fh.metadata()) if c.problem.key() == problem_key]
            _LOADED.clear()  # one problem at a time: a search moves on, it never comes back
            _LOADED[key] = [(c, *(fh.get_tensor(f"{c.name}.{p}") for p in "qkv")) for c in calls]
    return _LOADED[key]
