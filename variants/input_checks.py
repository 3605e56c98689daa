"""The checks of prepare's inputs at the public boundary (bf16/fp16 q, k, v for tuner.attention;
e4m3 codes and their descales for tuner.attention_fp8), each message naming the problem and the
fix. They time nothing (the code version leaves this module out); which path prepare takes for
a set of tensors is variants/input_layout.py's."""

from __future__ import annotations

import torch

from variants.base import HEAD_DIMS as SUPPORTED_HEAD_DIMS
from variants.block_scales import KV_BLOCK
from variants.errors import TunerError
from variants.input_layout import capturing


def check_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    require_cuda: bool = False,
    check_finite: bool = True,
    allow_empty: bool = False,
) -> None:
    """Public-boundary validation of bf16/fp16 inputs: q (batch, seq_len, heads, head_dim), k and
    v (batch, seq_len_kv, kv_heads, head_dim) with kv_heads a divisor of heads; every message
    names the problem and the fix. allow_empty: a q without elements or a k and v without keys
    passes (the public entry points answer it without a launch: no_work)."""
    _check_tensors(q, k, v, require_cuda=require_cuda)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TunerError(
                f"{name} has dtype {t.dtype}; pass bfloat16 or float16 "
                f"(the kernels quantize to FP8 themselves), e.g. {name}.to(torch.bfloat16); "
                "e4m3 codes with their descales go to tuner.attention_fp8"
            )
    _check_shapes(q, k, v, allow_empty)
    if check_finite:
        check_finite_inputs(q, k, v)


