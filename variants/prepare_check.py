"""The gate's check of a candidate's prepare: its prepared inputs (variants.fp8_inputs.Fp8Inputs)
against the gate's own quantization (variants/reference.py), in two steps.

`declared_transforms` first: the transforms the config asks for must be the ones the prepared
inputs declare (K smoothing's vector m, the Q/K rotation), and a declared m must be the mean of
the same key sample the gate takes itself, per (batch, KV head), within MEAN_SUM_REL (fp32
summation order): a vector of another head or batch, or a missing one, fails naming prepare.
The gate then quantizes k - m with the declared m itself, so that `prepare_mismatch` can ask
for exactly its codes and descales through the layout and key order the inputs declare, zero
padding, neutral packed padding, and the LSE shift q . m within LSE_SHIFT_REL.
"""

from __future__ import annotations

import math

import torch

from variants.block_scales import PackedLayout
from variants.reference import ReferenceInputs, reference_key_mean
from variants.reference_bounds import LSE_SHIFT_REL, MEAN_SUM_REL


def declared_transforms(prepared, k: torch.Tensor, k_smoothing: str,
                        qk_rotation: str) -> tuple[torch.Tensor | None, str | None]:
    """(the declared smoothing vector, None) when the prepared inputs declare what the config
    asks for (k_smoothing "off" | "mean", qk_rotation "none" | "hadamard") and a declared m is
    the mean of the caller's k's sample; else (None, what is wrong, naming prepare)."""
    rotated = bool(getattr(prepared, "qk_rotated", False))
    if rotated != (qk_rotation == "hadamard"):
        return None, (f"prepare: q and k are {'' if rotated else 'not '}declared rotated, the "
                      f"config's qk_rotation is {qk_rotation!r}")
    declared = getattr(prepared, "k_mean", None)
    if k_smoothing != "mean":
        if declared is not None:
            return None, (f"prepare: declares a smoothing vector, the config's k_smoothing is "
                          f"{k_smoothing!r}")
        return None, None
    if declared is None:
        return None, ("prepare: k_smoothing='mean' but the prepared inputs declare no smoothing "
                      "vector (k_mean): the LSE shift cannot be restored")
    own, spread = reference_key_mean(k)
    if tuple(declared.shape) != tuple(own.shape) or declared.dtype != torch.float32:
        return None, (f"prepare: the smoothing vector is {declared.dtype} "
                      f"{tuple(declared.shape)}, expected float32 (batch, kv_heads, head_dim) "
                      f"= {tuple(own.shape)}")
    tolerance = MEAN_SUM_REL * spread
    far = ~((declared - own).abs() <= tolerance)  # NaN counts as far
    if bool(far.any()):
        b, h, d = (int(i) for i in far.nonzero()[0])
        return None, (f"prepare: the smoothing vector of batch {b} KV head {h} is not the mean "
                      f"of that head's key sample ({int(far.sum())} of {far.numel()} values "
                      f"off; feature {d}: {float(declared[b, h, d]):.6g} vs "
                      f"{float(own[b, h, d]):.6g}, tolerance {float(tolerance[b, h, d]):.3g}): "
                      "a vector of another head or batch, or of another sample")
    return declared, None


def _first_mismatch(name: str, got: torch.Tensor, want: torch.Tensor, dims: str) -> str | None:
    bad = ~(got == want)  # NaN counts as a mismatch
    count = int(bad.sum())
    if not count:
        return None
    where = [int(i) for i in bad.nonzero()[0]]
    place = ", ".join(f"{d} {i}" for d, i in zip(dims.split(), where, strict=True))
    first = tuple(where)
    return (f"{name} differs from the gate's quantization at {count} of {bad.numel()} elements "
            f"(first at {place}: {float(got[first]):.6g} vs {float(want[first]):.6g})")


