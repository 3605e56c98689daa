"""The mma_sync kernel's main loop, one strip of block_n keys a step (_strip): the strip's
cp.async stage (Q and the first kv_stages - 1 strips in the prologue), S = Q K^T, the mask, the
online softmax (softmax.py), P into the A fragment (straight from the S registers, or through
shared memory), and O += P V (pv_accum=fp16: two-level, _pv_fp16). Every warp loads and
computes; a strip's stage is free again once every warp has left the strip before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute


@dataclass(frozen=True)
class StripCopies:
    """cp.async partitions of the tile's Q and of the K and V strips (stage last)."""

    g2s_qk: Any
    g2s_v: Any
    tQgQ: Any
    tQsQ: Any
    tKgK: Any
    tKsK: Any
    tVgV: Any
    tVsV: Any


@dataclass(frozen=True)
class MmaFragments:
    """A thread's MMA fragments, accumulators and the ldmatrix views that fill them."""

    tiled_mma: Any
    thr_mma: Any
    tSrQ: Any  # Q, the A operand of QK^T
    tSrK: Any  # K of one stage, the B operand of QK^T
    tOrV: Any  # V of one stage, the B operand of PV
    acc_S: Any
    acc_O: Any
    tOrP: Any  # P, the A operand of PV
    s2r_Q: Any
    s2r_K: Any
    s2r_V: Any
    tSsQ: Any
    tSrQ_view: Any
    tSsK: Any
    tSrK_view: Any
    tOsV: Any
    tOrV_view: Any
    tPrP: Any  # P rounded to e4m3 in C order
    p_dst: Any  # p_source=smem: (mt_i, r, n) -> the P tile's 2 bytes of that key pair
    s2r_P: Any  # p_source=smem: the ldmatrix read of P
    tOsP: Any
    tOrP_view: Any
    p_slots: Any  # p_source=registers: the A slot of each C-order key pair
    tScS: Any  # the (row, key) coordinate of each S value