def check_fp8_qkv(q, k, v, descales, allow_empty: bool = False) -> None:
    """The FP8 entry point's boundary: e4m3 q (batch, seq_len, heads, head_dim), k and v (batch,
    seq_len_kv, kv_heads, head_dim), and fp32 descales in one of two granularities each: per
    head, broadcastable to (batch, heads) for q and (batch, kv_heads) for k and v (each tensor's
    own heads; one per tensor broadcasts too), or fine, as prepare's block scales: q's (batch,
    seq_len, heads) one per token, k's and v's (batch, ceil(seq_len_kv / 64), kv_heads) one per
    64 keys. Every message names the problem and the fix."""
    _check_tensors(q, k, v, require_cuda=True)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.float8_e4m3fn:
            raise TunerError(
                f"{name} has dtype {t.dtype}; attention_fp8 takes float8_e4m3fn codes with their "
                "descales (bf16/fp16 inputs go to tuner.attention, which quantizes them)")
    _check_shapes(q, k, v, allow_empty)
    for index, (name, d) in enumerate(zip(("q_descale", "k_descale", "v_descale"), descales,
                                          strict=True)):
        x = (q, k, v)[index]
        batch, length, heads = x.shape[:3]
        which = "kv_heads" if index else "heads"
        fine = (batch, length, heads) if index == 0 else (batch, -(-length // KV_BLOCK), heads)
        fine_words = ("(batch, seq_len, heads) one per token" if index == 0 else
                      f"(batch, ceil(seq_len_kv / {KV_BLOCK}), kv_heads) one per {KV_BLOCK} keys")
        if not isinstance(d, torch.Tensor) or d.dtype != torch.float32:
            raise TunerError(f"{name} must be a float32 tensor of shape (batch, {which}) = "
                             f"({batch}, {heads}) or broadcastable to it (one per tensor), or "
                             f"{fine_words} = {fine}, got "
                             f"{getattr(d, 'dtype', type(d).__name__)}")
        if d.dim() > 3:
            raise TunerError(f"{name} has {d.dim()} dims (shape {tuple(d.shape)}); per head it "
                             f"is (batch, {which}) = ({batch}, {heads}) or broadcastable to it, "
                             f"fine it is {fine_words} = {fine}")
        if d.dim() == 3:
            if tuple(d.shape) != fine:
                raise TunerError(f"{name} has shape {tuple(d.shape)}; a 3-dim descale is "
                                 f"{fine_words} = {fine} (per head: a 2-dim (batch, {which}))")
        else:
            try:
                torch.broadcast_shapes(tuple(d.shape), (batch, heads))
            except RuntimeError:
                raise TunerError(f"{name} has shape {tuple(d.shape)}; it must broadcast to "
                                 f"(batch, {which}) = ({batch}, {heads}): one descale per "
                                 f"(batch, head) of {name[0]}, or one per tensor; or be "
                                 f"{fine_words} = {fine}") from None
        if d.device != q.device:
            raise TunerError(f"{name} is on {d.device}, q on {q.device}: move it with "
                             f".to({str(q.device)!r})")


def _check_tensors(q, k, v, *, require_cuda: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TunerError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise TunerError(
                f"{name} has rank {t.dim()} (shape {tuple(t.shape)}); expected 4 dims "
                "(batch, seq_len, heads, head_dim); add a batch dim with unsqueeze(0) or transpose "
                "a (batch, heads, seq_len, head_dim) tensor with .transpose(1, 2)"
            )
        # Meta tensors pass: they only trace shapes (the custom op answers them with its fake
        # implementation, without a GPU).
        if require_cuda and not (t.is_cuda or t.is_meta):
            raise TunerError(
                f"{name} is on {t.device}; the kernels run on a CUDA GPU: move it with .cuda()"
            )


def no_work(q, k) -> bool:
    """No output element to compute (batch, seq_len or heads 0), or no key to attend to
    (seq_len_kv 0: every row's output is 0 and its LSE -inf, as a row that sees no key)."""
    return q.numel() == 0 or k.shape[1] == 0


def _check_shapes(q, k, v, allow_empty: bool = False) -> None:
    if k.shape != v.shape:
        raise TunerError(
            f"k and v shapes differ: {tuple(k.shape)}, {tuple(v.shape)}; each key has its value: "
            "pass both as (batch, seq_len_kv, kv_heads, head_dim)"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TunerError(
            f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}; cast them to one"
        )
    if not (q.device == k.device == v.device):
        raise TunerError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    batch, seq_len, heads, head_dim = q.shape
    kv_batch, seq_len_kv, kv_heads, kv_head_dim = k.shape
    if kv_batch != batch:
        raise TunerError(
            f"q has batch {batch}, k and v {kv_batch}: each sequence attends to its own keys; "
            "pass k and v with q's batch (expand a shared context to it)"
        )
    sizes = (f"empty input (batch={batch}, seq_len={seq_len}, heads={heads}, "
             f"seq_len_kv={seq_len_kv}, kv_heads={kv_heads}); ")
    if kv_heads == 0 and heads:
        raise TunerError(sizes + "query heads need key/value heads: pass k and v with a divisor "
                         "of q's heads")
    if not allow_empty and (seq_len == 0 or batch == 0 or heads == 0 or seq_len_kv == 0):
        raise TunerError(sizes + "prepare has nothing to quantize (tuner.attention and the SDPA "
                         "drop-in answer such a call without a kernel)")
    if kv_head_dim != head_dim:
        raise TunerError(
            f"q has head_dim {head_dim}, k and v {kv_head_dim}: q . k needs one head_dim (the "
            "kernels take v's equal to it too); zero-pad the shorter one"
        )
    if kv_heads and heads % kv_heads:
        raise TunerError(
            f"q has {heads} heads, k and v {kv_heads}: the query heads must be a multiple of the "
            f"key/value heads (each KV head serves heads // kv_heads query heads, grouped-query "
            "attention); pass k and v with a divisor of q's heads, or repeat_interleave them to "
            f"{heads}"
        )
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise TunerError(
            f"head_dim {head_dim} is not supported; supported: {SUPPORTED_HEAD_DIMS} "
            "(zero-pad the head dimension to the next supported size)"
        )


def check_finite_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """No NaN/Inf in q, k, v: FP8 scales from amax would be meaningless."""
    # The scan syncs the device, which a CUDA-graph capture forbids: captured calls skip it
    # (the eager call that precedes every capture has run it).
    if capturing():
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise TunerError(
                f"{name} contains {bad} NaN/Inf values; FP8 scales from amax would be "
                "meaningless: fix the producer of the input (or nan_to_num it) first"
            )
