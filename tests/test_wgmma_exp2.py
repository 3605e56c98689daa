"""The FMA-pipe exp2 of the wgmma softmax (knob fma_exp2), checked on the CPU.

The PTX string the kernel inlines is executed here by a small interpreter of the instructions it
uses, with f32 semantics (numpy float32; add.rm rounded toward -inf from the exact sum; fma
through f64, whose rare double rounding is at most one f32 ulp), so a wrong constant, rounding
mode or bit trick in the string fails here and not only on a GPU.
"""

import numpy as np
import pytest

from variants.wgmma.ptx import _EXP2_POLYNOMIAL_PTX, EXP2_CUBIC


def _f32(token: str) -> np.float32:
    return np.array([int(token[2:], 16)], dtype=np.uint32).view(np.float32)[0]


def _add_round_down(a: np.ndarray, b: np.float32) -> np.ndarray:
    """a + b (f32) rounded toward -inf (PTX add.rm), from the exact sum: the f64 sum s plus its
    rounding error e (TwoSum), so that a sum just below an f32 value still rounds down."""
    a64, b64 = a.astype(np.float64), np.float64(b)
    s = a64 + b64
    bb = s - a64
    e = (a64 - (s - bb)) + (b64 - bb)
    nearest = s.astype(np.float32)
    n64 = nearest.astype(np.float64)
    above = (n64 > s) | ((n64 == s) & (e < 0))
    return np.where(above, np.nextafter(nearest, np.float32(-np.inf)), nearest)


def run_ptx(x: np.ndarray) -> np.ndarray:
    """Execute _EXP2_POLYNOMIAL_PTX for every element of x (f32); returns $0 as f32."""
    regs = {"$1": x.astype(np.float32)}

    def val(token):
        if token.startswith("0f"):
            return _f32(token)
        return np.uint32(int(token)) if token.isdigit() else regs[token]

    for line in _EXP2_POLYNOMIAL_PTX.splitlines():
        line = line.strip().rstrip(";")
        if not line or line[0] in "{}." or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        dst, *src = [t.strip() for t in rest.split(",")]
        a = [val(t) for t in src]
        if op == "max.NaN.f32":  # NaN if either operand is NaN (np.maximum's rule too)
            out = np.maximum(a[0], a[1]).astype(np.float32)
        elif op == "add.rm.f32":
            out = _add_round_down(a[0], a[1])
        elif op == "sub.rn.f32":
            out = (a[0] - a[1]).astype(np.float32)
        elif op == "fma.rn.f32":
            exact = a[0].astype(np.float64) * np.float64(a[1]) + np.float64(a[2])
            out = exact.astype(np.float32)  # the product of two f32 is exact in f64
        elif op == "mov.b32":  # a bit copy between the f32 and b32 views of a register
            out = a[0].view(np.uint32) if a[0].dtype == np.float32 else a[0].view(np.float32)
        elif op == "shl.b32":
            out = (a[0].astype(np.uint64) << np.uint64(a[1])).astype(np.uint32)
        elif op == "add.s32":
            out = (a[0].astype(np.uint64) + a[1].astype(np.uint64)).astype(np.uint32)
        else:
            raise AssertionError(f"the interpreter does not know {op!r}: extend it")
        regs[dst] = out
    return regs["$0"]


def test_cubic_is_one_at_zero_and_below_two_at_one():
    # p in [1, 2) keeps the f32 exponent at 127, so adding floor(x) << 23 never wraps.
    assert EXP2_CUBIC[0] == 1.0
    assert 1.999 < sum(EXP2_CUBIC) < 2.0


def test_matches_exp2_across_the_softmax_range():
    # x = s * log2(e) * scale - m + 8: at most 8 (the row max), down to far below e4m3's range.
    x = np.concatenate([np.linspace(-126.0, 8.5, 400_001, dtype=np.float32),
                        np.arange(-126, 9, dtype=np.float32),  # integers: f = 0 exactly
                        # just below an integer: floor is one less and f rounds up to 1.0
                        np.float32(-2.0) ** -np.arange(20, 40, dtype=np.float32),
                        np.nextafter(np.arange(-125, 9, dtype=np.float32), np.float32(-200))])
    got = run_ptx(x).astype(np.float64)
    rel = np.abs(got / np.exp2(x.astype(np.float64)) - 1.0)
    assert rel.max() < 1.6e-4, f"max relative error {rel.max():.2e} at x={x[rel.argmax()]}"


@pytest.mark.parametrize("x", [-np.inf, -1e30, -300.0, -127.0, -126.75])
def test_masked_and_tiny_inputs_give_a_tiny_nonnegative_number(x):
    got = run_ptx(np.array([x], dtype=np.float32))[0]
    assert np.isfinite(got) and 0.0 <= got < 2.0 ** -125, got


def test_masked_keys_give_exactly_zero():
    assert run_ptx(np.array([-np.inf], dtype=np.float32))[0] == 0.0


def test_nan_stays_nan_like_mufu_ex2():
    # A NaN score (a NaN in q or k) must reach the output whichever pipe its exponential took.
    assert np.isnan(run_ptx(np.array([np.nan], dtype=np.float32))[0])
