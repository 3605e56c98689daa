"""cuDNN's FP8 attention (cudnn-frontend `sdpa_fp8`) as a timed peer.

cuDNN takes per-tensor descales (one scalar per tensor, not per head) and, on sm_90, writes the
output in FP8 only; both make its job slightly easier than ours (no per-head scale loads, half
the output bytes), which is worth knowing when reading a ratio against it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import peer_module
from variants.block_scales import E4M3_MAX

# P in [0, 1] is scaled into e4m3's range before it is rounded, as our kernels do with 256.
P_SCALE = 256.0


@dataclass
class _CudnnInputs:
    variant_pack: dict
    workspace: object
    graph: object
    out: object


class CudnnFp8Peer:
    name = "cudnn-fp8"

    def __init__(self, causal: bool = False) -> None:
        self._causal = causal
        cudnn = peer_module(
            "cudnn", "cudnn-frontend is not installed (pip install nvidia-cudnn-frontend)")
        self._cudnn = cudnn
        self._handle = cudnn.create_handle()
        self._graphs: dict[tuple, tuple] = {}

    def _graph(self, shape_bshd: tuple, kv_shape_bshd: tuple, scale: float):
        """Build (once per shape) the graph for q (and k, v at their own length and KV heads)
        in (batch, seq, heads, dim) memory order."""
        key = (shape_bshd, kv_shape_bshd, scale)
        if key in self._graphs:
            return self._graphs[key]
        cudnn = self._cudnn

        def bhsd(shape):
            batch, seq, heads, dim = shape
            # a BSHD buffer seen as BHSD
            return (batch, heads, seq, dim), (seq * heads * dim, dim, heads * dim, 1)

        dims, strides = bhsd(shape_bshd)
        kv_dims, kv_strides = bhsd(kv_shape_bshd)
        e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        graph = cudnn.pygraph(
            io_data_type=e4m3,
            intermediate_data_type=fp32,
            compute_data_type=fp32,
            handle=self._handle,
        )
        q = graph.tensor(name="q", dim=dims, stride=strides, data_type=e4m3)
        k, v = (graph.tensor(name=n, dim=kv_dims, stride=kv_strides, data_type=e4m3)
                for n in "kv")
        scalars = {
            n: graph.tensor(name=n, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
            for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
        }
        o, _, amax_s, amax_o = graph.sdpa_fp8(
            q=q, k=k, v=v, **scalars, attn_scale=scale, use_causal_mask=self._causal,
            generate_stats=False
        )
        o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        self._graphs[key] = (graph, q, k, v, scalars, o, amax_s, amax_o)
        return self._graphs[key]

    def prepare(self, q, k, v, softmax_scale: float | None = None, *,
                validate: bool = True) -> _CudnnInputs:
        # validate: the Kernel protocol's; a peer makes no input checks of its own.
        import torch

        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        graph, tq, tk, tv, scalars, to, t_amax_s, t_amax_o = self._graph(
            tuple(q.shape), tuple(k.shape), scale)

        def quantize(x):
            amax = x.abs().amax().float().clamp_min(1e-12)
            return (x.float() * (E4M3_MAX / amax)).to(torch.float8_e4m3fn), amax / E4M3_MAX

        (q8, dq), (k8, dk), (v8, dv) = quantize(q), quantize(k), quantize(v)
        one = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=q.device)
        out = torch.empty_like(q8)
        values = {
            "descale_q": dq.reshape(1, 1, 1, 1),
            "descale_k": dk.reshape(1, 1, 1, 1),
            "descale_v": dv.reshape(1, 1, 1, 1),
            "descale_s": one / P_SCALE,
            "scale_s": one * P_SCALE,
            # Output magnitude is bounded by max|v|: map that onto e4m3's range.
            "scale_o": (E4M3_MAX / (dv * E4M3_MAX)).reshape(1, 1, 1, 1),
        }
        pack = {
            tq: q8,
            tk: k8,
            tv: v8,
            to: out,
            t_amax_s: torch.empty_like(one),
            t_amax_o: torch.empty_like(one),
        }
        pack.update({scalars[n]: t.contiguous() for n, t in values.items()})
        workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=q.device)
        return _CudnnInputs(pack, workspace, graph, out)

    def run(self, prepared: _CudnnInputs, out=None, lse=None, *, want_lse=True):
        import torch

        self._cudnn.set_stream(handle=self._handle, stream=torch.cuda.current_stream().cuda_stream)
        prepared.graph.execute(prepared.variant_pack, prepared.workspace, handle=self._handle)
        return prepared.out, lse
