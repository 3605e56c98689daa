"""FP8 input preparation shared by every family: quantize, lay out V, pad, permute keys.

q, k, v arrive as bf16/fp16 (batch, seq_len, heads, head_dim). They get block scales
(variants/block_scales.py): q one per token and head, k and v one per 64 keys of a KV head, each
decided by the block it scales, so every input is read once and one outlier token or block does
not crush the resolution of the rest: x_fp8 = round_e4m3(x * 448 / amax), descale = amax / 448.
The kernels fold them into the softmax (Q's and K's into the exponent's factor, V's as log2 sv
in the exponent and 1 / sv in the row sum), so the epilogue has no descale left. The scales
travel packed in one fp32 buffer (block_scales.PackedLayout), the kernels' one pointer.

V is stored feature-major, (batch, heads, head_dim, padded_len), so the P @ V GEMM reads it with
keys contiguous (K-major B operand) without a transpose in the kernel. For the register-P trick of
the seed kernel, the key order inside every 16-key group is permuted once here, so that the
accumulator fragment of S can be reused as the A fragment of P @ V without crossing lanes.
On a GPU one launch (variants/block_quantize_kernel.py) quantizes all three inputs and writes
that layout and order itself.
A kernel that transposes V itself (wgmma with v_layout=kernel) asks for the natural layout
instead, (batch, padded_len, heads, head_dim) like K, and applies any key order in shared memory.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from variants import block_scales
from variants.base import HEAD_DIMS as SUPPORTED_HEAD_DIMS
from variants.block_scales import DESCALE_PER_AMAX, KV_BLOCK, TINY_AMAX, BlockScales, PackedLayout
from variants.errors import TunerError
from variants.key_order import inverse_key_order, key_slot, register_p_key_order

__all__ = ["Fp8Inputs", "check_qkv", "inverse_key_order", "key_slot", "quantize_inputs",
           "register_p_key_order", "round_up"]


@dataclass
class Fp8Inputs:
    """Quantized inputs in the layouts the kernels read."""

    # (batch, padded_len, heads, head_dim) float8_e4m3fn; or, for a kernel that quantizes Q
    # itself (q_in_kernel), the caller's bf16 (batch, seq_len, heads, head_dim), contiguous.
    q: torch.Tensor
    k: torch.Tensor  # (batch, padded_len_kv, kv_heads, head_dim) float8_e4m3fn
    # v_feature_major: (batch, kv_heads, head_dim, padded_len_kv), keys permuted if
    # key_permuted; otherwise (batch, padded_len_kv, kv_heads, head_dim) like k, natural order.
    v: torch.Tensor
    # The descales (variants/block_scales.py: q's per token and head, k's and v's per 64 keys of
    # a KV head) packed in the kernels' layout (block_scales.PackedLayout), the one buffer the
    # kernels read; `scales` views it. q_in_kernel: q's part is left unwritten (the kernel
    # computes q's scales itself and reads none of it).
    packed: torch.Tensor
    seq_len: int  # q's real length; rows at or past it are padding (zeros)
    key_permuted: bool
    softmax_scale: float
    v_feature_major: bool = True
    seq_len_kv: int | None = None  # k's and v's real length (None: seq_len); keys past: zeros
    # The padded length of q's tiles (None: q's own length, the codes are padded); set when q is
    # the caller's bf16, which the kernel reads unpadded.
    q_padded_len: int | None = None

    def __post_init__(self) -> None:
        if self.seq_len_kv is None:
            self.seq_len_kv = self.seq_len

    @property
    def q_in_kernel(self) -> bool:
        """q is bf16 for a kernel that quantizes it (block_scales.quantize_rows' formula per
        row); its part of `packed` is left unwritten."""
        return self.q.dtype != torch.float8_e4m3fn

    @property
    def scale_layout(self) -> PackedLayout:
        return PackedLayout(self.q.shape[0], self.q.shape[2], self.padded_len, self.k.shape[2],
                            self.padded_len_kv)

    @functools.cached_property
    def scales(self) -> BlockScales:
        """The descales as (batch, heads, seq_len) and (batch, kv_heads, blocks) views of
        `packed`, made on first use only (the launch needs the buffer alone, and every view
        costs host time on each call)."""
        scales = BlockScales.from_packed(self.packed, self.scale_layout, self.seq_len,
                                         self.seq_len_kv)
        if self.q_in_kernel:  # the kernel computes q's, by this formula
            scales.q = self.q_codes_and_descales()[1]
        return scales

    def q_codes_and_descales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """q's e4m3 codes (batch, seq_len, heads, head_dim) and descales (batch, heads, seq_len)
        as the kernel reads them: the stored codes, or for q_in_kernel the block-scale formula
        the kernel applies (for the reference and the gate; the launch needs neither)."""
        if self.q_in_kernel:
            codes, descale = block_scales.quantize_rows(self.q)
            return codes, descale.permute(0, 2, 1)
        return self.q[:, :self.seq_len], self.scales.q

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.q.shape[2] // self.k.shape[2]

    def v_codes(self, b: int, h: int) -> torch.Tensor:
        """V's fp8 codes of one (batch, KV head) as (head_dim, padded_len_kv), keys in natural
        order, whatever layout the kernel asked for (the reference and the metrics read V
        through it)."""
        if not self.v_feature_major:
            return self.v[b, :, h].t()
        return self.v[b, h][:, self.natural_key_slots()]

    @property
    def padded_len(self) -> int:
        return self.q.shape[1] if self.q_padded_len is None else self.q_padded_len

    @property
    def padded_len_kv(self) -> int:
        return self.k.shape[1]

    def padding(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The codes of q at rows >= seq_len and of k, v at keys >= seq_len_kv (fp32; zeros by
        contract, since a kernel that multiplies a masked P of 0 by a NaN code of V would still
        produce NaN)."""
        s, skv = self.seq_len, self.seq_len_kv
        v = self.v.float()
        v_pad = v[:, skv:] if not self.v_feature_major else \
            v[..., self.natural_key_slots()[skv:]]
        # A bf16 q is unpadded: the kernel reads no row past seq_len.
        return self.q[:, s:].float(), self.k[:, skv:].float(), v_pad

    def natural_key_slots(self) -> torch.Tensor:
        """The stored position of every key, in natural key order (feature-major V: the last
        axis of v indexed by this is in natural order)."""
        n = self.v.shape[-1]
        if self.key_permuted:
            return _inverse_key_order_on(n, self.v.device)
        return torch.arange(n, device=self.v.device)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 q (batch, seq_len, heads, head_dim), k and v (batch, seq_len_kv, kv_heads,
        head_dim) exactly as the kernel sees them."""
        s, skv = self.seq_len, self.seq_len_kv
        q_codes, q_descale = self.q_codes_and_descales()
        dq = q_descale[..., :s].permute(0, 2, 1)[..., None]  # (batch, seq_len, heads, 1)
        dk, dv = (self.scales.per_key(n)[:, :skv] for n in ("k", "v"))
        # In place after one fp32 copy each: at B=1 H=56 S=30272 a temporary is 0.9 GB.
        q = q_codes.float().mul_(dq)
        k = self.k[:, :skv].float().mul_(dk)
        if not self.v_feature_major:
            return q, k, self.v[:, :skv].float().mul_(dv)
        # The key gather on the 1-byte codes, then one fp32 copy.
        codes = self.v.view(torch.uint8)[..., self.natural_key_slots()[:skv]]
        v = codes.view(torch.float8_e4m3fn).float().permute(0, 3, 1, 2)
        return q, k, v.mul_(dv)


def check_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    require_cuda: bool = False,
    check_finite: bool = True,
) -> None:
    """Public-boundary validation of bf16/fp16 inputs: q (batch, seq_len, heads, head_dim), k and
    v (batch, seq_len_kv, kv_heads, head_dim) with kv_heads a divisor of heads; every message
    names the problem and the fix."""
    _check_tensors(q, k, v, require_cuda=require_cuda)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TunerError(
                f"{name} has dtype {t.dtype}; pass bfloat16 or float16 "
                f"(the kernels quantize to FP8 themselves), e.g. {name}.to(torch.bfloat16); "
                "e4m3 codes with their descales go to tuner.attention_fp8"
            )
    _check_shapes(q, k, v)
    if check_finite:
        check_finite_inputs(q, k, v)


def check_fp8_qkv(q, k, v, descales) -> None:
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
    _check_shapes(q, k, v)
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


def _check_shapes(q, k, v) -> None:
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
    if seq_len == 0 or batch == 0 or heads == 0 or seq_len_kv == 0 or kv_heads == 0:
        raise TunerError(
            f"empty input (batch={batch}, seq_len={seq_len}, heads={heads}, "
            f"seq_len_kv={seq_len_kv}, kv_heads={kv_heads}); "
            "attention over zero tokens or heads has no output: skip the call"
        )
    if kv_head_dim != head_dim:
        raise TunerError(
            f"q has head_dim {head_dim}, k and v {kv_head_dim}: q . k needs one head_dim (the "
            "kernels take v's equal to it too); zero-pad the shorter one"
        )
    if heads % kv_heads:
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
    if _capturing():
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise TunerError(
                f"{name} contains {bad} NaN/Inf values; FP8 scales from amax would be "
                "meaningless: fix the producer of the input (or nan_to_num it) first"
            )


def _capturing() -> bool:
    # is_initialized, not is_available: no capture runs before CUDA is initialized, and
    # is_available asks NVML (~10 us of host time per call on the H200's host).
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


@functools.lru_cache(maxsize=64)
def _key_order_on(length: int, device: torch.device) -> torch.Tensor:
    """The permutation index, built once per (length, device): a host-to-device copy inside a
    CUDA-graph capture would be illegal, so captured calls must find it cached."""
    return register_p_key_order(length).to(device)


@functools.lru_cache(maxsize=64)
def _inverse_key_order_on(length: int, device: torch.device) -> torch.Tensor:
    return inverse_key_order(length).to(device)


def _lay_out(natural: torch.Tensor, seq_len: int, *, feature_major: bool,
             permute_keys: bool) -> torch.Tensor:
    """Codes (batch, padded, heads, head_dim) with rows < seq_len written: zero the padding, then
    (feature_major) the transposing, key-permuting copy to (batch, heads, head_dim, padded)."""
    batch, padded, heads, head_dim = natural.shape
    if padded > seq_len:
        natural[:, seq_len:].view(torch.uint8).zero_()
    if not feature_major:
        return natural
    out = torch.empty((batch, heads, head_dim, padded), dtype=torch.float8_e4m3fn,
                      device=natural.device)
    codes = natural.view(torch.uint8).permute(0, 2, 3, 1)
    if permute_keys:
        codes = codes[..., _key_order_on(padded, codes.device)]
    out.view(torch.uint8).copy_(codes)
    return out


def _gpu_kernels_apply(q, k, v, padded: int, padded_kv: int, v_feature_major: bool) -> bool:
    """Whether prepare's GPU kernels take these inputs: contiguous, 16-byte aligned CUDA tensors
    whose padded outputs have 32-bit offsets, and, for feature-major V, padded_kv % 8 == 0 (8
    keys a store)."""
    if not q.is_cuda:
        return False
    for x, rows in ((q, padded), (k, padded_kv)):  # v has k's shape
        if x.numel() // x.shape[1] * rows >= 2**31:
            return False
    if v_feature_major and padded_kv % 8:
        return False
    return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (q, k, v))


@dataclass(frozen=True)
class _LayoutCopies:
    """The FP8 entry point's launchers of variants/layout_kernel.py: codes copied as they are
    into the layouts the kernel reads, q's and k's token-major, v's as asked."""

    qk: object
    v: object


