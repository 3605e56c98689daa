"""prepare's one-pass block quantization (variants/block_quantize_kernel.py) compiles without a GPU
for every target arch, and its PTX does what the formula says: each input row loaded once (16-byte
loads, 8 rows a thread for each of q, k and v), a NaN-propagating amax (q's across the row's
lanes, k's and v's over the CTA through shared memory), one correctly rounded reciprocal per scale
and no FMA (the torch formula's two roundings), saturating round-to-nearest-even e4m3 stores, V's
feature-major codes through a shared tile with no byte stores, V's log2 without the approximate
MUFU instruction. Bit-for-bit equality with the plain formula on a GPU: tests/test_prepare.py
(cuda parameters)."""

import re
from pathlib import Path

import pytest
import torch

from variants.block_quantize_kernel import ROTATED_LANES, ROWS, compile_kernel
from variants.cubin import cubin_resources

pytestmark = pytest.mark.compile

INPUTS = 3  # q, k and v in one launch


def _ptx(tmp_path, *args, name="quant", **kwargs) -> str:
    compile_kernel(name, *args, keep_ptx_in=str(tmp_path), **kwargs)
    return "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))


def _cast_operand_ops(ptx: str) -> set[str]:
    """The opcodes that define the fp32 operands of every e4m3 conversion (through the moves
    that unpack a packed f32x2 result on sm_100+)."""
    defined = {}
    for line in ptx.splitlines():
        match = re.match(r"\s*([\w.]+)\s+(%\w+),", line)
        if match:
            defined[match.group(2)] = match.group(1)
        unpack = re.match(r"\s*mov\.b64\s+\{(%\w+),\s*(%\w+)\},\s*(%\w+);", line)
        if unpack:
            for reg in unpack.group(1, 2):
                defined[reg] = defined[unpack.group(3)]
    ops = set()
    for operands in re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32\s+%\w+,\s*(%\w+),\s*(%\w+);",
                               ptx):
        ops.update(defined[r] for r in operands)
    return ops


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_89"])
@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.bfloat16, 128), (torch.float16, 64)])
def test_one_launch_reads_each_input_once_and_casts_like_the_formula(arch, dtype, head_dim,
                                                                    tmp_path):
    ptx = _ptx(tmp_path, dtype, head_dim, arch, True, True)
    assert ptx.count(".entry ") == 1
    assert ptx.count("ld.global.v4.b32") == INPUTS * ROWS  # 8 x 16-bit, once per row
    assert "ld.global.b16" not in ptx and "ld.global.v2.b32" not in ptx
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == INPUTS * ROWS * 4  # 2 values each
    # q: one scale per row (8 a thread), k and v one per block, and V's inverse: all rcp.rn.
    assert ptx.count("rcp.rn.f32") == ROWS + 2 + 1
    assert "approx" not in ptx and "div.rn.f32" not in ptx
    # Each code from one rounded product x * scale (not an FMA, not a cvt of a sum).
    assert _cast_operand_ops(ptx) <= {"mul.f32", "mul.rn.f32", "mul.f32x2"}
    assert "max.NaN.f32" in ptx and "max.f32" not in ptx  # no NaN-dropping max anywhere
    # q's row butterfly over head_dim / 8 lanes, k's and v's over the warp.
    lanes = head_dim // 8
    assert ptx.count("shfl.sync.bfly.b32") == ROWS * (lanes.bit_length() - 1) + 2 * 5
    # q's and k's codes 8 bytes a row; V's feature rows in 8-byte pieces, head_dim / lanes each.
    assert ptx.count("st.global.v2.b32") == 2 * ROWS + head_dim // lanes
    assert ptx.count("st.shared.v2.b32") == 8  # the 8 x 8 transpose: 8 features' 8 keys
    # The tile's reads; at head_dim 64 the CTA maxima of its 2 warps (k's, v's) are 8 bytes too.
    assert ptx.count("ld.shared.v2.b32") == head_dim // lanes + (2 if lanes == 8 else 0)
    assert "st.global.b8" not in ptx and "st.shared.b8" not in ptx
    # k's and v's CTA maxima, then V's tile written before it is read.
    assert ptx.count("bar.sync") == 3


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_natural_v_is_stored_like_k(arch, tmp_path):
    ptx = _ptx(tmp_path, torch.bfloat16, 128, arch, False, False)
    assert ptx.count("st.global.v2.b32") == INPUTS * ROWS
    assert "st.shared.v2.b32" not in ptx and ptx.count("bar.sync") == 2


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_89"])
def test_head_scale_expansion_compiles(arch, tmp_path):
    compile_kernel("expand", torch.float32, 0, arch, keep_ptx_in=str(tmp_path))
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    assert ptx.count(".entry ") == 1
    assert ptx.count("rcp.rn.f32") == 1 and "approx" not in ptx  # 1 / dv, correctly rounded


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_89"])
@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.bfloat16, 128), (torch.float16, 64)])
def test_the_smoothing_mean_compiles_to_fp32_adds_and_one_rounded_division(arch, dtype,
                                                                          head_dim, tmp_path):
    """variants/key_mean_kernel.py: 16-byte loads of the sampled keys, fp32 adds (no FMA, no
    approximation), one barrier before the groups' partial sums are added, one correctly
    rounded division by the sample's size per feature, one store of m (its bits on a GPU:
    tests/gpu/test_key_mean_gpu.py)."""
    fn, slots = compile_kernel("mean", dtype, head_dim, arch, keep_ptx_in=str(tmp_path))
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    # k, m, five scalars, k's three strides, the stream
    assert fn is not None and len(slots) == 11 and ptx.count(".entry ") == 1
    assert "ld.global.v4.b32" in ptx and "ld.global.b16" not in ptx
    assert "fma.rn.f32" not in ptx and "approx" not in ptx
    assert ptx.count("bar.sync") == 1 and ptx.count("div.rn.f32") == 1
    assert len(re.findall(r"st\.global\.(?:b32|f32)", ptx)) == 1
    with pytest.raises(ValueError, match="'mean' quantizes nothing"):
        compile_kernel("mean", dtype, head_dim, arch, smooth_k=True)


