"""wgmma v_layout=kernel, CPU only: the producer's in-smem V transpose, address by address.

The transposing warps copy each V strip from the staging ring (block_n keys x head_dim, laid out
like K) into the V ring the PV wgmma reads (head_dim x block_n, keys contiguous), 4 keys x 4
features per step through 32-bit words, applying the register-P key order when P comes from
registers. Here a host-side @cute.jit function runs the kernel's own helpers (_transpose_item,
_source_key, _word) for every transposing thread and iteration on the CPU and records the byte
offsets each 32-bit load and store touches; _byte_column is run on Python ints. The invariants,
for every strip shape and head_dim: each V-ring byte is written exactly once, with the byte of
V[key, feature] the ring's slot must hold (slot s holds key register_p_key_order[s], or s), each
32-bit word covers 4 consecutive features (loads) or slots (stores) of one row, 4-aligned.

What this cannot see: the pipelines and fences around the copy, and the wgmma's reading of the
ring (the same ring and layout the validated v_layout=prepared kernels read). Those need the
GPU: tests/gpu/test_wgmma_gpu.py::test_v_layout_kernel_against_reference.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import from_dlpack

from variants.prepare import register_p_key_order
from variants.wgmma.config import Config
from variants.wgmma.kernel import TRANSPOSE_WARPS, WgmmaAttention

pytestmark = pytest.mark.compile

SHAPES = [(bn, d, rp) for bn in (64, 128, 192, 256) for d in (64, 128) for rp in (True, False)]
BASE = 2048  # a 1 KB-aligned tile base, as the struct places every buffer


def _trace(block_n: int, head_dim: int, register_p: bool):
    """Per (thread, iteration, e or j): byte offsets of the 4 source words and 4 target words,
    and the logical coordinates the kernel meant: (key, feature0) and (feature, slot0)."""
    cfg = Config(consumer_wgs=2, block_n=block_n, kv_stages=2,
                 p_source="registers" if register_p else "smem", intra_wg_overlap=True,
                 pingpong=True, persistent=True, v_layout="kernel")
    kern = WgmmaAttention(cfg, head_dim)
    threads = 32 * TRANSPOSE_WARPS
    total = block_n * head_dim // 16
    iters = (total + threads - 1) // threads
    rec = torch.full((threads, iters, 2, 4, 3), -1, dtype=torch.int32)

    @cute.jit
    def trace(out: cute.Tensor, base: cutlass.Int32):
        fp8 = cutlass.Float8E4M3FN
        raw_layout = kern._smem_layout(block_n, head_dim, None)
        v_layout = kern._smem_layout(head_dim, block_n, None)
        ptr = cute.make_ptr(fp8, base, cute.AddressSpace.smem, assumed_align=1024)
        src = cute.make_tensor(ptr, raw_layout)
        dst = cute.make_tensor(ptr, v_layout)
        for ttid in cutlass.range(threads, unroll=1):
            for i in cutlass.range(iters, unroll=1):
                item = ttid + i * threads
                if item < total:
                    f4, s4 = kern._transpose_item(item)
                    for e in cutlass.range_constexpr(4):
                        key = kern._source_key(s4, e)
                        word = kern._word(src, (key, 4 * f4))
                        out[ttid, i, 0, e, 0] = word.iterator.toint() - base
                        out[ttid, i, 0, e, 1] = key
                        out[ttid, i, 0, e, 2] = 4 * f4
                    for j in cutlass.range_constexpr(4):
                        word = kern._word(dst, (4 * f4 + j, 4 * s4))
                        out[ttid, i, 1, j, 0] = word.iterator.toint() - base
                        out[ttid, i, 1, j, 1] = 4 * f4 + j
                        out[ttid, i, 1, j, 2] = 4 * s4

    fn = cute.compile(trace, from_dlpack(rec), cutlass.Int32(0), options="--gpu-arch=sm_90a")
    fn(from_dlpack(rec), cutlass.Int32(BASE))
    return rec


def _layout_offsets(rows: int, cols: int, head_dim: int, block_n: int) -> dict:
    """Logical (row, col) -> byte offset of the swizzled smem layout the kernel uses, from CuTe
    (the layout TMA fills / the wgmma reads; the addresses above must agree with it)."""
    kern = WgmmaAttention(Config(2, block_n, 2, "registers", True, True, True, "kernel"),
                          head_dim)
    table = torch.full((rows, cols), -1, dtype=torch.int32)

    @cute.jit
    def offsets(out: cute.Tensor):
        layout = kern._smem_layout(rows, cols, None)
        for r in cutlass.range(rows, unroll=1):
            for c in cutlass.range(cols, unroll=1):
                out[r, c] = cute.crd2idx((r, c), layout)

    cute.compile(offsets, from_dlpack(table), options="--gpu-arch=sm_90a")(from_dlpack(table))
    return {(r, c): int(table[r, c]) for r in range(rows) for c in range(cols)}


@pytest.mark.parametrize(("block_n", "head_dim", "register_p"), SHAPES,
                         ids=[f"n{bn}-d{d}-{'rp' if rp else 'sp'}" for bn, d, rp in SHAPES])
def test_every_v_ring_byte_gets_the_right_v_element(block_n, head_dim, register_p):
    rec = _trace(block_n, head_dim, register_p)
    src_at = _layout_offsets(block_n, head_dim, head_dim, block_n)  # staging: (key, feature)
    dst_at = _layout_offsets(head_dim, block_n, head_dim, block_n)  # V ring: (feature, slot)
    src_byte = {v: k for k, v in src_at.items()}
    order = register_p_key_order(block_n).tolist() if register_p else list(range(block_n))
    written: dict[int, tuple[int, int]] = {}
    for thread in rec.tolist():
        for it in thread:
            loads, stores = it
            if loads[0][0] < 0:
                continue  # past the end of the strip for this thread
            for j, (dst_off, feature, slot0) in enumerate(stores):
                assert dst_off % 4 == 0, "32-bit store not 4-aligned"
                for e in range(4):
                    # The word's byte e is slot slot0 + e of this feature row...
                    assert dst_at[(feature, slot0 + e)] == dst_off + e, (feature, slot0, e)
                    # ...and holds byte j of source word e (the 4x4 transpose).
                    src_off, key, feature0 = loads[e]
                    assert src_off % 4 == 0, "32-bit load not 4-aligned"
                    assert src_at[(key, feature0 + j)] == src_off + j, (key, feature0, j)
                    got = src_byte[src_off + j]
                    assert dst_off + e not in written, f"V-ring byte {dst_off + e} written twice"
                    written[dst_off + e] = got
    assert len(written) == block_n * head_dim, "V-ring bytes left unwritten"
    for (feature, slot), off in dst_at.items():
        assert written[off] == (order[slot], feature), (feature, slot)


def test_byte_column_is_a_4x4_byte_transpose():
    kern = WgmmaAttention(Config(2, 128, 2, "registers", True, True, True, "kernel"), 128)
    words = [0x03020100 + 0x10101010 * e for e in range(4)]  # byte j of word e = 16e + j
    for j in range(4):
        assert kern._byte_column(words, j) == sum((16 * e + j) << (8 * e) for e in range(4))
