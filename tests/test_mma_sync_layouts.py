"""mma_sync family, CPU only: the P round trip through shared memory, address by address.

With p_source=smem each thread stores its S-accumulator (C layout) pairs of P to the swizzled P
tile and the warp reads them back with ldmatrix in the A layout of the P @ V MMA. Both paths are
built here by the kernel's own helpers (MmaSyncAttention._p_store_views, _p_load_partition) inside
a host-side @cute.jit function that runs on the CPU: the thread index is a runtime value, exactly
as in the kernel, and every smem address is taken from the CuTe view the kernel would access
(iterator as an integer, minus the tile base). The invariant, for every P tile shape of the search
spaces and both swizzles: each logical (row, key) element of P is written exactly once, to the
byte the intended swizzled layout assigns it, and every byte each ldmatrix reads holds the
element the A fragment expects there, written by the same warp (a warp barrier separates them).

The store addresses once came from thr_mma.partition_C(sP)[(None, r), m, n]: CuTe DSL 4.8.1
slices that view wrongly under swizzle=chunk_elems (every pair of a thread got one address; see
_p_store_views), which gave the wrong results on the H200; test_old_store_path_is_caught keeps
that path in the harness to prove the check catches it (block_n 64 and 128 fail with it, 32
does not). A compile test builds such configs for the GPU and checks the PTX keeps one
st.shared.b16 per pair and that the st.shared / ldmatrix addresses it computes for every thread
are the ones checked here.

What this cannot see: the ldmatrix data movement itself (CuTe's LdMatrix8x16x8bOp traits say which
fragment register gets which of the 16 bytes a thread addresses) and the barriers; the same
traits and the same warp barrier serve Q, K, V and bank_period P, which are correct on the GPU.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass.cute.runtime import from_dlpack

from tuner.gpus import PROFILES
from tuner.problem import Problem
from variants.base import enumerate_space
from variants.mma_sync import Config, can_implement, space
from variants.mma_sync.config import SUPPORTED_ARCHS

pytestmark = pytest.mark.compile

# The spaces are per arch; shared memory and register limits (can_implement) decide which tile
# shapes are feasible, so every profile of a supported arch and both head dims are consulted.
ARCH_GPUS = {arch: [g for g in PROFILES.values() if g.arch == arch] for arch in SUPPORTED_ARCHS}
PROBLEMS = [Problem(batch=1, heads=4, seq_len=77, head_dim=d) for d in (64, 128)]
# Base addresses of the P tile: the struct field is 1 KB aligned, and a chunk_elems swizzle with
# 3 bits has a 2 KB period, so 1 KB and 3 KB check the swizzle acts on offsets, not addresses.
BASES = (0, 1024, 3072)


def _p_key(cfg: Config) -> tuple:
    """Everything the P smem round trip depends on (kv_stages, q_in_registers do not touch it)."""
    return (cfg.block_m, cfg.block_n, cfg.warps, cfg.rows_per_warp, cfg.swizzle, cfg.mma)


def _smem_p_cases() -> list[tuple[str, tuple]]:
    """(arch, P key) for every feasible p_source=smem config of every supported arch's space."""
    cases = set()
    for arch in SUPPORTED_ARCHS:
        for cfg in enumerate_space(Config, space(arch)):
            if cfg.p_source == "smem" and any(
                    can_implement(cfg, problem, gpu)[0]
                    for gpu in ARCH_GPUS[arch] for problem in PROBLEMS):
                cases.add((arch, _p_key(cfg)))
    return sorted(cases)


SMEM_P_CASES = _smem_p_cases()


def _case_id(case: tuple[str, tuple]) -> str:
    arch, (bm, bn, warps, rpw, swizzle, mma) = case
    return f"{arch}-{bm}x{bn}-w{warps}-r{rpw}-{swizzle}-{mma}"


