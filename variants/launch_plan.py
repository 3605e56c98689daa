"""LaunchPlan: a compiled kernel's device work for one signature (q, k, v shapes, dtype and
device), everything a call does not change decided once.

CompiledKernel.prepare + run decide on every call what the shapes decide already: the padded
lengths, the scale layout, the quantization launcher, the build that launches (split_tail's
single launch), the workspace, the launch scalars; and they check the prepared inputs against the
kernel. A LaunchPlan takes all of that from a first call's prepared inputs. A call then allocates
one scratch block (codes, packed scales, K smoothing's m and q . m, split_tail's workspace, and
the LSE when the caller drops it) and the outputs, and makes the launches prepare and run make,
with the same arguments: K smoothing's mean kernel, the quantization and the kernel (split_tail's
two programs zero their own counters); K smoothing's LSE shift where the caller reads the LSE
(only then does the quantization compute q . m, in a build of its own). The
quantization reads views in place where their rows allow it (input_layout.row_strides: SDPA's
(batch, heads, seq_len, head_dim) layout viewed back, say); a view it cannot read (rows not
contiguous), or a q or v the attention kernel reads raw, is copied contiguous first. A call
whose inputs are misaligned gets None: the caller takes
prepare + run. The plan keeps the row strides of the last views it read in place: a repeated
call on views of that layout compares their strides and checks their alignment, no more.
heads_first does the same for the SDPA drop-in's (batch, heads, seq_len, head_dim) tensors,
making their transposes only for a layout it has not read in place yet, and allocates the
output in SDPA's layout. A
pv_dtype=bf16 kernel reads the caller's bf16 V: its plan quantizes q and k only and hands the
kernel v's own pointer (prepare + run pass it on likewise); fp16 inputs, whose V prepare casts
to bf16 first, take prepare + run. A
qk_dtype=int8 kernel's plan has the quantization write int8 q and k codes (as many bytes).

tests/test_call_plans.py compares the launches' arguments with prepare + run's on the CPU
(benchmarks/host_stub.py stands the device in), tests/gpu/test_runtime_gpu.py the output bits.
"""

from __future__ import annotations

import torch

from variants.common.abi import SCALE_AT, launch_scalars
from variants.fp8_inputs import q_dot, round_up
from variants.input_layout import capturing, contiguous_row_strides, row_strides
from variants.key_mean_kernel import launch_scalars as mean_scalars
from variants.launch import stream_query
from variants.prepare import mean_launcher, quant_launcher, quant_scalars

# Bytes between the parts of the scratch block: the kernels' 16-byte vector and TMA loads need
# 16; 256 keeps each part on its own cache lines and sectors, as separate allocations were.
ALIGN = 256