def test_the_smoothing_mean_gives_every_thread_a_group_at_every_head_dim():
    """KeyMean's groups of head_dim / 8 lanes fill its THREADS exactly at every supported
    head_dim (a thread past the last whole group would add keys twice), and one thread per
    feature adds the groups' partial sums."""
    from variants.base import HEAD_DIMS
    from variants.key_mean_kernel import THREADS, VEC

    for head_dim in HEAD_DIMS:
        assert THREADS % (head_dim // VEC) == 0 and THREADS >= head_dim


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_89"])
def test_the_mean_launch_lets_the_quantization_start_and_only_m_readers_wait(arch, tmp_path):
    """Programmatic dependent launch (sm_90 on): the mean launch's CTAs first let the launch
    after them start, and in the quantization only the code that reads m waits for the mean
    launch: k's CTAs, after issuing their rows' loads, before m's one load (q's and v's CTAs
    never wait; with write_shift q's wait before their m). sm_89 has neither instruction."""
    pdl = arch != "sm_89"
    (tmp_path / "mean").mkdir()
    compile_kernel("mean", torch.bfloat16, 128, arch, keep_ptx_in=str(tmp_path / "mean"))
    mean = "".join(p.read_text() for p in (tmp_path / "mean").glob("*.ptx"))
    first_load = mean.index("ld.global")
    assert ("griddepcontrol.launch_dependents" in mean[:first_load]) == pdl
    assert "griddepcontrol.wait" not in mean
    for i, (flags, waits) in enumerate(((dict(smooth_k=True, write_shift=False), 1),
                                        (dict(smooth_k=True), 2), ({}, 0),
                                        (dict(rotate_qk=True), 0))):
        if arch == "sm_89" and flags.get("rotate_qk"):
            continue
        path = tmp_path / f"quant{i}"
        path.mkdir()
        ptx = _ptx(path, torch.bfloat16, 128, arch, True, True, **flags)
        assert ptx.count("griddepcontrol.wait") == (waits if pdl else 0), flags
        assert "launch_dependents" not in ptx
    (tmp_path / "kv").mkdir()
    kv = _ptx(tmp_path / "kv", torch.bfloat16, 128, arch, True, True, name="quant_kv",
              smooth_k=True)
    if pdl:  # k's 8 row loads, the wait, m's load, then the CTA's barrier
        before, after = kv.split("griddepcontrol.wait", 1)
        assert before.count("ld.global.v4.b32") == ROWS
        assert after[:after.index("bar.sync")].count("ld.global") == 1


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_the_launch_without_q_compiles_and_a_bad_name_is_refused(arch, tmp_path):
    """quant_kv (for a kernel that quantizes Q itself) is the same code without q's part, and
    no q CTAs in its grid: its codes on a GPU are checked by tests/test_prepare.py."""
    fn, slots = compile_kernel("quant_kv", torch.bfloat16, 128, arch)
    assert fn is not None and len(slots) == len(compile_kernel("quant", torch.bfloat16, 128,
                                                               arch)[1])
    with pytest.raises(ValueError, match="unknown kernel 'quant_q'"):
        compile_kernel("quant_q", torch.bfloat16, 128, arch)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_the_launch_without_v_quantizes_q_and_k_alone(arch, tmp_path):
    """quantize_v=False (a kernel with P.V in 16 bits reads V itself): q's and k's rows loaded
    and cast as with V, no v CTA code at all (its loads, casts and CTA-wide maximum); its
    neutral V scales on a GPU: tests/gpu/test_pv16_gpu.py."""
    (tmp_path / "with").mkdir(), (tmp_path / "without").mkdir()
    with_v = _ptx(tmp_path / "with", torch.bfloat16, 128, arch, False, False)
    ptx = _ptx(tmp_path / "without", torch.bfloat16, 128, arch, False, False, quantize_v=False)
    assert ptx.count("ld.global.v4.b32") == (INPUTS - 1) * ROWS
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == (INPUTS - 1) * ROWS * 4
    assert ptx.count("bar.sync") == with_v.count("bar.sync") - 1 == 1
    with pytest.raises(ValueError, match="quantize_v=False"):
        compile_kernel("expand", torch.float32, 0, arch, quantize_v=False)


# ---- K smoothing and the Q/K rotation (variants/transforms.py, variants/hadamard_dsl.py) ----

FLAGS = {"smooth": dict(smooth_k=True), "rotate": dict(rotate_qk=True),
         "both": dict(smooth_k=True, rotate_qk=True)}
VEC = 8  # features of a chunk


def _build(tmp_path, name, dtype, head_dim, arch, v_feature_major, permute_keys, **flags):
    """(PTX, cubin resources) of one compile."""
    compile_kernel(name, dtype, head_dim, arch, v_feature_major, permute_keys,
                   keep_ptx_in=str(tmp_path), **flags)
    ptx = "".join(p.read_text() for p in Path(tmp_path).glob("*.ptx"))
    cubin = next(Path(tmp_path).glob("*.cubin")).read_bytes()
    return ptx, cubin_resources(cubin, 0)


@pytest.fixture(scope="module")
def plain_ptx(tmp_path_factory):
    """The kernel without transforms, per arch (and head_dim and V layout, bf16 and keys in
    order unless asked): the FMAs, correctly rounded multiplies (V's log2, the casts) and shared
    reads (the block amax, V's tile) it has of its own are the baseline the transforms add to."""
    cache = {}

    def get(arch, head_dim=128, v_feature_major=True, dtype=torch.bfloat16):
        key = (arch, head_dim, v_feature_major, dtype)
        if key not in cache:
            cache[key] = _build(tmp_path_factory.mktemp(arch), "quant", dtype, head_dim, arch,
                                v_feature_major, v_feature_major)[0]
        return cache[key]

    return get


def _expected(head_dim: int, with_q: bool, smooth_k: bool = False, rotate_qk: bool = False,
              write_shift: bool = True):
    """Per-thread instruction counts the transforms must give: a rotated row on ROTATED_LANES
    lanes, log2(head_dim) butterfly stages of 64 exact adds each per rotated input, of which
    log2(lanes) cross lanes (64 shuffles and 64 fmas by +-1 each); m read once per CTA from
    global memory (16 bytes a thread) and per chunk from shared memory; q . m only with
    write_shift (q's CTAs then read m too)."""
    lanes = head_dim // VEC // (head_dim // VEC // ROTATED_LANES if rotate_qk else 1)
    rows = ROWS * lanes // (head_dim // VEC)
    chunks = ROWS // rows
    steps = lanes.bit_length() - 1  # a row's lane butterflies
    rotated = (1 + with_q) * rotate_qk
    dot = with_q * smooth_k * write_shift  # q . m: 64 fmas a thread, then the row's lanes summed
    return {
        "shfl": with_q * rows * steps * (1 + dot) + 2 * 5 + rotated * ROWS * VEC * steps,
        "exact": rotated * ROWS * VEC * (head_dim.bit_length() - 1 - steps)
        + smooth_k * ROWS * VEC + dot * rows * steps,
        "fma": dot * ROWS * VEC + rotated * ROWS * VEC * steps, "mul_rn": rotated * ROWS * VEC,
        "loads": (2 + with_q) * ROWS + smooth_k + dot,
        # 16-byte reads of m: q's chunks once for all its rows; k's unrotated chunk once, a
        # rotated row's chunks per row.
        "mean_reads": 2 * (dot * chunks + smooth_k * (rows * chunks if rotate_qk else 1)),
        "scalar_stores": with_q * rows + dot * rows + 4,  # q's descales, shifts; k's, v's
        "row_stores": (1 + with_q) * ROWS + ROWS,  # q's and k's codes 8 bytes a chunk, V's
    }


def _check_transform_ptx(ptx, plain, head_dim, with_q, flags):
    want = _expected(head_dim, with_q, **flags)
    assert ptx.count(".entry ") == 1
    assert ptx.count("shfl.sync.bfly.b32") == want["shfl"]
    # Every add of the butterflies, the smoothing and the shift's lane sum is add.rn / sub.rn
    # (never contracted): a dropped stage or a butterfly made an FMA changes this count.
    assert ptx.count("add.rn.f32") + ptx.count("sub.rn.f32") == want["exact"]
    # The only FMAs beyond the plain kernel's are q . m's and the lane butterflies' (by +-1);
    # the norm multiply is mul.rn.
    assert ptx.count("fma.rn.f32") - plain.count("fma.rn.f32") == want["fma"]
    assert "fma.f32" not in ptx and ".ftz" not in ptx and "approx" not in ptx
    assert ptx.count("mul.rn.f32") - plain.count("mul.rn.f32") == want["mul_rn"]
    # Each input row once, m 16 bytes a thread (sm_120a spells that load v2.b64).
    assert ptx.count("ld.global.v4.b32") + ptx.count("ld.global.v2.b64") == want["loads"]
    shared_reads = ptx.count("ld.shared.v4.b32") - plain.count("ld.shared.v4.b32")
    assert shared_reads == want["mean_reads"]  # each chunk of m once, 16 bytes at a time
    assert ptx.count("st.global.b32") == want["scalar_stores"]
    assert ptx.count("st.global.v2.b32") == want["row_stores"]
    assert _cast_operand_ops(ptx) <= {"mul.f32", "mul.rn.f32", "mul.f32x2"}
    assert "max.NaN.f32" in ptx and "max.f32" not in ptx


@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.bfloat16, 128), (torch.float16, 128),
                                                 (torch.bfloat16, 64), (torch.float16, 64)],
                         ids=["bf16-128", "fp16-128", "bf16-64", "fp16-64"])
