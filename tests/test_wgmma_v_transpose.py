"""wgmma v_layout=kernel, CPU only: the producer's in-smem V transpose, address by address.

The transposing warps copy each V strip from the staging ring (block_n keys x head_dim, laid out
like K) into the V ring the PV wgmma reads (head_dim x block_n, keys contiguous), applying the
register-P key order when P comes from registers: per warp step one ldmatrix.x4.trans, 4 byte
permutes, one stmatrix.x4. Here a host-side @cute.jit function runs the kernel's own address
helpers (_lane_offsets, _ldmatrix_row/_offset, _stmatrix_row/_offset) for every transposing
lane and warp step on the CPU, and the copy is replayed through models of ldmatrix .trans,
prmt.b32 (driving the kernel's own _tiles_to_words) and stmatrix as the PTX ISA defines them.
The invariants, for every strip shape and head_dim: each V-ring byte is written exactly once,
with the byte of V[key, feature] its slot must hold (slot s holds key register_p_key_order[s],
or s); every row address is 16-byte aligned. The integer offset formulas are also compared with
CuTe's layouts for every coordinate.

What this cannot see: the pipelines and fences around the copy, whether the models match the
hardware, and the wgmma's reading of the ring (the same ring and layout the validated
v_layout=prepared kernels read). Those need the GPU:
tests/gpu/test_wgmma_gpu.py::test_v_layout_kernel_against_reference.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import from_dlpack

from variants.prepare import register_p_key_order
from variants.wgmma.config import Config
from variants.wgmma.kernel import WgmmaAttention
from variants.wgmma.v_transpose import TRANSPOSE_WARPS

pytestmark = pytest.mark.compile

# Every block_n can_implement accepts (the space offers 64-256 in steps of 64).
SHAPES = [(bn, d, rp) for bn in range(32, 257, 32) for d in (64, 128) for rp in (True, False)]
IDS = [f"n{bn}-d{d}-{'rp' if rp else 'sp'}" for bn, d, rp in SHAPES]


def _kernel(block_n: int, head_dim: int, register_p: bool) -> WgmmaAttention:
    cfg = Config(consumer_wgs=2, block_n=block_n, kv_stages=2,
                 p_source="registers" if register_p else "smem", intra_wg_overlap=True,
                 pingpong=True, persistent=True, v_layout="kernel")
    return WgmmaAttention(cfg, head_dim)


def _trace(kern: WgmmaAttention):
    """Per warp step (warp, iteration, feature block) and lane: the ldmatrix and stmatrix row
    offsets the kernel computes (-1 where the warp has no key block left)."""
    key_blocks, feature_blocks = kern.block_n // 16, kern._feature_blocks
    iters = (key_blocks + TRANSPOSE_WARPS - 1) // TRANSPOSE_WARPS
    rec = torch.full((TRANSPOSE_WARPS, iters, feature_blocks, 32, 2), -1, dtype=torch.int32)

    @cute.jit
    def trace(out: cute.Tensor):
        for ttid in cutlass.range(32 * TRANSPOSE_WARPS, unroll=1):
            lane = cutlass.Uint32(ttid) % 32
            warp = cutlass.Uint32(ttid) // 32
            load, store = kern._lane_offsets(lane)
            for i in cutlass.range(iters, unroll=1):
                kb = kern._warp_key_block(warp, i)  # _transpose_strip's key blocks of a warp
                if kb < key_blocks:
                    load_row = kern._ldmatrix_row(load, kb)
                    store_row = kern._stmatrix_row(store, kb)
                    for fb in cutlass.range_constexpr(feature_blocks):
                        out[warp, i, fb, lane, 0] = kern._ldmatrix_offset(load_row, fb)
                        out[warp, i, fb, lane, 1] = kern._stmatrix_offset(store_row, fb)

    cute.compile(trace, from_dlpack(rec), options="--gpu-arch=sm_90a")(from_dlpack(rec))
    return rec.tolist()


def _steps(kern: WgmmaAttention):
    """Every warp step's 32 (ldmatrix, stmatrix) lane offsets."""
    return [step for warp in _trace(kern) for it in warp for step in it]


def _offsets(kern: WgmmaAttention, rows: int, cols: int):
    """(row, col) -> byte offset for every coordinate: CuTe's layout (what TMA fills and the
    wgmma reads) and the kernel's integer formula (staging when rows are keys, else ring)."""
    cute_at = torch.full((rows, cols), -1, dtype=torch.int32)
    ours_at = torch.full((rows, cols), -1, dtype=torch.int32)
    staging = rows == kern.block_n and cols == kern.head_dim

    @cute.jit
    def offsets(cute_out: cute.Tensor, ours_out: cute.Tensor):
        layout = kern._smem_layout(rows, cols, None)
        for r in cutlass.range(rows, unroll=1):
            for c in cutlass.range(cols, unroll=1):
                cute_out[r, c] = cute.crd2idx((r, c), layout)
                if cutlass.const_expr(staging):
                    ours_out[r, c] = kern._staging_offset(cutlass.Uint32(r), cutlass.Uint32(c))
                else:
                    ours_out[r, c] = kern._ring_offset(cutlass.Uint32(r), cutlass.Uint32(c))

    cute.compile(offsets, from_dlpack(cute_at), from_dlpack(ours_at),
                 options="--gpu-arch=sm_90a")(from_dlpack(cute_at), from_dlpack(ours_at))
    return cute_at.tolist(), ours_at.tolist()