def _layout_copies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padded: int,
                   padded_kv: int, *, v_feature_major: bool, permute_keys: bool):
    """_LayoutCopies for these e4m3 inputs, or None where they do not apply
    (_gpu_kernels_apply). Inside a CUDA-graph capture they are used only if compiled already
    (compiling loads a module, which a capture must not see); the torch path gives the same
    codes."""
    if not _gpu_kernels_apply(q, k, v, padded, padded_kv, v_feature_major):
        return None
    try:
        from variants import layout_kernel
    except ImportError:  # no CuTe DSL in this environment: torch ops
        return None
    now = not _capturing()
    copy_v = layout_kernel.compiled(q.shape[-1], q.device, feature_major=v_feature_major,
                                    permute_keys=permute_keys, compile_now=now)
    copy_qk = layout_kernel.compiled(q.shape[-1], q.device, compile_now=now)
    if copy_qk is None or copy_v is None:
        return None
    return _LayoutCopies(copy_qk, copy_v)


def _block_quant_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padded: int,
                        padded_kv: int, *, v_feature_major: bool, permute_keys: bool,
                        with_q: bool = True):
    """The one-pass launcher of variants/block_quantize_kernel.py for these inputs, or None
    where it does not apply (_gpu_kernels_apply). Inside a CUDA-graph capture only if compiled
    already (compiling loads a module, which a capture must not see); the torch formula gives
    the same codes."""
    if not _gpu_kernels_apply(q, k, v, padded, padded_kv, v_feature_major):
        return None
    try:
        from variants import block_quantize_kernel
    except ImportError:  # no CuTe DSL in this environment: torch ops
        return None
    return block_quantize_kernel.compiled("quant" if with_q else "quant_kv", k.dtype,
                                          q.shape[-1], q.device,
                                          v_feature_major=v_feature_major,
                                          permute_keys=permute_keys,
                                          compile_now=not _capturing())