@pytest.mark.parametrize(("v_feature_major", "permute_keys"), [(True, True), (False, False)],
                         ids=["v-feature-major", "v-token-major"])
def test_transforms_compile_on_sm90_without_spills(flags, dtype, head_dim, v_feature_major,
                                                   permute_keys, plain_ptx, tmp_path):
    ptx, usage = _build(tmp_path, "quant", dtype, head_dim, "sm_90a", v_feature_major,
                        permute_keys, **FLAGS[flags])
    assert usage.spill_bytes == 0 and usage.registers <= 128, usage
    _check_transform_ptx(ptx, plain_ptx("sm_90a", head_dim, v_feature_major, dtype), head_dim,
                         True, FLAGS[flags])


@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize(("dtype", "head_dim", "v_feature_major"),
                         [(torch.bfloat16, 128, True), (torch.float16, 64, False)],
                         ids=["bf16-128-v-feature-major", "fp16-64-v-token-major"])
def test_transforms_compile_on_sm120(flags, dtype, head_dim, v_feature_major, plain_ptx,
                                     tmp_path):
    ptx, usage = _build(tmp_path, "quant", dtype, head_dim, "sm_120a", v_feature_major,
                        v_feature_major, **FLAGS[flags])
    assert usage.spill_bytes == 0, usage
    _check_transform_ptx(ptx, plain_ptx("sm_120a", head_dim, v_feature_major, dtype), head_dim,
                         True, FLAGS[flags])