def _intended_offset(row: int, key: int, block_m: int, block_n: int, swizzle: str) -> int:
    """Byte offset of P[row, key] in the tile as specified, independently of CuTe: (8, atom_cols)
    K-major atoms stacked down the rows, then across the keys, under Swizzle<bits, 4, shift>
    (shift 3 = bank_period, XOR source at bit 7; 4 = chunk_elems, XOR source at bit 8)."""
    atom_cols = min(block_n, 128)
    bits = min(int(math.log2(atom_cols // 16)), 3)
    shift = 3 if swizzle == "bank_period" else 4
    x = row * atom_cols + (key % atom_cols) + (key // atom_cols) * block_m * atom_cols
    yyy = ((1 << bits) - 1) << (4 + shift)
    return x ^ ((x & yyy) >> shift)


def _trace_p_round_trip(key: tuple, arch: str, bases=BASES):
    """Run the kernel's P store and ldmatrix partitions for every thread on the CPU.

    Returns (writes, reads) per tile base: writes[t] lists (row, key, byte offset) of each P
    element thread t stores; reads[t] lists, per ldmatrix row address thread t supplies, the 16
    (row, key, byte offset) it reads. The base is a runtime argument of one compiled function.
    """
    from variants.mma_sync.kernel import MmaSyncAttention

    bm, bn, warps, rpw, swizzle, mma = key
    cfg = Config(block_m=bm, block_n=bn, warps=warps, rows_per_warp=rpw, kv_stages=1,
                 p_source="smem", swizzle=swizzle, q_in_registers=False, mma=mma)
    kern = MmaSyncAttention(cfg, 128)
    threads, m_tiles = kern.threads, kern.m_tiles
    n_pairs = m_tiles * 2 * (bn // 8)
    # ldmatrix rows a thread addresses: (m16 tiles) x (32-key k-blocks), 16 bytes each.
    n_rows = m_tiles * (bn // 32)
    w = torch.full((threads, n_pairs, 2, 3), -1, dtype=torch.int32)
    rd = torch.full((threads, n_rows, 16, 3), -1, dtype=torch.int32)
    checks: dict[str, object] = {}

    @cute.jit
    def trace(w_out: cute.Tensor, rd_out: cute.Tensor, tile_base: cutlass.Int32):
        sP_layout = kern._smem_layout(bm, bn, None)
        tiled_mma = kern._tiled_mma()
        ptr = cute.make_ptr(cutlass.Float8E4M3FN, tile_base, cute.AddressSpace.smem,
                            assumed_align=1024)
        sP = cute.make_tensor(ptr, sP_layout)
        ident = cute.make_identity_tensor((bm, bn))
        for tidx in cutlass.range(threads, unroll=1):
            # ---- the store path of the kernel: C-fragment pairs -------------------------------
            thr_mma = tiled_mma.get_slice(tidx)
            tScS = thr_mma.partition_C(ident)
            p_dst = kern._p_store_views(thr_mma, sP, sP_layout)
            i = 0
            for mt_i in cutlass.range_constexpr(m_tiles):
                for r in cutlass.range_constexpr(2):
                    for n in cutlass.range_constexpr(bn // 8):
                        dst = p_dst(mt_i, r, n)
                        checks["store_elems"] = cute.size(dst)
                        at = dst.iterator.toint() - tile_base
                        for j in cutlass.range_constexpr(2):
                            crd = tScS[(j, r), mt_i, n]
                            w_out[tidx, i, j, 0] = crd[0]
                            w_out[tidx, i, j, 1] = crd[1]
                            w_out[tidx, i, j, 2] = at + cute.crd2idx(j, dst.layout)
                        i += 1
            # ---- the read path: one ldmatrix row address per (m16 tile, k-block) ----------------
            s2r_P, tOsP = kern._p_load_partition(tiled_mma, tidx, sP)
            tOcP = s2r_P.partition_S(ident)
            checks["read_modes"] = (cute.size(tOsP, mode=[1]), cute.size(tOsP, mode=[2]))
            k = 0
            for m in cutlass.range_constexpr(cute.size(tOsP, mode=[1])):
                for kb in cutlass.range_constexpr(cute.size(tOsP, mode=[2])):
                    src = tOsP[None, m, kb]
                    crd_row = tOcP[None, m, kb]
                    # ldmatrix reads 16 contiguous bytes from the address it is given.
                    checks["read_row"] = (cute.size(src),
                                          [cute.crd2idx(j, src.layout) for j in range(16)])
                    at = src.iterator.toint() - tile_base
                    for j in cutlass.range_constexpr(16):
                        crd = crd_row[j]
                        rd_out[tidx, k, j, 0] = crd[0]
                        rd_out[tidx, k, j, 1] = crd[1]
                        rd_out[tidx, k, j, 2] = at + j
                    k += 1

    fn = cute.compile(trace, from_dlpack(w), from_dlpack(rd), cutlass.Int32(0),
                      options=f"--gpu-arch={arch}")
    assert checks["store_elems"] == 2
    assert checks["read_modes"] == (m_tiles, bn // 32)
    assert checks["read_row"] == (16, list(range(16)))
    traces = []
    for base in bases:
        w.fill_(-1)
        rd.fill_(-1)
        fn(from_dlpack(w), from_dlpack(rd), cutlass.Int32(base))
        traces.append((w.tolist(), rd.tolist()))
    return traces


def _check_round_trip(key: tuple, writes, reads) -> list[str]:
    bm, bn, warps, rpw, swizzle, _ = key
    errors: list[str] = []
    written: dict[tuple[int, int], int] = {}
    writer_warp: dict[tuple[int, int], int] = {}
    for t, pairs in enumerate(writes):
        for pair in pairs:
            for row, col, byte in pair:
                if (row, col) in written:
                    errors.append(f"P[{row},{col}] stored twice (thread {t})")
                written[(row, col)] = byte
                writer_warp[(row, col)] = t // 32
                want = _intended_offset(row, col, bm, bn, swizzle)
                if byte != want:
                    errors.append(f"thread {t} stores P[{row},{col}] at byte {byte}, "
                                  f"layout says {want}")
    if len(written) != bm * bn:
        errors.append(f"{len(written)} of {bm * bn} P elements stored")
    if len(set(written.values())) != len(written):
        errors.append("two P elements stored to one byte")
    read: set[tuple[int, int]] = set()
    for t, rows in enumerate(reads):
        for row16 in rows:
            for row, col, byte in row16:
                read.add((row, col))
                if written.get((row, col)) != byte:
                    errors.append(f"thread {t} ldmatrix reads P[{row},{col}] from byte {byte}, "
                                  f"stored at {written.get((row, col))}")
                elif writer_warp[(row, col)] != t // 32:
                    errors.append(f"warp {t // 32} reads P[{row},{col}] stored by warp "
                                  f"{writer_warp[(row, col)]}: a warp barrier is not enough")
    if len(read) != bm * bn:
        errors.append(f"ldmatrix reads {len(read)} of {bm * bn} P elements")
    return errors


def test_smem_p_cases_cover_both_swizzles_and_every_tile_shape():
    assert {arch for arch, _ in SMEM_P_CASES} == set(SUPPORTED_ARCHS)
    for arch, key in SMEM_P_CASES:
        other = "chunk_elems" if key[4] == "bank_period" else "bank_period"
        assert (arch, (*key[:4], other, key[5])) in SMEM_P_CASES, (arch, key)
    assert {key[5] for _, key in SMEM_P_CASES} == {"fp8", "mxf8"}
    # The seed's first kernel: 64x64 tile, 4 warps of 16 rows, P through chunk_elems smem.
    assert ("sm_90a", (64, 64, 4, 16, "chunk_elems", "fp8")) in SMEM_P_CASES


def _round_trip_errors(arch: str, key: tuple) -> list[str]:
    traces = _trace_p_round_trip(key, arch)
    errors = _check_round_trip(key, *traces[0])
    for base, trace in zip(BASES[1:], traces[1:], strict=True):
        if trace != traces[0]:
            errors.append(f"tile base {base}: offsets differ from those at base {BASES[0]}")
    return errors


@pytest.mark.parametrize("case", SMEM_P_CASES, ids=_case_id)
def test_p_smem_round_trip(case):
    errors = _round_trip_errors(*case)
    assert not errors, f"{len(errors)} errors, first: " + "; ".join(errors[:4])


def _old_store_views(self, thr_mma, sP, sP_layout):
    """The store path before the fix: slices of the swizzled C partition of sP."""
    tPsP = thr_mma.partition_C(sP)
    return lambda mt_i, r, n: tPsP[(None, r), mt_i, n]


def test_old_store_path_is_caught(monkeypatch):
    """The harness sees the bug the H200 saw: with the partition_C slices every pair of a thread
    gets one address under chunk_elems, while bank_period (foldable swizzle) stays correct. If a
    CuTe DSL release fixes the slice, the chunk_elems assertion here fails: the workaround in
    _p_store_views may then go, and this test with it."""
    from variants.mma_sync.kernel import MmaSyncAttention

    monkeypatch.setattr(MmaSyncAttention, "_p_store_views", _old_store_views)
    assert _round_trip_errors("sm_90a", (64, 64, 4, 16, "chunk_elems", "fp8"))
    assert not _round_trip_errors("sm_90a", (64, 64, 4, 16, "bank_period", "fp8"))


_PTX_INSN = re.compile(r"^\s*(?:@(%\w+)\s+)?([a-z][\w.]*)\s*(.*?);?\s*$")
_PTX_ADDR = re.compile(r"\[(%\w+)(?:\+(-?\d+))?\]")
_MASK32 = 0xFFFFFFFF


def _ptx_smem_addresses(ptx: str, tid: int) -> tuple[list[int], list[int]]:
    """(st.shared.b16 addresses, ldmatrix addresses) of thread `tid`, in program order.

    A straight-line evaluation of the 32-bit integer address arithmetic of the kernel (branches
    ignored, every instruction once): the smem addresses are loop invariants computed before the
    strip loop. The dynamic smem symbol is 0, block indices are 0, parameters and anything not
    integer arithmetic are unknown (None), and an address must not depend on them.
    """
    env: dict[str, int | None] = {"%tid.x": tid, "%laneid": tid % 32, "%ctaid.x": 0,
                                  "%ctaid.y": 0, "%ctaid.z": 0, "__dynamic_shmem__0": 0}
    stores: list[int] = []
    ldsm: list[int] = []

    def val(tok: str) -> int | None:
        tok = tok.strip()
        if tok in env:
            return env[tok]
        if re.fullmatch(r"-?\d+", tok):
            return int(tok) & _MASK32
        return None

    def signed(x: int) -> int:
        return x - (1 << 32) if x & (1 << 31) else x

    def address(text: str) -> int:
        reg, imm = _PTX_ADDR.search(text).groups()
        base = env.get(reg)
        assert base is not None, f"address register {reg} of thread {tid} is not known"
        return (base + int(imm or 0)) & _MASK32

    cmp = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
           "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}
    for line in ptx.splitlines():
        m = _PTX_INSN.match(line)
        if not m or line.lstrip().startswith(("//", ".")):
            continue
        _, op, rest = m.groups()
        if op.startswith("st.shared.b16"):
            stores.append(address(rest))
            continue
        if op.startswith("ldmatrix"):
            ldsm.append(address(rest))
            continue
        args = [a.strip() for a in rest.split(",")] if rest else []
        if not args or not args[0].startswith("%") or args[0].startswith("{"):
            continue
        dst, srcs = args[0], [val(a) for a in args[1:]]
        head, *mods = op.split(".")
        result = None
        if head in ("mov", "shfl") and srcs and srcs[0] is not None and (
                head == "mov" or mods[:1] == ["sync"]):
            result = srcs[0]  # shfl of a block-uniform value (the smem base) is that value
        elif mods and mods[-1] in ("s32", "u32", "b32") and all(x is not None for x in srcs):
            a = srcs
            if head == "add":
                result = a[0] + a[1]
            elif head == "sub":
                result = a[0] - a[1]
            elif head == "mul" and mods[0] == "lo":
                result = a[0] * a[1]
            elif head == "mad" and mods[0] == "lo":
                result = a[0] * a[1] + a[2]
            elif head == "shl":
                result = a[0] << a[1]
            elif head == "shr":
                result = (signed(a[0]) if mods[-1] == "s32" else a[0]) >> a[1]
            elif head in ("and", "or", "xor"):
                result = {"and": a[0] & a[1], "or": a[0] | a[1], "xor": a[0] ^ a[1]}[head]
            elif head == "setp":
                x, y = (signed(a[0]), signed(a[1])) if mods[-1] == "s32" else (a[0], a[1])
                result = int(cmp[mods[0]](x, y)) if mods[0] in cmp else None
            elif head == "selp":
                result = a[0] if a[2] else a[1]
        env[dst] = None if result is None else result & _MASK32
    return stores, ldsm


def _p_store_count(ptx: str) -> int:
    return len(re.findall(r"\bst\.shared\.b16\b", ptx))


def _repo_root_files() -> dict[str, int]:
    root = Path(__file__).resolve().parents[1]
    return {p.name: p.stat().st_mtime_ns for p in root.iterdir() if p.is_file()}


# Configs that failed validation on the H200 with the partition_C store (the seed's first kernel
# among them), built for both archs, with the bank_period twin as a control: every P pair keeps
# its own 16-bit store, and the addresses the PTX computes are those the host trace checked.
PTX_CONFIGS = [
    ("sm_90a", dict(block_m=64, block_n=64, warps=4, rows_per_warp=16, kv_stages=1)),
    ("sm_120a", dict(block_m=128, block_n=128, warps=8, rows_per_warp=16, kv_stages=2)),
    ("sm_90a", dict(block_m=128, block_n=64, warps=8, rows_per_warp=16, kv_stages=3)),
]


@pytest.mark.parametrize("swizzle", ["chunk_elems", "bank_period"])
@pytest.mark.parametrize("arch,overrides", PTX_CONFIGS,
                         ids=lambda v: v if isinstance(v, str) else
                         f"{v['block_m']}x{v['block_n']}-r{v['rows_per_warp']}")
def test_p_smem_addresses_in_ptx(arch, overrides, swizzle, tmp_path):
    from variants.common.abi import fake_args
    from variants.dsl_compile import compile_for_arch
    from variants.mma_sync.config import SMEM_ALIGN
    from variants.mma_sync.kernel import MmaSyncAttention

    cfg = Config(p_source="smem", swizzle=swizzle, q_in_registers=False, mma="fp8",
                 **overrides)
    problem = Problem(batch=1, heads=4, seq_len=77, head_dim=128)
    assert can_implement(cfg, problem, ARCH_GPUS[arch][0]) == (True, None)
    before = _repo_root_files()
    # --keep-ptx without a --dump-dir writes into the working directory of the DSL's import
    # (the repository root under pytest): compile_for_arch points it at tmp_path.
    compile_for_arch(MmaSyncAttention(cfg, problem.head_dim), arch, fake_args(),
                     keep="--keep-ptx", dump_dir=str(tmp_path))
    assert _repo_root_files() == before, "the compile wrote into the repository root"
    ptx = "".join(p.read_text() for p in tmp_path.glob("*.ptx"))
    assert ptx and ".entry" in ptx
    pairs = cfg.m_tiles * 2 * (cfg.block_n // 8)
    assert _p_store_count(ptx) == pairs
    # The P field follows Q, the K ring and the V ring, each 1 KB aligned (SharedStorage).
    d = problem.head_dim
    p_base = sum(-(-f // SMEM_ALIGN) * SMEM_ALIGN for f in
                 (cfg.block_m * d, 2 * cfg.kv_stages * cfg.block_n * d))
    p_end = p_base + cfg.block_m * cfg.block_n
    (writes, reads), = _trace_p_round_trip(_p_key(cfg), arch, bases=(0,))
    for tid in range(cfg.threads):
        stores, ldsm = _ptx_smem_addresses(ptx, tid)
        assert sorted(a - p_base for a in stores) == sorted(p[0][2] for p in writes[tid]), tid
        p_rows = [a - p_base for a in ldsm if p_base <= a < p_end]
        assert sorted(p_rows) == sorted(row16[0][2] for row16 in reads[tid]), tid