def _block_quantize_on_gpu(launch, q, k, v, layout: PackedLayout, v_feature_major: bool,
                           with_q: bool = True):
    """(codes of q, k, v in the kernel's layouts, packed scales): one launch, three outputs
    and one scale buffer allocated (each allocation costs host time). with_q=False (a launcher
    without q's CTAs): q is returned as it came, and q's part of the scales is not written."""
    from variants.launch import current_stream_handle

    batch, seq_len, heads, head_dim = q.shape
    _, seq_len_kv, kv_heads, _ = k.shape
    device = q.device
    natural = (batch, layout.padded_len, heads, head_dim)
    natural_kv = (batch, layout.padded_len_kv, kv_heads, head_dim)
    v_shape = (batch, kv_heads, head_dim, layout.padded_len_kv) if v_feature_major \
        else natural_kv
    if not with_q:
        q8, k8 = q, torch.empty(natural_kv, dtype=torch.float8_e4m3fn, device=device)
    elif natural == natural_kv:
        q8, k8 = torch.empty((2, *natural), dtype=torch.float8_e4m3fn, device=device).unbind(0)
    else:
        q8, k8 = (torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
                  for shape in (natural, natural_kv))
    v8 = torch.empty(v_shape, dtype=torch.float8_e4m3fn, device=device)
    packed = torch.empty(layout.size, dtype=torch.float32, device=device)
    launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), q8.data_ptr(), k8.data_ptr(), v8.data_ptr(),
           packed.data_ptr(), batch, heads, kv_heads, seq_len, layout.padded_len, seq_len_kv,
           layout.padded_len_kv, current_stream_handle(device))
    return q8, k8, v8, packed


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def quantize_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    pad_to: int = 1,
    permute_keys: bool = False,
    softmax_scale: float | None = None,
    validate: bool = True,
    v_feature_major: bool = True,
    q_in_kernel: bool = False,
) -> Fp8Inputs:
    """Quantize and lay out q, k, v for the FP8 kernels, on the device the inputs live on.

    q is (batch, seq_len, heads, head_dim); k and v (batch, seq_len_kv, kv_heads, head_dim), with
    heads a multiple of kv_heads (grouped-query attention; equal shapes for self-attention).
    pad_to: zero-pad both lengths up to a multiple of this (the kernel's tile), so that every
    tile load is in bounds; kernels still mask keys and skip stores past the lengths.
    permute_keys: store V's keys in register_p_key_order (pad_to must then be a multiple of 16).
    v_feature_major: V as (batch, kv_heads, head_dim, padded_kv); False keeps (batch, padded_kv,
    kv_heads, head_dim) for a kernel that transposes V itself (no key permutation then).
    q_in_kernel: for a kernel that quantizes Q itself: q (bf16) is passed on as it is
    (contiguous), and only k and v are quantized.
    """
    if validate:
        check_qkv(q, k, v)
    batch, seq_len, heads, head_dim = q.shape
    seq_len_kv = k.shape[1]
    if softmax_scale is None:
        softmax_scale = head_dim**-0.5
    if permute_keys and not v_feature_major:
        raise ValueError("permute_keys applies to feature-major V only: a kernel that reads V in "
                         "its natural layout orders the keys itself")
    if permute_keys and pad_to % 16:
        raise ValueError(f"permute_keys needs pad_to to be a multiple of 16, got {pad_to}")
    padded, padded_kv = round_up(seq_len, pad_to), round_up(seq_len_kv, pad_to)

    layout = PackedLayout(batch, heads, padded, k.shape[2], padded_kv)
    q_padded_len = None
    if q_in_kernel:
        if q.dtype != torch.bfloat16:
            raise ValueError(f"q_in_kernel: the kernel reads bf16 q, got {q.dtype}; run the "
                             "config's for_q_dtype() twin, which quantizes q here")
        if not (q.is_contiguous() and q.data_ptr() % 16 == 0):
            q = q.contiguous()  # the kernel reads (batch, seq_len, heads, head_dim) rows
        q_padded_len = padded
    launch = _block_quant_kernel(q, k, v, padded, padded_kv, v_feature_major=v_feature_major,
                                 permute_keys=permute_keys, with_q=not q_in_kernel)
    if launch is not None:
        q8, k8, v8, packed = _block_quantize_on_gpu(launch, q, k, v, layout, v_feature_major,
                                                    with_q=not q_in_kernel)
        return Fp8Inputs(q=q8, k=k8, v=v8, packed=packed, seq_len=seq_len,
                         key_permuted=permute_keys, softmax_scale=float(softmax_scale),
                         v_feature_major=v_feature_major, seq_len_kv=seq_len_kv,
                         q_padded_len=q_padded_len)
    # Elsewhere (no GPU, no CuTe DSL, a strided input): the torch formula, the same codes.
    # (q_in_kernel: q's codes are computed too, and dropped; only its descales' place in the
    # packed buffer is used, with q's, which the kernel does not read.)
    codes, scales = block_scales.quantize(q, k, v)
    out = []
    for index, x8 in enumerate(codes):
        is_v = index == 2
        length, rows = (seq_len, padded) if index == 0 else (seq_len_kv, padded_kv)
        natural = torch.empty((batch, rows, x8.shape[2], head_dim), dtype=torch.float8_e4m3fn,
                              device=q.device)
        natural[:, :length].view(torch.uint8).copy_(x8.view(torch.uint8))
        out.append(_lay_out(natural, length, feature_major=is_v and v_feature_major,
                            permute_keys=is_v and permute_keys))
    q8, k8, v8 = out
    if q_in_kernel:
        q8 = q
    return Fp8Inputs(
        q=q8,
        k=k8,
        v=v8,
        packed=scales.packed(padded, padded_kv),
        seq_len=seq_len,
        key_permuted=permute_keys,
        softmax_scale=float(softmax_scale),
        v_feature_major=v_feature_major,
        seq_len_kv=seq_len_kv,
        q_padded_len=q_padded_len,
    )