def prepare_mismatch(prepared, ref: ReferenceInputs) -> str | None:
    """None when the candidate's prepared inputs (variants.prepare.Fp8Inputs) decode, through the
    layout and key order they declare, to exactly the gate's codes and descales, with zero
    padding; else what differs, naming prepare."""
    batch, seq_len, heads, head_dim = ref.q.shape
    if prepared.seq_len != seq_len or tuple(prepared.q.shape[::2]) != (batch, heads):
        return (f"prepare: prepared inputs are for seq_len {prepared.seq_len}, shape "
                f"{tuple(prepared.q.shape)}; the inputs were {tuple(ref.q.shape)}")
    if not math.isclose(prepared.softmax_scale, ref.softmax_scale, rel_tol=1e-6):
        return (f"prepare: softmax_scale {prepared.softmax_scale:.6g}, expected "
                f"{ref.softmax_scale:.6g} (the caller's, or head_dim^-0.5)")
    problem = _scales_mismatch(prepared, ref) or _shift_mismatch(prepared, ref)
    if problem:
        return f"prepare: {problem}"
    got = prepared.dequantized()
    for name, g, want in zip("qkv", got, ref.dequantized(), strict=True):
        if g.shape != want.shape:
            return (f"prepare: {name} decodes to shape {tuple(g.shape)}, the input was "
                    f"{tuple(want.shape)}")
        problem = _first_mismatch(name, g, want, "batch token head dim")
        if problem:
            return (f"prepare: {problem}; the prepared codes are not what the layout and key "
                    "order they declare say")
    padding = prepared.padding()
    for name, pad in zip("qkv", padding, strict=True):
        if pad.numel() and bool((pad != 0).any()):
            return (f"prepare: {name}'s padding past seq_len {seq_len} is not zero "
                    f"({int((pad != 0).sum())} nonzero codes)")
    return None


def _scales_mismatch(prepared, ref: ReferenceInputs) -> str | None:
    """The packed buffer, what the kernels read, against the gate's descales: q's, k's and v's
    exactly, V's inverse exactly and its log2 within 2 ulp (torch's log2f and the DSL's may
    round apart), the padding neutral (1; log2 0). A kernel that quantizes Q itself
    (prepared.q_in_kernel) reads no q scale, and prepare writes none: q's part is not checked
    (its codes and scales are, by the kernel's output against the reference)."""
    batch, _, heads, _ = prepared.q.shape
    padded = prepared.padded_len
    _, padded_kv, kv_heads, _ = prepared.k.shape
    layout = PackedLayout(batch, heads, padded, kv_heads, padded_kv)
    if prepared.packed.numel() != layout.size:
        return (f"the packed scales hold {prepared.packed.numel()} values, the layout of these "
                f"inputs {layout.size}")
    q, k, log2_v, inv_v, v = layout.views(prepared.packed)
    s, blocks = ref.seq_len, ref.scales.k.shape[-1]
    if layout.blocks < blocks:
        return f"the packed scales hold {layout.blocks} blocks of keys, the inputs {blocks}"
    sv = ref.scales.v
    checked_q = () if prepared.q_in_kernel else (
        ("q descale", q[..., :s], ref.scales.q, "batch head token"),)
    for name, got, want, dims in (*checked_q,
                                  ("k descale", k[..., :blocks], ref.scales.k, "batch head block"),
                                  ("v descale", v[..., :blocks], sv, "batch head block"),
                                  ("1 / v descale", inv_v[..., :blocks], sv.reciprocal(),
                                   "batch head block")):
        problem = _first_mismatch(name, got, want, dims)
        if problem:
            return problem
    log2_sv = sv.log2()
    far = ~((log2_v[..., :blocks] - log2_sv).abs() <= 2.5e-7 * log2_sv.abs().clamp_min(1.0))
    if bool(far.any()):
        return f"log2 of v's descale is off at {int(far.sum())} blocks of the packed scales"
    padding_q = () if prepared.q_in_kernel else (("q", q[..., s:], 1.0),)
    for name, part, neutral in (*padding_q, ("k", k[..., blocks:], 1.0),
                                ("log2 v", log2_v[..., blocks:], 0.0),
                                ("1 / v", inv_v[..., blocks:], 1.0),
                                ("v", v[..., blocks:], 1.0)):
        if bool((part != neutral).any()):
            return f"packed {name} scales past the real length are not {neutral} (padding)"
    return None


def _shift_mismatch(prepared, ref: ReferenceInputs) -> str | None:
    """The LSE shift prepare keeps (softmax_scale * q . m per row; for a kernel that quantizes Q
    itself computed on first use) against the gate's own, within LSE_SHIFT_REL."""
    if ref.lse_shift is None:
        return None
    got = prepared.lse_shift()
    if got is None or tuple(got.shape) != tuple(ref.lse_shift.shape):
        return (f"the LSE shift q . m is {None if got is None else tuple(got.shape)}, expected "
                f"(batch, heads, seq_len) = {tuple(ref.lse_shift.shape)}")
    far = ~((got - ref.lse_shift).abs() <= LSE_SHIFT_REL * ref.lse_shift_magnitude)
    if bool(far.any()):
        b, h, r = (int(i) for i in far.nonzero()[0])
        return (f"the LSE shift softmax_scale * q . m is off at {int(far.sum())} rows (first at "
                f"batch {b}, head {h}, row {r}: {float(got[b, h, r]):.6g} vs "
                f"{float(ref.lse_shift[b, h, r]):.6g})")
    return None