@pytest.mark.parametrize("flags", ["smooth", "both"])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_a_build_without_the_shift_smooths_k_and_computes_no_q_dot_m(flags, arch, plain_ptx,
                                                                      tmp_path):
    """write_shift=False (a call that drops the LSE): k smoothed as before; q's CTAs read no m,
    make no dot and store no shift."""
    ptx, usage = _build(tmp_path, "quant", torch.bfloat16, 128, arch, True, True,
                        **FLAGS[flags], write_shift=False)
    assert usage.spill_bytes == 0, usage
    _check_transform_ptx(ptx, plain_ptx(arch), 128, True, {**FLAGS[flags], "write_shift": False})


def test_smoothing_without_q_writes_no_shift(plain_ptx, tmp_path):
    """quant_kv smooths k (m read once per CTA, then per chunk from shared memory) and has no q
    rows to shift."""
    ptx, usage = _build(tmp_path, "quant_kv", torch.bfloat16, 128, "sm_90a", True, True,
                        smooth_k=True)
    assert usage.spill_bytes == 0
    _check_transform_ptx(ptx, plain_ptx("sm_90a"), 128, False, {"smooth_k": True})


def test_transforms_the_launch_cannot_do_are_refused():
    with pytest.raises(ValueError, match="rotate_qk needs q rotated like k"):
        compile_kernel("quant_kv", torch.bfloat16, 128, "sm_90a", rotate_qk=True)
    with pytest.raises(ValueError, match="no smooth_k, rotate_qk or quantize_v=False"):
        compile_kernel("expand", torch.float32, 0, "sm_90a", smooth_k=True)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        compile_kernel("quant", torch.bfloat16, 96, "sm_90a", rotate_qk=True)

