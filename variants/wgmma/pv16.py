"""pv_dtype=bf16: the P.V GEMM as a bf16 wgmma (m64 n<head_dim> k16, f32 accumulator) on the
caller's unquantized V. Host-side views and layouts, and P's conversion in the consumers.

V stays in its natural layout (batch, seq_len_kv, kv_heads, head_dim): a 16-bit wgmma's B
operand may be MN-major (head_dim contiguous, the transpose bit of its descriptor), so TMA loads
(head_dim, block_n) boxes of it into an MN-major swizzled ring, no transpose anywhere. The view
has V's real length: TMA fills the keys past it with zeros (prepare_v16.py). P from registers:
the f32 accumulator of S gives thread (warp w, lane l) rows 16w + l/4 (+8) and keys 8j + 2(l%4)
+ {0,1}, which is per 16 keys the A fragment of a k16 16-bit wgmma in the same register order,
so P is S converted in place of order (no key permutation, unlike e4m3's k32 fragment:
fragments.p_views). P from shared memory: a K-major bf16 tile.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum

from variants.wgmma.config import ROWS_PER_WG

PV16 = cutlass.BFloat16


def v16_view(v_ptr, batch, seq_len_kv, kv_heads, head_dim: int):
    """The caller's V as (head_dim, seq_len_kv, kv_heads, batch), head_dim contiguous."""
    layout = cute.make_ordered_layout((batch, seq_len_kv, kv_heads, head_dim), order=(3, 2, 1, 0))
    return cute.make_tensor(v_ptr, cute.select(layout, mode=[3, 1, 2, 0]))


def v16_smem_layout(head_dim: int, block_n: int, stages: int):
    """The V ring: (head_dim, block_n, stages), head_dim contiguous (MN-major B) under the
    widest swizzle (128 B: 64 bf16 features a row)."""
    return sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (ROWS_PER_WG, head_dim, block_n),
                                         PV16, stages)


def p16_smem_layout(block_m: int, block_n: int):
    """p_source=smem: the P tile (block_m, block_n), keys contiguous (K-major A)."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, PV16, block_n), PV16)
    return cute.tile_to_shape(atom, (block_m, block_n), (0, 1))


def pv16_tiled_mma(wgs: int, head_dim: int, register_p: bool):
    """bf16 x bf16 -> f32, P K-major (registers or smem), V MN-major."""
    return sm90_utils.make_trivial_tiled_mma(
        PV16, PV16, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32, (wgs, 1, 1),
        (ROWS_PER_WG, head_dim),
        warpgroup.OperandSource.RMEM if register_p else warpgroup.OperandSource.SMEM)


def p16_as_acc(dst, acc_layout):
    """P's bf16 registers `dst` (the A fragment, or for p_source=smem the C-order staging
    fragment) seen with the accumulator's layout: C value r lands in the A value of its own row
    and key (tests/test_wgmma_pv16_compile.py replays it on the DSL's layouts)."""
    return cute.make_tensor(dst.iterator, acc_layout)


@cute.jit
def store_p16(acc_S, dst):
    """S's f32 accumulator, softmaxed, into P's bf16 registers, converted in order."""
    p16_as_acc(dst, acc_S.layout).store(acc_S.load().to(PV16))
