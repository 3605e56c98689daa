"""The wgmma kernel's shared memory, built on the host side: the swizzled tile layouts and the
CTA's storage struct (barriers, the block scales' slots, the tiles), checked against
config.smem_bytes, which the launch path and can_implement use."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from variants.wgmma.config import smem_bytes
from variants.wgmma.qk8 import qk_operand


class SharedMemoryMixin:
    """Host-side layout helpers of WgmmaAttention (which provides the knobs they read)."""

    @staticmethod
    def _smem_layout(rows: int, cols: int, stages: int | None, dtype=cutlass.Float8E4M3FN):
        """K-major (cols contiguous) tile with the widest wgmma swizzle `cols` allows (fp8 or
        int8; bf16 for the staged Q of q_quant=kernel)."""
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype)
        if stages is None:
            return cute.tile_to_shape(atom, (rows, cols), (0, 1))
        return cute.tile_to_shape(atom, (rows, cols, stages), (0, 1, 2))

    def _shared_storage(self, sQ_layout, sK_layout, sV_layout, sP_layout, sQraw_layout):
        """The CTA's shared memory as a cute.struct: barriers and the block scales' slots, then
        the tiles; v_layout=kernel adds the V staging ring and its barriers, q_quant=kernel the
        bf16 Q staging tile, pv_dtype=bf16 makes the V ring and the P tile bf16, qk_dtype=int8
        the Q tile and the K ring int8 (config.smem_bytes counts the same fields). Built from a
        field dict because this module's annotations are strings (`from __future__ import
        annotations`), which cute.struct does not evaluate."""
        fp8 = cutlass.Float8E4M3FN
        stages = self.stages

        def buffer(elems, dtype=fp8):
            return cute.struct.Align[cute.struct.MemRange[dtype, elems], 1024]

        pv = cutlass.BFloat16 if self.pv16 else fp8

        fields = {
            "mbar_q": cute.struct.MemRange[cutlass.Int64, 2],
            "mbar_k": cute.struct.MemRange[cutlass.Int64, 2 * stages],
            "mbar_v": cute.struct.MemRange[cutlass.Int64, 2 * stages],
        }
        if self.v_in_kernel:
            fields["mbar_vraw"] = cute.struct.MemRange[cutlass.Int64, 2 * stages]
        # Each strip's K/V block scales beside its stage, each tile's Q row scales (smem_bytes
        # counts them in the header below the first 1024-aligned buffer).
        fields["mbar_scales"] = cute.struct.MemRange[cutlass.Int64, 2 * stages]
        if not self.q_in_kernel:
            fields["mbar_q_scales"] = cute.struct.MemRange[cutlass.Int64, 2]
        fields["kv_scales"] = cute.struct.MemRange[cutlass.Float32, 3 * self.scale_blocks * stages]
        if not self.q_in_kernel:
            # kv_scales=head: 1 / V's descale after the rows (K's is folded into them).
            fields["q_scales"] = cute.struct.MemRange[
                cutlass.Float32, self.block_m + (1 if self.kv_head_scales else 0)]
        qk = qk_operand(self.qk_int8)
        fields["q"] = buffer(cute.cosize(sQ_layout), qk)
        fields["k"] = buffer(cute.cosize(sK_layout), qk)
        fields["v"] = buffer(cute.cosize(sV_layout), pv)
        if self.v_in_kernel:
            fields["vraw"] = buffer(cute.cosize(sK_layout))
        fields["p"] = buffer(1 if self.register_p else cute.cosize(sP_layout), pv)
        if self.q_in_kernel:  # the caller's bf16 Q tile, as TMA loads it
            fields["qraw"] = cute.struct.Align[
                cute.struct.MemRange[cutlass.BFloat16, cute.cosize(sQraw_layout)], 1024]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def _check_smem_estimate(self, storage_type) -> None:
        """At trace time: the direct launch path (variants/launch.py) and can_implement use
        config.smem_bytes, which must cover what this kernel allocates."""
        size, estimate = storage_type.size_in_bytes(), smem_bytes(self.cfg, self.head_dim)
        if size > estimate:
            raise AssertionError(f"shared storage of {size} bytes, config.smem_bytes says "
                                 f"{estimate}: count the new fields there")
