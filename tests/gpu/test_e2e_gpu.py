"""The caller's path on the GPU: the low-overhead launch gives the DSL call's bits, the
FP8 entry point gives attention()'s bits on the same codes, a NaN input poisons its head only."""

import dataclasses

import pytest
import torch

import tuner
from tuner import runtime
from tuner.errors import TunerError
from tuner.problem import Problem
from variants import block_quantize_kernel, load_family
from variants.common.abi import launch_values
from variants.reference import quantize_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("empty_db")]


def qkv(batch, seq, heads, head_dim=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(batch, seq, heads, head_dim, device="cuda", generator=g,
                        dtype=torch.bfloat16) for _ in range(3)]


def _wgmma(**knobs):
    """The head_dim-128 default with Q from prepare unless knobs say otherwise (at S=1000 the
    default itself quantizes Q in the kernel), K smoothing off: attention_fp8 takes the codes
    of the plain path."""
    fam = load_family("wgmma")
    base = dataclasses.replace(fam.default("sm_90a", Problem(1, 4, 1000, 128)).without_transforms(),
                               q_quant="prepare")
    return dataclasses.replace(base, **knobs)


# q_quant=kernel: attention() quantizes Q in the kernel, attention_fp8 runs the prepare twin
# on the gate's codes, so equal bits mean the kernel's codes and scales are the formula's.
CONFIGS = [pytest.param(_wgmma(), id="wgmma-v-prepared"),
           pytest.param(_wgmma(v_layout="kernel"), id="wgmma-v-kernel"),
           pytest.param(_wgmma(q_quant="kernel"), id="wgmma-q-kernel"),
           pytest.param(_wgmma(q_quant="kernel", v_layout="kernel", p_source="smem",
                               intra_wg_overlap=False, persistent=False, split_tail=False),
                        id="wgmma-q-kernel-v-kernel-smem-plain"),
           pytest.param(None, id="mma_sync-default")]


def _config(cfg, problem):
    if cfg is None:  # mma_sync has no fast path on Hopper, but must be correct on it
        return load_family("mma_sync").default("sm_90a", problem).without_transforms()
    return cfg


@pytest.mark.parametrize("cfg", CONFIGS)
def test_fast_launch_gives_the_bits_of_the_dsl_call(cfg):
    q, k, v = qkv(2, 1000, 4, seed=1)
    problem = Problem(2, 4, 1000, 128)
    cfg = _config(cfg, problem)
    kernel = runtime._kernel_for(runtime.family_of(cfg), cfg, problem, "auto")
    prepared = kernel.prepare(q, k, v)
    again = kernel.prepare(q, k, v)  # the quantize kernels' second launch: the fast path
    assert torch.equal(prepared.q.view(torch.uint8), again.q.view(torch.uint8))  # or bf16 q
    assert torch.equal(prepared.v.view(torch.uint8), again.v.view(torch.uint8))
    # The scales the kernel reads (q_quant=kernel: q's part of the buffer is left unwritten).
    kv_from = prepared.scale_layout.q_size if prepared.q_in_kernel else 0
    assert torch.equal(prepared.packed[kv_from:], again.packed[kv_from:])
    kernel.run(prepared)  # first launch: through the DSL's checked call
    fast, fast_lse = kernel.run(prepared)
    # The build that launched (a split_tail default runs its twin here: 8 strips a tile, kept
    # whole, so the launch needs no workspace and launch_values' null pointer below is right).
    kernel = kernel.kernel_for(prepared)
    launcher, extra = kernel._launcher(q.device)
    # The launches after the first call the host stub directly (variants/launch.py), this
    # DSL version's executor exposing what that needs: the bits below are that path's.
    assert launcher.direct
    assert all(fl.direct for fl in block_quantize_kernel.LAUNCHERS.launchers() if fl._checked)
    out = torch.full_like(fast, float("nan"))
    lse = torch.full_like(fast_lse, float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    dsl_args = launcher.dsl_args(launch_values(prepared, out, lse, stream, extra=extra))
    kernel._fn(*dsl_args)
    torch.cuda.synchronize()
    assert torch.equal(out, fast) and torch.equal(lse, fast_lse)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("seq", [1000, 4096])
def test_attention_fp8_gives_attentions_bits_on_the_same_codes(cfg, seq):
    q, k, v = qkv(2, seq, 4, seed=seq)
    cfg = _config(cfg, Problem(2, 4, seq, 128))
    ref = quantize_reference(q, k, v)
    want, want_lse = tuner.attention(q, k, v, config=cfg, return_lse=True)
    got, got_lse = tuner.attention_fp8(ref.q, ref.k, ref.v, *ref.entry_descales(), config=cfg,
                                       return_lse=True)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)


def test_attention_fp8_takes_one_descale_per_tensor():
    q, k, v = qkv(1, 512, 2, seed=3)
    codes = [x.to(torch.float8_e4m3fn) for x in (q, k, v)]  # |x| < 448: descale 1
    one = torch.ones(1, dtype=torch.float32, device="cuda")
    per_head = torch.ones(1, 2, dtype=torch.float32, device="cuda")
    a = tuner.attention_fp8(*codes, one, one, one)
    b = tuner.attention_fp8(*codes, per_head, per_head, per_head)
    assert torch.equal(a, b) and torch.isfinite(a).all()


def test_attention_fp8_names_bad_input():
    q, k, v = qkv(1, 64, 2)
    one = torch.ones(1, 2, dtype=torch.float32, device="cuda")
    with pytest.raises(TunerError, match="q has dtype torch.bfloat16; attention_fp8 takes"):
        tuner.attention_fp8(q, k, v, one, one, one)
    codes = [x.to(torch.float8_e4m3fn) for x in (q, k, v)]
    with pytest.raises(TunerError, match=r"k_descale has shape \(3,\); it must broadcast"):
        tuner.attention_fp8(*codes, one, torch.ones(3, device="cuda"), one)
    with pytest.raises(TunerError, match="v_descale must be a float32 tensor"):
        tuner.attention_fp8(*codes, one, one, one.half())


@pytest.mark.parametrize("pv_dtype", ["e4m3", "bf16"])
def test_a_nan_input_poisons_what_reads_it_and_check_finite_names_it(pv_dtype):
    """A NaN reaches every output that reads it, nothing else: one in q makes its row's scale
    NaN (that row only); one in v, with e4m3 P.V, its 64-key block's scale, which every
    output of that head reads; with bf16 P.V (V unquantized) the one feature it sits in, of
    every row of that head. The config is pinned: the lookup's nearest row may be either."""
    problem = Problem(1, 4, 1000, 128)
    cfg = dataclasses.replace(load_family("wgmma").default("sm_90a", problem), pv_dtype=pv_dtype)
    q, k, v = qkv(1, 1000, 4, seed=5)
    q[0, 17, 2, 5] = float("nan")
    out = tuner.attention(q, k, v, config=cfg)
    assert torch.isnan(out[0, 17, 2]).all()
    nan = torch.isnan(out)
    assert int(nan.any(dim=-1).sum()) == 1  # no other (row, head) touched
    with pytest.raises(TunerError, match="q contains 1 NaN/Inf values"):
        tuner.attention(q, k, v, check_finite=True, config=cfg)
    q, k, v = qkv(1, 1000, 4, seed=6)
    v[0, 300, 1, 7] = float("nan")
    out = tuner.attention(q, k, v, config=cfg)
    read = out[:, :, 1] if pv_dtype == "e4m3" else out[:, :, 1, 7]
    assert torch.isnan(read).all()
    assert int(torch.isnan(out).sum()) == read.numel()  # nothing else