def fp8_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    descales: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    pad_to: int = 1,
    permute_keys: bool = False,
    softmax_scale: float | None = None,
    v_feature_major: bool = True,
) -> Fp8Inputs:
    """Fp8Inputs from e4m3 codes the caller quantized (x ~= code * descale, per head or per
    token / 64-key block: check_fp8_qkv states both), checked by check_fp8_qkv: no
    quantization, only the layout the kernel reads. q
    and k are used as they are when contiguous and their length is a multiple of pad_to (else
    copied, zero-padded); V likewise for a kernel that reads it in the natural layout, else
    re-laid out feature-major (and key-permuted) in one pass over its codes."""
    from variants.launch import current_stream_handle

    batch, seq_len, heads, head_dim = q.shape
    seq_len_kv, kv_heads = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = head_dim**-0.5
    padded, padded_kv = round_up(seq_len, pad_to), round_up(seq_len_kv, pad_to)
    scale_layout = PackedLayout(batch, heads, padded, kv_heads, padded_kv)
    views = _descale_views(descales, batch, heads, kv_heads, seq_len, seq_len_kv)
    packed = _expand_scales(views, scale_layout, seq_len, seq_len_kv)
    if packed is None:  # no GPU kernel: the same values by torch ops
        tiny = TINY_AMAX * DESCALE_PER_AMAX  # as ExpandScales: a zero descale would give NaN
        packed = BlockScales(*(d.permute(0, 2, 1).clamp_min(tiny) for d in views)).packed(
            padded, padded_kv)
    as_is = padded == seq_len and padded_kv == seq_len_kv
    natural_v = as_is and not v_feature_major and v.is_contiguous()
    kernels = None
    if not (as_is and q.is_contiguous() and k.is_contiguous() and natural_v):
        kernels = _layout_copies(q, k, v, padded, padded_kv, v_feature_major=v_feature_major,
                                 permute_keys=permute_keys)
    out = []
    for index, x in enumerate((q, k, v)):
        is_v = index == 2
        feature_major = is_v and v_feature_major
        length, rows, x_heads = (seq_len, padded, heads) if index == 0 else \
            (seq_len_kv, padded_kv, kv_heads)
        if length == rows and x.is_contiguous() and not feature_major:
            out.append(x)
        elif kernels is not None:
            layout = torch.empty((batch, x_heads, head_dim, rows) if feature_major
                                 else (batch, rows, x_heads, head_dim),
                                 dtype=torch.float8_e4m3fn, device=x.device)
            copy = kernels.v if is_v else kernels.qk
            copy(x.data_ptr(), layout.data_ptr(), batch, length, rows, x_heads,
                 current_stream_handle(x.device))
            out.append(layout)
        else:
            natural = torch.empty((batch, rows, x_heads, head_dim), dtype=torch.float8_e4m3fn,
                                  device=x.device)
            natural[:, :length].view(torch.uint8).copy_(x.view(torch.uint8))
            out.append(_lay_out(natural, length, feature_major=feature_major,
                                permute_keys=is_v and permute_keys))
    q8, k8, v8 = out
    return Fp8Inputs(q=q8, k=k8, v=v8, packed=packed, seq_len=seq_len,
                     key_permuted=permute_keys, softmax_scale=float(softmax_scale),
                     v_feature_major=v_feature_major, seq_len_kv=seq_len_kv)