class LaunchPlan:
    """`plan(q, k, v, softmax_scale, want_lse, keep_lse)` -> (out, lse or None), or None where
    this call's inputs need prepare's torch path. want_lse: add K smoothing's shift to the LSE;
    keep_lse: return the LSE (else it is written into the scratch block and dropped)."""

    __slots__ = ("_attend", "_device", "_head", "_index", "_k8", "_lse", "_lse_shape", "_mean",
                 "_mean_launch", "_mean_scalars", "_mean_shape", "_out_shape", "_packed", "_q8",
                 "_quant", "_quant_scalars", "_raw_q", "_raw_v", "_sdpa_out", "_sdpa_read",
                 "_shift", "_shift_build", "_shift_quant", "_stream", "_strides", "_tail", "_v8",
                 "_view_read", "_workspace",
                 "default_scale", "scratch_bytes")

    @classmethod
    def make(cls, kernel, prepared, q, k) -> LaunchPlan | None:
        """The plan of `kernel` (a CompiledKernel) for calls shaped like q and k, from the
        inputs its prepare made of them (whatever path it took); None where prepare's GPU
        kernel does not take these shapes or is unavailable."""
        config = kernel.config
        v16 = config.v_unquantized
        if v16 and k.dtype != torch.bfloat16:  # prepare casts an fp16 v: a copy per call
            return None
        if config.kv_head_scales:  # prepare's one launch writes block scales
            return None
        feature_major, permuted = kernel._v_layout()
        with_q = not config.q_in_kernel
        smooth = config.k_smoothing == "mean"
        layout = prepared.scale_layout
        rotate = config.qk_rotation == "hadamard"
        quant = quant_launcher(q, k, k, layout.padded_len, layout.padded_len_kv,
                               v_feature_major=feature_major, permute_keys=permuted,
                               with_q=with_q, smooth_k=smooth, rotate_qk=rotate, with_v=not v16,
                               check_inputs=False, qk_int8=config.qk_int8, write_shift=False)
        mean = mean_launcher(k) if smooth and quant is not None else None
        if quant is None or (smooth and mean is None):
            return None
        target = kernel.kernel_for(prepared)
        device = q.device
        attend, extra = target._launcher(device)
        words = target._workspace_words(device, prepared)
        batch, seq_len, heads, head_dim = q.shape
        lse_bytes = 4 * batch * heads * seq_len
        kv_bytes = batch * layout.padded_len_kv * k.shape[2] * head_dim
        plan = cls()
        at, end = {}, 0
        for name, size in (("q8", batch * layout.padded_len * heads * head_dim if with_q else 0),
                           ("k8", kv_bytes), ("v8", 0 if v16 else kv_bytes),
                           ("packed", 4 * layout.size),
                           ("mean", 4 * batch * k.shape[2] * head_dim if smooth else 0),
                           ("shift", lse_bytes if smooth and with_q else 0),
                           ("workspace", 4 * words), ("lse", lse_bytes)):
            at[name] = round_up(end, ALIGN) if size else None
            end = at[name] + size if size else end
        plan.scratch_bytes = end
        plan._q8, plan._k8, plan._v8, plan._packed = at["q8"], at["k8"], at["v8"], at["packed"]
        plan._mean, plan._shift = at["mean"], at["shift"]
        plan._workspace, plan._lse = at["workspace"], at["lse"]
        scalars = launch_scalars(prepared)
        # The scale a call without softmax_scale gets (quantize_inputs' default).
        plan.default_scale = float(head_dim**-0.5)
        plan._head, plan._tail = scalars[:SCALE_AT], (*scalars[SCALE_AT + 1:], *extra)
        plan._quant, plan._attend = quant, attend
        # The same quantization writing q . m as well (block_quantize_kernel.compiled's key).
        plan._shift_quant = None
        plan._shift_build = dict(name="quant", in_dtype=k.dtype, head_dim=head_dim,
                                 device=device, v_feature_major=feature_major,
                                 permute_keys=permuted, smooth_k=True, rotate_qk=rotate,
                                 quantize_v=not v16, qk_int8=config.qk_int8)
        plan._quant_scalars = quant_scalars(q.shape, k.shape, layout)
        plan._strides = (*contiguous_row_strides(q.shape), *contiguous_row_strides(k.shape),
                         *contiguous_row_strides(k.shape))
        # The attention kernel reads these inputs' rows itself, contiguous only.
        plan._raw_q, plan._raw_v = not with_q, v16
        plan._mean_launch, plan._mean_scalars = mean, mean_scalars(k.shape) if smooth else ()
        plan._mean_shape = (batch, k.shape[2], head_dim)
        plan._device, plan._index, plan._stream = device, device.index, stream_query()
        plan._out_shape, plan._lse_shape = tuple(q.shape), (batch, heads, seq_len)
        # (strides of the last views read in place, their row strides): one attribute, so
        # that no thread pairs one layout with another's rows.
        plan._view_read = plan._sdpa_read = (None, None)
        # heads_first's output: SDPA's shape over the kernels' layout, which the kernel writes.
        plan._sdpa_out = ((batch, heads, seq_len, head_dim),
                          (seq_len * heads * head_dim, head_dim, heads * head_dim, 1))
        return plan

    def parts(self) -> dict[str, int | None]:
        """Byte offset of each part of the scratch block (None: not in it)."""
        return {name: getattr(self, f"_{name}") for name in
                ("q8", "k8", "v8", "packed", "mean", "shift", "workspace", "lse")}

    def _quant_writing_shift(self):
        """The quantization that also writes q . m, looked up on the first call that reads the
        LSE (the first call's prepare built it); None inside a CUDA-graph capture where it was
        never built (the call then takes q_dot)."""
        from variants import block_quantize_kernel

        self._shift_quant = block_quantize_kernel.compiled(**self._shift_build,
                                                           compile_now=not capturing())
        return self._shift_quant

    def __call__(self, q, k, v, softmax_scale, want_lse: bool, keep_lse: bool):
        if q.is_contiguous() and k.is_contiguous() and v.is_contiguous():
            qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
            if (qp | kp | vp) & 15:
                return None
            strides = self._strides
        else:  # views: the quantization reads them in place (SDPA's layout, say)
            read = self._read_views(q, k, v)
            if read is None:
                return None
            q, k, v, strides = read
            qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        out = torch.empty(self._out_shape, dtype=torch.bfloat16, device=self._device)
        return self._launch(q, qp, kp, vp, strides, out, softmax_scale, want_lse, keep_lse)

    def heads_first(self, query, key, value, softmax_scale):
        """The call on SDPA's (batch, heads, seq_len, head_dim) tensors, whose (1, 2) transposes
        are the (batch, seq_len, heads, head_dim) inputs this plan takes: the bf16 output in
        SDPA's layout (a view of the kernels'), the LSE dropped; None where the plan does not
        take them. The first call of a layout reads its transposes; once they were read in place,
        later calls of that layout skip the transposes and the reading (~2 us each)."""
        layout = (query.stride(), key.stride(), value.stride())
        qp, kp, vp = query.data_ptr(), key.data_ptr(), value.data_ptr()
        known, rows = self._sdpa_read
        if layout == known and not (qp | kp | vp) & 15:
            q, strides = query, rows
        else:
            views = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
            read = self._read_views(*views)
            if read is None:
                return None
            q, k, v, strides = read
            if q is views[0] and k is views[1] and v is views[2]:  # read in place
                self._sdpa_read = layout, strides
            qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        out = torch.empty_strided(self._sdpa_out[0], self._sdpa_out[1], dtype=torch.bfloat16,
                                  device=self._device)
        return self._launch(q, qp, kp, vp, strides, out, softmax_scale, False, False)[0]

    def _read_views(self, q, k, v):
        """(q, k, v as the launches read them, their row strides), or None where prepare's torch
        path must run (misaligned, or offsets past 32 bits). Any layout; __call__ takes the
        contiguous one itself."""
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        layout = (q.stride(), k.stride(), v.stride())
        known, rows = self._view_read
        if layout == known and not (qp | kp | vp) & 15:
            return q, k, v, rows  # the layout of the last views read in place
        read = (_as_read(q, self._raw_q), _as_read(k, False), _as_read(v, self._raw_v))
        (q2, q_rows), (k2, k_rows), (v2, v_rows) = read
        if q_rows is None or k_rows is None or v_rows is None:
            return None
        strides = (*q_rows, *k_rows, *v_rows)
        # Read in place (nothing copied): every view of these strides has these rows.
        if q2 is q and k2 is k and v2 is v:
            self._view_read = layout, strides
        return q2, k2, v2, strides

    def _launch(self, q, qp, kp, vp, strides, out, softmax_scale, want_lse: bool,
                keep_lse: bool):
        """The launches on the inputs at qp, kp, vp (their row strides), into `out`; q for
        K smoothing's q . m where the quantization did not write it."""
        if softmax_scale is None:
            scale = self.default_scale
        else:
            scale = float(softmax_scale)
            if not scale > 0:
                raise ValueError("softmax_scale must be > 0")
        device = self._device
        scratch = torch.empty(self.scratch_bytes, dtype=torch.uint8, device=device)
        base = scratch.data_ptr()
        if keep_lse:
            lse = torch.empty(self._lse_shape, dtype=torch.float32, device=device)
            lse_ptr = lse.data_ptr()
        else:
            lse, lse_ptr = None, base + self._lse
        stream = self._stream(self._index)
        q8 = qp if self._q8 is None else base + self._q8
        k8, packed = base + self._k8, base + self._packed
        v8 = vp if self._v8 is None else base + self._v8  # bf16 P.V reads the caller's v
        mean = 0 if self._mean is None else base + self._mean
        quant, shift = self._quant, 0
        if keep_lse and want_lse and self._shift is not None:  # the LSE needs q . m
            with_shift = self._shift_quant or self._quant_writing_shift()
            if with_shift is not None:
                quant, shift = with_shift, base + self._shift
        if self._mean is not None:  # K smoothing's vector, as prepare's GPU path computes it
            self._mean_launch(kp, mean, *self._mean_scalars, *strides[3:6], stream)
        quant(qp, kp, vp, q8, k8, 0 if self._v8 is None else v8, packed, mean, shift,
              *self._quant_scalars, *strides, stream)
        self._attend(q8, k8, v8, packed, out.data_ptr(), lse_ptr,
                     0 if self._workspace is None else base + self._workspace, *self._head,
                     scale, *self._tail, stream)
        if want_lse and lse is not None and self._mean is not None:
            if shift:
                q_dot_m = _part(scratch, self._shift, self._lse_shape)
            else:  # the quantization did not read q (CompiledKernel.run's restore_lse)
                q_dot_m = q_dot(q, _part(scratch, self._mean, self._mean_shape))
            lse.add_(q_dot_m, alpha=scale)
        return out, lse


def _as_read(x: torch.Tensor, raw: bool):
    """(x as the launches read it, its row_strides or None): a view in place where the
    quantization can read its rows and the attention kernel does not read it raw (q it
    quantizes, a bf16 v); else a contiguous copy, which costs less than prepare's torch formula
    (about 3x the quantization's time)."""
    if not x.is_contiguous():
        rows = None if raw else row_strides(x)
        if rows is not None:
            return x, rows
        x = x.contiguous()
    return x, row_strides(x)


def _part(scratch: torch.Tensor, at: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The fp32 tensor of `shape` at byte `at` of the scratch block."""
    size = 4 * int(torch.Size(shape).numel())
    return scratch[at:at + size].view(torch.float32).view(shape)