class MainloopMixin:
    """MmaSyncAttention's strip loop (it provides the knobs read here)."""

    @cute.jit
    def _load_prologue(self, copies, frags, n_strips):
        """Q in its own cp.async group, then kv_stages - 1 strips ahead; Q into registers
        (q_in_registers) once it has landed."""
        stages = self.stages
        cute.copy(copies.g2s_qk, copies.tQgQ, copies.tQsQ)
        cute.arch.cp_async_commit_group()
        for s in cutlass.range_constexpr(stages - 1):
            if s < n_strips:
                cute.copy(copies.g2s_qk, copies.tKgK[None, None, None, s],
                          copies.tKsK[None, None, None, s])
                cute.copy(copies.g2s_v, copies.tVgV[None, None, None, s],
                          copies.tVsV[None, None, None, s])
            cute.arch.cp_async_commit_group()
        if cutlass.const_expr(self.q_in_registers):
            cute.arch.cp_async_wait_group(stages - 1)
            cute.arch.sync_threads()
            cute.copy(frags.s2r_Q, frags.tSsQ, frags.tSrQ_view)

    @cute.jit
    def _strip(self, strip, n_strips, copies, frags, mask, softmax, mScales, batch, kv_head):
        """One step of the main loop: strip `strip` from its stage to O."""
        stage = self._load_strip(strip, n_strips, copies)
        self._qk(frags, stage)
        if mask.needs_mask(strip):
            mask.apply(frags.acc_S, strip)
        softmax.online(frags.acc_S, frags.acc_O, strip, mScales, batch, kv_head)
        self._p_to_a(frags)
        self._pv(frags, stage)
        if cutlass.const_expr(self.stages == 1):
            cute.arch.sync_threads()

    @cute.jit
    def _load_strip(self, strip, n_strips, copies):
        """Strip `strip` in shared memory, strip + kv_stages - 1 on its way; returns its stage.
        One stage: this strip's copy, waited on at once."""
        stages = self.stages
        if cutlass.const_expr(stages == 1):
            cute.copy(copies.g2s_qk, copies.tKgK[None, None, None, strip],
                      copies.tKsK[None, None, None, 0])
            cute.copy(copies.g2s_v, copies.tVgV[None, None, None, strip],
                      copies.tVsV[None, None, None, 0])
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()
            stage = 0
        else:
            # Strip `strip` landed; the barrier also proves every warp left strip - 1, so its
            # stage is free for strip + stages - 1.
            cute.arch.cp_async_wait_group(stages - 2)
            cute.arch.sync_threads()
            ahead = strip + stages - 1
            if ahead < n_strips:
                cute.copy(copies.g2s_qk, copies.tKgK[None, None, None, ahead],
                          copies.tKsK[None, None, None, ahead % stages])
                cute.copy(copies.g2s_v, copies.tVgV[None, None, None, ahead],
                          copies.tVsV[None, None, None, ahead % stages])
            cute.arch.cp_async_commit_group()
            stage = strip % stages
        return stage

    @cute.jit
    def _qk(self, frags, stage):
        """S = Q K^T of the strip in `stage`, k-block by k-block from ldmatrix."""
        frags.acc_S.fill(0.0)
        for kb in cutlass.range_constexpr(self.head_dim // 32):
            if cutlass.const_expr(not self.q_in_registers):
                cute.copy(frags.s2r_Q, frags.tSsQ[None, None, kb], frags.tSrQ_view[None, None, kb])
            cute.copy(frags.s2r_K, frags.tSsK[None, None, kb, stage],
                      frags.tSrK_view[None, None, kb])
            self._mma(frags.tiled_mma, frags.acc_S, frags.tSrQ[None, None, kb],
                      frags.tSrK[None, None, kb])

    @cute.jit
    def _p_to_a(self, frags):
        """P rounded to e4m3, into the A fragment: by register moves (register P: V's keys
        stored in the matching order, layouts.register_p_slots), or through the P tile."""
        fp8 = cutlass.Float8E4M3FN
        if cutlass.const_expr(self.register_p):
            frags.tPrP.store(frags.acc_S.load().to(fp8))
            src16 = cute.recast_tensor(frags.tPrP, cutlass.Int16)
            dst16 = cute.recast_tensor(frags.tOrP, cutlass.Int16)
            for i in cutlass.range_constexpr(cute.size(src16)):
                dst16[frags.p_slots[i]] = src16[i]
        else:
            frags.tPrP.store(frags.acc_S.load().to(fp8))
            # Key pairs (2t, 2t+1) stay adjacent under every swizzle: one 16-bit store each.
            for mt_i in cutlass.range_constexpr(self.m_tiles):
                for r in cutlass.range_constexpr(2):
                    for n in cutlass.range_constexpr(self.block_n // 8):
                        cute.autovec_copy(frags.tPrP[(None, r), mt_i, n],
                                          frags.p_dst(mt_i, r, n))
            # A warp reads back only the P rows it wrote: a warp barrier is enough.
            cute.arch.sync_warp()

    @cute.jit
    def _pv(self, frags, stage):
        """O += P V of the strip in `stage`."""
        if cutlass.const_expr(self.pv_fp16):
            if cutlass.const_expr(not self.register_p):
                cute.copy(frags.s2r_P, frags.tOsP, frags.tOrP_view)
            self._pv_fp16(frags.acc_O, frags.tOrP, frags.tOrV, frags.tOrV_view, frags.s2r_V,
                          frags.tOsV, stage)
        else:
            for kb in cutlass.range_constexpr(self.block_n // 32):
                if cutlass.const_expr(not self.register_p):
                    cute.copy(frags.s2r_P, frags.tOsP[None, None, kb],
                              frags.tOrP_view[None, None, kb])
                cute.copy(frags.s2r_V, frags.tOsV[None, None, kb, stage],
                          frags.tOrV_view[None, None, kb])
                self._mma(frags.tiled_mma, frags.acc_O, frags.tOrP[None, None, kb],
                          frags.tOrV[None, None, kb])

    def _pv_fp16(self, acc_O, tOrP, tOrV, tOrV_view, s2r_V, tOsV, stage):
        """O += P V of one strip, two-level: the strip's sum over its block_n keys in a fresh
        f16 accumulator (f16-accumulate MMAs, full rate on GeForce Blackwell), then added into
        the fp32 O, which the softmax has already rescaled. The f16 accumulator covers 16 of
        the head_dim columns at a time (the two n8 tiles one ldmatrix.x4 of V fills: copy c of
        tOrV_view is n-tiles 2c and 2c+1 of tOrV), so it costs 4 registers per m16 tile instead
        of head_dim / 4; every V element is still loaded once per strip. p_shift_log2 keeps
        the strip sum finite in fp16 (config.py derives it; docs/family-mma_sync.md bounds the
        error it adds).
        """
        tiled_mma = self._tiled_mma_pv16()
        thr_mma = tiled_mma.get_slice(cute.arch.thread_idx()[0])
        acc16 = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.block_m, 16)), cutlass.Float16)
        for c in range(self.head_dim // 16):
            acc16.fill(0.0)
            for kb in range(self.block_n // 32):
                cute.copy(s2r_V, tOsV[None, c, kb, stage], tOrV_view[None, c, kb])
                # (V, 2): n-tiles 2c and 2c + 1 of this k-block.
                v_pair = cute.logical_divide(tOrV[None, None, kb], (None, 2))[None, (None, c)]
                cute.gemm(tiled_mma, acc16, tOrP[None, None, kb], v_pair, acc16)
            for j in range(2):
                o = acc_O[None, None, 2 * c + j]
                o.store(o.load() + acc16[None, None, j].load().to(cutlass.Float32))

    def _mma(self, tiled_mma, acc, a, b):
        if cutlass.const_expr(self.mxf8):
            # Unit UE8M0 scales (127 = 2^0): the block-scaled instruction computes plain A @ B.
            cute.gemm(tiled_mma, acc, [a, _unit_scales(a)], [b, _unit_scales(b)], acc)
        else:
            cute.gemm(tiled_mma, acc, a, b, acc)


def _unit_scales(operand):
    """One UE8M0 scale of 1.0 per MMA of `operand` (scale_vec::1X: one per 32-wide k-block)."""
    sf = cute.make_rmem_tensor(((1,),) + tuple(operand.shape[1:]), cutlass.Float8E8M0FNU)
    cute.recast_tensor(sf, cutlass.Uint8).fill(127)
    return sf