def _descale_views(descales, batch: int, heads: int, kv_heads: int, seq_len: int,
                   seq_len_kv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The caller's descales as q's (batch, seq_len, heads) and k's and v's (batch, blocks,
    kv_heads) views, a per-head descale broadcast (stride 0) over rows or blocks: no copy."""
    blocks = -(-seq_len_kv // KV_BLOCK)
    shapes = ((seq_len, heads), (blocks, kv_heads), (blocks, kv_heads))
    return tuple(d if d.dim() == 3 else d.expand(batch, h)[:, None, :].expand(batch, n, h)
                 for d, (n, h) in zip(descales, shapes, strict=True))


def _expand_scales(views, layout: PackedLayout, seq_len: int, seq_len_kv: int):
    """The packed block scales of the caller's descales by one GPU launch
    (block_quantize_kernel.ExpandScales: each read through its strides), or None where it does
    not apply (descales off the GPU, no CuTe DSL, inside a CUDA-graph capture before it
    compiled)."""
    if not all(d.is_cuda for d in views):
        return None
    try:
        from variants import block_quantize_kernel
        from variants.launch import current_stream_handle
    except ImportError:
        return None
    device = views[0].device
    launch = block_quantize_kernel.compiled("expand", torch.float32, 0, device,
                                            compile_now=not _capturing())
    if launch is None:
        return None
    packed = torch.empty(layout.size, dtype=torch.float32, device=device)
    dq, dk, dv = views
    launch(dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), packed.data_ptr(), layout.batch,
           layout.heads, layout.kv_heads, seq_len, layout.padded_len, seq_len_kv,
           layout.padded_len_kv, *dq.stride(), *dk.stride(), *dv.stride(),
           current_stream_handle(device))
    return packed