def _prmt(a, b, selector: int):
    """PTX prmt.b32 (default mode) on 4-byte tuples: byte i of the result is byte (selector
    nibble i) of b:a; the sign-replicating nibbles (>= 8) are not used by the kernel."""
    pool = tuple(a) + tuple(b)
    nibbles = [(selector >> (4 * i)) & 0xF for i in range(4)]
    assert all(n < 8 for n in nibbles)
    return tuple(pool[n] for n in nibbles)


def _ldmatrix_x4_trans(memory: dict, row_addr: list[int]) -> list[list[tuple]]:
    """ldmatrix.m8n8.x4.trans.b16: lanes 8t..8t+7 address rows 0-7 of tile t (16 bytes each);
    lane 4r + q receives per tile the b16 elements (row 2q, col r) and (row 2q + 1, col r)."""
    regs = [[None] * 4 for _ in range(32)]
    for t in range(4):
        rows = [[memory[row_addr[8 * t + i] + b] for b in range(16)] for i in range(8)]
        for lane in range(32):
            r, q = lane // 4, lane % 4
            regs[lane][t] = (rows[2 * q][2 * r], rows[2 * q][2 * r + 1],
                             rows[2 * q + 1][2 * r], rows[2 * q + 1][2 * r + 1])
    return regs


def _stmatrix_x4(written: dict, row_addr: list[int], regs: list[list[tuple]]) -> None:
    """stmatrix.m8n8.x4.b16: lanes 8t..8t+7 address rows 0-7 of tile t; lane 4r + q's word t
    is b16 elements 2q, 2q + 1 of tile t's row r."""
    for t in range(4):
        for lane in range(32):
            r, q = lane // 4, lane % 4
            for b in range(4):
                at = row_addr[8 * t + r] + 4 * q + b
                assert at not in written, f"V-ring byte {at} written twice"
                written[at] = regs[lane][t][b]


@pytest.mark.parametrize(("block_n", "head_dim", "register_p"), SHAPES, ids=IDS)
def test_offset_formulas_match_the_cute_layouts(block_n, head_dim, register_p):
    kern = _kernel(block_n, head_dim, register_p)
    for rows, cols in ((block_n, head_dim), (head_dim, block_n)):
        cute_at, ours_at = _offsets(kern, rows, cols)
        assert ours_at == cute_at, f"{rows}x{cols} offsets differ from CuTe's layout"


@pytest.mark.parametrize(("block_n", "head_dim", "register_p"), SHAPES, ids=IDS)
def test_every_v_ring_byte_gets_the_right_v_element(block_n, head_dim, register_p):
    kern = _kernel(block_n, head_dim, register_p)
    staging, _ = _offsets(kern, block_n, head_dim)
    ring, _ = _offsets(kern, head_dim, block_n)
    memory = {staging[k][f]: (k, f) for k in range(block_n) for f in range(head_dim)}
    written: dict[int, tuple[int, int]] = {}
    for step in _steps(kern):
        if step[0][0] < 0:
            continue  # this warp has no step left
        load_rows = [lane[0] for lane in step]
        store_rows = [lane[1] for lane in step]
        assert all(a % 16 == 0 for a in load_rows + store_rows), "row not 16-byte aligned"
        tiles = _ldmatrix_x4_trans(memory, load_rows)
        words = [kern._tiles_to_words(t, lane, prmt=_prmt) for lane, t in enumerate(tiles)]
        _stmatrix_x4(written, store_rows, words)
    assert len(written) == block_n * head_dim, "V-ring bytes left unwritten"
    order = register_p_key_order(block_n).tolist() if register_p else list(range(block_n))
    for f in range(head_dim):
        for slot in range(block_n):
            assert written[ring[f][slot]] == (order[slot], f), (f, slot)


def _bank_groups(rows: list[int]) -> int:
    """Distinct 16-byte bank groups (4 banks each) the 8 row addresses of a tile fall in: 8 is
    one shared-memory wavefront per tile, fewer is a bank conflict."""
    return len({(a // 16) % 8 for a in rows})


@pytest.mark.parametrize(("block_n", "head_dim", "register_p"), SHAPES, ids=IDS)
def test_matrix_tiles_are_bank_conflict_free(block_n, head_dim, register_p):
    """Every stmatrix tile, and every ldmatrix tile when the key order allows it (register P;
    the natural order reads keys 4i + {0, 1}: 2-way), touches 8 distinct bank groups."""
    worst_load = worst_store = 8
    for step in _steps(_kernel(block_n, head_dim, register_p)):
        if step[0][0] < 0:
            continue
        for t in range(4):
            tile = step[8 * t:8 * t + 8]
            worst_load = min(worst_load, _bank_groups([lane[0] for lane in tile]))
            worst_store = min(worst_store, _bank_groups([lane[1] for lane in tile]))
    assert worst_store == 8
    assert worst_load == (8 if register_p else 4)
