"""A repeated tuner.attention call on its plan (tuner/plans.py, variants/launch_plan.py), on the CPU
with the device work stood in (benchmarks/host_stub.py: CPU tensors pass for CUDA ones, launches
are recorded): a call of another signature never runs another's plan, a changed database is
seen within STAMP_INTERVAL_S (at once after clear_cache), the launches carry what prepare + run
would pass, and a repeated call makes two launches and two allocations (K smoothing adds its
sampled mean). The output bits on a
GPU: tests/gpu/test_runtime_gpu.py."""

import dataclasses
import sys

import pytest
import torch

import tuner
from benchmarks.host_stub import device_work
from tests.doubles.recording import recorded_launches
from tuner import api, plans, runtime
from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.store import Store, TrialRecord
from variants import mma_sync, wgmma
from variants.build import CompiledKernel

ARCH = "sm_90a"
ZERO_OUTPUTS = []


@pytest.fixture
def device():
    """(launch Counter, recorded launches [(function, values)]) inside the stand-in; with
    ZERO_OUTPUTS set, the outputs a call reads back are zeros (tests/doubles/recording.py)."""
    with recorded_launches(lambda: ZERO_OUTPUTS, HEAD_DIM) as recorded:
        yield recorded


HEAD_DIM = 128


def qkv(batch=1, seq=256, heads=2, seq_kv=None, kv_heads=None, dtype=torch.bfloat16,
        device="cpu"):
    kv_shape = (batch, seq_kv or seq, kv_heads or heads, HEAD_DIM)
    return (torch.randn(batch, seq, heads, HEAD_DIM, dtype=dtype, device=device),
            torch.randn(kv_shape, dtype=dtype, device=device),
            torch.randn(kv_shape, dtype=dtype, device=device))


def attention_launches(seen):
    return [(fn, values) for fn, values in seen if fn.name.startswith("attention")]


def test_a_repeated_call_runs_its_plan_without_checks_or_lookup(device, monkeypatch):
    launches, _ = device
    q, k, v = qkv()
    tuner.attention(q, k, v)
    import variants.input_checks

    def fail(*_args, **_kw):
        raise AssertionError("a repeated call took the checked path")

    monkeypatch.setattr(variants.input_checks, "check_qkv", fail)
    monkeypatch.setattr(runtime, "attention_plan", fail)
    out = tuner.attention(q, k, v)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    out, lse = tuner.attention(q, k, v, return_lse=True)
    assert lse.shape == (1, 2, 256) and lse.dtype == torch.float32


@pytest.mark.parametrize("return_lse, allocations", [(False, 2), (True, 3)])
def test_a_repeated_call_makes_two_launches_and_one_scratch_block(device, return_lse,
                                                                  allocations):
    """The quantization and the kernel; the scratch block and the output (and the LSE the
    caller keeps), with K smoothing off. Before the plans: five or six allocations."""
    launches, _ = device
    q, k, v = qkv()
    plain = wgmma.default(ARCH, Problem(1, 2, 256)).without_transforms()
    work = device_work(lambda: tuner.attention(q, k, v, return_lse=return_lse, config=plain),
                       launches)
    assert work["launches"] == 2 and len(work["stub"]) == 2
    assert work["allocations"] == allocations and work["ops"] == {"factory empty": allocations}


def test_k_smoothing_adds_one_launch_and_no_torch_op_to_a_call_that_drops_the_lse(device):
    """The default's K smoothing: its sampled mean is one more launch (the mean kernel, into
    the scratch block) before the same two launches; no torch reduction, no allocation."""
    launches, _ = device
    q, k, v = qkv()
    assert wgmma.default(ARCH, Problem(1, 2, 256)).k_smoothing == "mean"
    work = device_work(lambda: tuner.attention(q, k, v), launches)
    assert work["launches"] == 3 and work["stub"]["prepare mean"] == 1
    assert work["ops"] == {"factory empty": 2}


@pytest.mark.parametrize("capture_first", [False, True])
def test_only_a_call_that_returns_the_lse_has_the_quantization_compute_q_dot_m(
        device, capture_first, monkeypatch):
    """K smoothing's q . m is for the LSE alone: a call that drops the LSE runs the quantization
    build without it (no shift buffer); one that returns it, the build that writes it into the
    scratch block (prepare's, compiled by the first call). Inside a CUDA-graph capture where
    that build does not exist, the call adds q_dot's shift instead (a capture must not compile)."""
    from variants import block_quantize_kernel, launch_plan
    from variants.launch import LauncherCache

    _, seen = device
    q, k, v = qkv()
    config = dataclasses.replace(wgmma.default(ARCH, Problem(1, 2, 256)), q_quant="prepare")
    assert config.k_smoothing == "mean"
    tuner.attention(q, k, v, config=config)  # prepare + run, which make the plan
    seen.clear()
    tuner.attention(q, k, v, config=config)
    (fn, values), = [(fn, values) for fn, values in seen if fn.name == "prepare quant"]
    assert fn.built.write_shift is False and values[8] == 0
    dots = []
    real_q_dot = launch_plan.q_dot
    monkeypatch.setattr(launch_plan, "q_dot", lambda *a: dots.append(a) or real_q_dot(*a))
    monkeypatch.setattr(launch_plan, "capturing", lambda: capture_first)
    if capture_first:  # no build of the quantization with q . m yet (prepare's came first)
        monkeypatch.setattr(block_quantize_kernel, "LAUNCHERS", LauncherCache("empty"))
    seen.clear()
    out, lse = tuner.attention(q, k, v, return_lse=True, config=config)
    (fn, values), = [(fn, values) for fn, values in seen if fn.name == "prepare quant"]
    plan = plans.CALLS[api.signature(q, k, v, False, config, "auto", None, None)].launch
    if capture_first:
        assert fn.built.write_shift is False and values[8] == 0 and len(dots) == 1
    else:
        scratch = values[4] - plan.parts()["k8"]  # the scratch block's base
        assert fn.built.write_shift is True and not dots
        assert values[8] == scratch + plan.parts()["shift"]
    assert lse.shape == (1, 2, 256)


def test_split_tail_takes_its_workspace_from_the_scratch_block_and_zeroes_nothing(device):
    """B=9 S=2048 H=1: 144 tiles on 132 SMs, a tail of 12 that split_tail splits; its
    workspace is part of the scratch block, and the host zeroes none of it (the kernel's whole
    tiles' program zeroes the counters): three launches, no memset, no torch op."""
    from variants.wgmma.split_tail import workspace_words

    launches, seen = device
    q, k, v = qkv(batch=9, seq=2048, heads=1)
    work = device_work(lambda: tuner.attention(q, k, v), launches)
    # K smoothing's mean, the quantization and the kernel
    assert work["launches"] == 3 and len(work["stub"]) == 3
    assert work["ops"] == {"factory empty": 2}
    plan = plans.CALLS[api.signature(q, k, v, False, None, "auto", None, None)].launch
    parts = plan.parts()
    _, values = attention_launches(seen)[-1]
    base = values[3] - parts["packed"]  # the packed scales' pointer, in the scratch block
    assert parts["workspace"] is not None and values[6] == base + parts["workspace"]
    assert parts["workspace"] + 4 * workspace_words(128, 128, 8, 132) <= plan.scratch_bytes


# ---- the signature: a call of another signature never runs another's plan ----------------------

@pytest.mark.parametrize("change", ["q length", "kv length", "kv heads", "batch"])
def test_another_shape_runs_its_own_plan(device, change):
    _, seen = device
    first = qkv(batch=1, seq=256, heads=4)
    second = {"q length": qkv(seq=384, heads=4, seq_kv=256),
              "kv length": qkv(seq=256, heads=4, seq_kv=128),
              "kv heads": qkv(seq=256, heads=4, kv_heads=2),
              "batch": qkv(batch=2, seq=256, heads=4)}[change]
    tuner.attention(*first)
    tuner.attention(*first)
    seen.clear()
    out = tuner.attention(*second)
    (_, values), = attention_launches(seen)
    q, k, _ = second
    # batch, heads, seq_len ... kv_heads, seq_len_kv: the ABI's scalars (variants/common/abi.py)
    assert values[7:10] == (q.shape[0], q.shape[2], q.shape[1])
    assert values[12:14] == (k.shape[2], k.shape[1]) and out.shape == q.shape


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_another_dtype_or_device_of_one_input_is_checked_not_planned(device, which):
    """A plan made for all-bf16 inputs on one device: a call with one input in fp16, or on
    another device, is refused as the first call would be (TunerError), not run on it."""
    tuner.attention(*qkv(device="meta"))
    tuner.attention(*qkv(device="meta"))
    for other in (dict(dtype=torch.float16, device="meta"), dict(device="cpu")):
        inputs = dict(zip("qkv", qkv(device="meta"), strict=True))
        inputs[which] = dict(zip("qkv", qkv(**other), strict=True))[which]
        with pytest.raises(TunerError, match="dtypes differ|different devices"):
            tuner.attention(*inputs.values())


def test_another_dtype_or_device_of_all_inputs_runs_its_own_plan(device):
    launches, seen = device
    tuner.attention(*qkv(device="meta"))
    tuner.attention(*qkv(device="meta"))
    out = tuner.attention(*qkv(device="cpu"))
    assert out.device.type == "cpu"
    seen.clear()
    tuner.attention(*qkv(seq=1024, dtype=torch.float16))  # wgmma's q_quant=kernel reads bf16
    tuner.attention(*qkv(seq=1024))
    quant = [fn.name for fn, _ in seen if fn.name.startswith("prepare")]
    assert quant == ["prepare mean", "prepare quant", "prepare mean", "prepare quant_kv"]


def test_k_and_v_of_different_shapes_are_refused_after_a_plan(device):
    q, k, v = qkv(seq=256, seq_kv=128)
    tuner.attention(q, k, v)
    tuner.attention(q, k, v)
    longer = qkv(seq=256)[2]
    with pytest.raises(TunerError, match="k and v shapes differ"):
        tuner.attention(q, k, longer)
    with pytest.raises(TunerError, match="k and v shapes differ"):
        tuner.attention(q, longer, v)


def test_the_mask_and_its_type_are_part_of_the_signature(device):
    _, seen = device
    q, k, v = qkv()
    tuner.attention(q, k, v)
    tuner.attention(q, k, v)
    full = attention_launches(seen)[-1][0]
    seen.clear()
    tuner.attention(q, k, v, causal=True)
    tuner.attention(q, k, v, causal=True)
    causal = {fn for fn, _ in attention_launches(seen)}
    assert len(causal) == 1 and full not in causal  # the causal build, both times
    with pytest.raises(TunerError, match="causal must be True or False"):
        tuner.attention(q, k, v, causal=1)
    with pytest.raises(TunerError, match="return_lse must be True or False"):
        tuner.attention(q, k, v, return_lse=1)


def test_a_pinned_config_runs_its_own_plan(device):
    _, seen = device
    q, k, v = qkv()
    default = wgmma.default(ARCH, Problem(1, 2, 256))
    other = dataclasses.replace(default, block_n=64)
    for config in (None, default, other, mma_sync.default(ARCH)):
        tuner.attention(q, k, v, config=config)
        seen.clear()
        tuner.attention(q, k, v, config=config)
        (fn, _), = attention_launches(seen)
        plan = plans.CALLS[api.signature(q, k, v, False, config, "auto", None, None)]
        assert fn is plan.kernel.kernel_for(plan.kernel.prepare(q, k, v))._fn
        assert config is None or plan.kernel.config == config
    assert plans.CALLS[api.signature(q, k, v, False, other, "auto", None, None)].kernel \
        is not plans.CALLS[api.signature(q, k, v, False, default, "auto", None, None)].kernel


def test_a_config_with_per_head_kv_scales_quantizes_through_prepare_every_call(device):
    """prepare's one-launch quantization writes block scales, so a kv_scales="head" config has
    no launch plan: every call quantizes per head through prepare (torch), then launches."""
    _, seen = device
    q, k, v = qkv()
    head = dataclasses.replace(wgmma.default(ARCH, Problem(1, 2, 256)), q_quant="prepare",
                               kv_scales="head")
    for _ in range(2):
        seen.clear()
        tuner.attention(q, k, v, config=head)
        assert [fn.name for fn, _ in seen if fn.name.startswith("prepare")] == []
        assert len(attention_launches(seen)) == 1
    plan = plans.CALLS[api.signature(q, k, v, False, head, "auto", None, None)]
    assert plan.kernel.config == head


# ---- the database: its winners, a change, the URL ----------------------------------------------

DEFAULT = wgmma.default(ARCH, Problem(1, 2, 256))
WINNER = dataclasses.replace(DEFAULT, kv_stages=3)
OTHER = dataclasses.replace(DEFAULT, block_n=64)


def add_winner(url, cfg, error=None, seq=256):
    store = Store(url)
    store.record_device("host-stub", {"name": "H100", "compute_capability": "9.0",
                                      "sm_count": 132})
    problem = Problem(1, 2, seq, 128)
    trial = store.record_trial(TrialRecord(
        id=None, device_id="host-stub", problem_key=problem.key(), family_set="wgmma",
        family="wgmma", config=cfg.to_dict(), config_hash=cfg.short(), outcome="ok",
        median_ms=1.0, e2e_error=error))
    store.set_best("host-stub", problem, "wgmma", trial, None, None)
    store.close()


def config_run(q, k, v, **kw):
    tuner.attention(q, k, v, **kw)
    key = api.signature(q, k, v, False, None, kw.get("gpu", "auto"), kw.get("db"),
                        kw.get("max_error"))
    return plans.CALLS[key].kernel.config


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(plans, "_monotonic", lambda: now[0])
    return now


def test_a_changed_database_is_seen_within_the_stamp_interval(device, clock, monkeypatch):
    q, k, v = qkv()
    url = runtime.db_url(None)
    add_winner(url, WINNER)
    assert config_run(q, k, v) == WINNER
    add_winner(url, OTHER)
    stamps = []
    real = runtime._Resolver._db_stamp
    monkeypatch.setattr(runtime._Resolver, "_db_stamp",
                        staticmethod(lambda u: stamps.append(u) or real(u)))
    clock[0] += plans.STAMP_INTERVAL_S / 2
    for _ in range(5):
        assert config_run(q, k, v) == WINNER  # not stale yet: no stat, the old winner
        runtime.run_attention(q, k, v, None, "", "auto", None, False)  # the custom op's body
    assert stamps == []
    clock[0] += plans.STAMP_INTERVAL_S
    assert config_run(q, k, v) == OTHER
    assert stamps  # read once more, and found changed


def test_clear_cache_makes_the_next_call_read_the_database(device, clock):
    q, k, v = qkv()
    url = runtime.db_url(None)
    add_winner(url, WINNER)
    assert config_run(q, k, v) == WINNER
    add_winner(url, OTHER)
    runtime.clear_cache()
    assert config_run(q, k, v) == OTHER


def test_another_tuner_db_url_is_seen_within_the_stamp_interval(device, clock, monkeypatch,
                                                                tmp_path):
    q, k, v = qkv()
    add_winner(runtime.db_url(None), WINNER)
    assert config_run(q, k, v) == WINNER
    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    add_winner(other, OTHER)
    monkeypatch.setenv("TUNER_DB_URL", other)
    clock[0] += plans.STAMP_INTERVAL_S + 0.1
    assert config_run(q, k, v) == OTHER


def test_the_gpu_the_db_argument_and_max_error_are_part_of_the_signature(device, tmp_path):
    q, k, v = qkv()
    # The stand-in is an H100 (no shipped table); the H200's table has a nearer winner.
    assert config_run(q, k, v) == DEFAULT
    assert config_run(q, k, v, gpu="h200") == runtime.config_for_problem(
        Problem(1, 2, 256), gpu="h200").config != DEFAULT
    runtime.clear_cache()
    add_winner(runtime.db_url(None), WINNER, error=0.2)
    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    add_winner(other, OTHER)
    assert config_run(q, k, v) == WINNER
    assert config_run(q, k, v, db=other) == OTHER
    within = config_run(q, k, v, max_error=0.1)  # the winner is over it: the default
    assert within == DEFAULT
    assert config_run(q, k, v) == WINNER


# ---- what the launches carry ------------------------------------------------------------------

CASES = {
    "q quantized in the kernel": dict(seq=1024),
    "split tail": dict(batch=9, seq=2048, heads=1),
    "ragged, grouped, cross": dict(seq=1000, heads=4, kv_heads=2, seq_kv=700),
    "K smoothing": dict(config=dict(k_smoothing="mean", q_quant="prepare")),
    "K smoothing, q in the kernel": dict(seq=1024, config=dict(k_smoothing="mean")),
    "rotation": dict(config=dict(qk_rotation="hadamard", q_quant="prepare")),
    "V transposed in the kernel": dict(config=dict(v_layout="kernel")),
    "P.V in bf16": dict(seq=1000, heads=4, kv_heads=2, config=dict(pv_dtype="bf16")),
    "P.V in bf16, split tail": dict(batch=9, seq=2048, heads=1,
                                    config=dict(pv_dtype="bf16", split_tail=True)),
    "QK^T in int8, P.V in bf16": dict(seq=1000, heads=4, kv_heads=2,
                                      config=dict(qk_dtype="int8", pv_dtype="bf16",
                                                  q_quant="prepare")),
    "causal": dict(seq=512, causal=True),
    "mma_sync": dict(seq=500, family="mma_sync"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("want_lse", [True, False])
def test_the_plan_launches_what_prepare_and_run_launch(device, case, want_lse, monkeypatch):
    """Against CompiledKernel.prepare + run on the same inputs: the same launchers, the same
    input pointers and scalars, the kernel reading the codes and scales the quantization wrote
    (each part 16-byte aligned, inside the scratch block), the same LSE (the stand-in's zeros,
    plus K smoothing's shift where asked)."""
    _, seen = device
    spec = dict(CASES[case])
    knobs, family, causal = spec.pop("config", None), spec.pop("family", "wgmma"), \
        spec.pop("causal", False)
    q, k, v = qkv(**spec)
    problem = runtime.problem_of(q, k, causal)
    config = None
    if family == "mma_sync":
        config = mma_sync.default(ARCH)
    elif knobs:
        config = dataclasses.replace(wgmma.default(ARCH, problem), **knobs)
    tuner.attention(q, k, v, causal=causal, config=config)
    plan = plans.CALLS[api.signature(q, k, v, causal, config, "auto", None, None)]
    monkeypatch.setattr(sys.modules[__name__], "ZERO_OUTPUTS", [True])
    seen.clear()
    out, lse = plan.launch(q, k, v, 0.07, want_lse, True)
    hot = list(seen)
    seen.clear()
    kernel = plan.kernel
    prepared = kernel.prepare(q, k, v, 0.07, validate=False)
    want_out, want_lse_tensor = kernel.run(prepared, want_lse=want_lse)
    general = list(seen)
    smooth = kernel.config.k_smoothing == "mean"
    # prepare's quantization writes q . m wherever it quantizes q with smoothing; the call's
    # only where it returns the LSE (a build of its own, the same launch less the dot).
    writes_shift = smooth and not kernel.config.q_in_kernel
    hot_fns, general_fns = [fn for fn, _ in hot], [fn for fn, _ in general]
    if writes_shift and not want_lse:
        hot_quant, general_quant = hot_fns.pop(1), general_fns.pop(1)
        assert hot_quant.built.write_shift is False and general_quant.built.write_shift is True
        assert {k: v for k, v in vars(hot_quant.built).items() if k != "write_shift"} == \
            {k: v for k, v in vars(general_quant.built).items() if k != "write_shift"}
    assert hot_fns == general_fns
    assert len(hot) == 2 + smooth
    if smooth:  # the mean kernel on the caller's k, into the vector the quantization reads
        (_, mean), (_, mean_ref) = hot.pop(0), general.pop(0)
        assert mean[0] == mean_ref[0] == k.data_ptr() and mean[2:-1] == mean_ref[2:-1]
        assert (mean[1], mean_ref[1]) == (hot[0][1][7], general[0][1][7])
        at = plan.launch.parts()  # the scratch block's base, from k's codes
        assert mean[1] - at["mean"] == hot[0][1][4] - at["k8"]
    (_, quant), (_, attend) = hot
    (_, quant_ref), (_, attend_ref) = general
    assert quant[:3] == quant_ref[:3] and quant[9:-1] == quant_ref[9:-1]
    assert attend[7:-1] == attend_ref[7:-1]  # scalars, the family's extra ints
    # Present or absent alike: k_mean of the quantization, the kernel's workspace; q . m's
    # buffer where the call returns the LSE.
    assert [bool(x) for x in (quant[7], attend[6])] == \
        [bool(x) for x in (quant_ref[7], attend_ref[6])]
    assert bool(quant[8]) == (writes_shift and want_lse) and bool(quant_ref[8]) == writes_shift
    # The kernel reads what the quantization wrote: q codes (or the caller's q), k, v, scales;
    # a bf16 P.V kernel the caller's v, which the quantization does not write.
    v16 = kernel.config.v_unquantized
    assert (quant[5] == 0, quant_ref[5] == 0) == (v16, v16)
    v_read = v.data_ptr() if v16 else quant[5]
    assert attend[:4] == (quant[3], quant[4], v_read, quant[6])
    assert attend_ref[:4] == (quant_ref[3], quant_ref[4], v_read if v16 else quant_ref[5],
                              quant_ref[6])
    assert attend[4:6] == (out.data_ptr(), lse.data_ptr())
    parts = {name: at for name, at in plan.launch.parts().items() if at is not None}
    assert all(at % 16 == 0 for at in parts.values())
    assert max(parts.values()) < plan.launch.scratch_bytes
    assert (out.shape, lse.shape) == (want_out.shape, want_lse_tensor.shape)
    assert torch.equal(lse, want_lse_tensor)


def test_a_view_of_sdpa_layout_is_quantized_in_place_and_other_views_are_copied(device):
    """A (batch, seq_len, heads, head_dim) view of a (batch, heads, seq_len, head_dim) tensor,
    what the SDPA drop-in hands on: the plan's quantization reads it through its strides (no
    copy, no torch formula). A view whose rows are not contiguous: the plan on a contiguous
    copy of it (one torch copy, no torch formula)."""
    launches, seen = device
    q, k, v = qkv(seq=128)
    tuner.attention(q, k, v)
    tuner.attention(q, k, v)
    sdpa = k.transpose(1, 2).contiguous().transpose(1, 2)
    seen.clear()
    out = tuner.attention(q, sdpa, v)
    # The default here quantizes Q in the kernel: the quantization is quant_kv.
    assert [fn.name.split()[:2] for fn, _ in seen] == [["prepare", "mean"],
                                                        ["prepare", "quant_kv"], ["attention",
                                                                                  "wgmma"]]
    (_, mean), (_, quant) = seen[:2]
    batch, seq, heads, head_dim = sdpa.shape
    # (batch, token, head) element strides: q's and v's contiguous, k's head-major; a batch of
    # one gets stride 0.
    assert batch == 1 and quant[16:25] == (0, heads * head_dim, head_dim, 0, head_dim,
                                           seq * head_dim, 0, heads * head_dim, head_dim)
    assert mean[7:10] == quant[19:22]
    assert out.shape == q.shape
    rows_strided = k.transpose(-1, -2).contiguous().transpose(-1, -2)  # head_dim not contiguous
    work = device_work(lambda: tuner.attention(q, rows_strided, v), launches)
    seen.clear()
    tuner.attention(q, rows_strided, v)
    assert [fn.name.split()[:2] for fn, _ in seen] == [["prepare", "mean"],
                                                        ["prepare", "quant_kv"], ["attention",
                                                                                  "wgmma"]]
    quant = seen[1][1]
    assert quant[1] != rows_strided.data_ptr() and quant[19:22] == (0, heads * head_dim, head_dim)
    assert work["ops"] == {"compute clone": 1, "factory empty": 2}  # k's copy; scratch, out


def test_each_view_is_read_with_its_own_strides_and_a_misaligned_one_is_copied(device):
    """The plan keeps the row strides of the last views it read in place: views of another
    layout of the same shape get theirs, and a view of the same strides whose base is not
    16-byte aligned is copied (its rows cannot be read as 16-byte pieces)."""
    from variants.input_layout import row_strides

    _, seen = device
    q, k, v = qkv(seq=128)
    tuner.attention(q, k, v)
    tuner.attention(q, k, v)
    batch, seq, heads, head_dim = k.shape
    sdpa = k.transpose(1, 2).contiguous().transpose(1, 2)
    fused = torch.randn(batch, seq, 3, heads, head_dim, dtype=k.dtype)[:, :, 1]  # a QKV slice
    flat = torch.randn(k.numel() + 8, dtype=k.dtype)
    misaligned = flat[1:1 + k.numel()].view(batch, heads, seq, head_dim).transpose(1, 2)
    assert misaligned.stride() == sdpa.stride() and misaligned.data_ptr() % 16
    for view in (sdpa, fused, sdpa, misaligned, fused, sdpa):  # misaligned after its layout
        seen.clear()
        tuner.attention(q, view, v)
        quant = [values for fn, values in seen if fn.name.startswith("prepare quant")][-1]
        if view is misaligned:
            assert quant[1] != view.data_ptr() and quant[1] % 16 == 0
            assert quant[19:22] == row_strides(view.contiguous())
        else:
            assert quant[1] == view.data_ptr() and quant[19:22] == row_strides(view)


def test_the_sdpa_drop_in_quantizes_a_rope_layout_in_place(device, monkeypatch):
    """SDPA inputs (batch, heads, seq_len, head_dim) contiguous, as a RoPE applied in that
    layout writes them: k and v reach the quantization as views (their strides in its
    arguments, no copy); only q, which this config's attention kernel reads raw, is copied."""
    from benchmarks.host_stub import device_work

    launches, seen = device
    q, k, v = (x.transpose(1, 2).contiguous() for x in qkv(seq=128))
    tuner.scaled_dot_product_attention(q, k, v)
    tuner.scaled_dot_product_attention(q, k, v)
    prepared = []
    real = CompiledKernel.prepare
    monkeypatch.setattr(CompiledKernel, "prepare",
                        lambda self, *a, **kw: prepared.append(1) or real(self, *a, **kw))
    work = device_work(lambda: tuner.scaled_dot_product_attention(q, k, v), launches)
    assert not prepared  # the plan's launches, not prepare + run
    assert work["ops"].get("compute clone", 0) == 1  # q's, for the kernel's own quantization
    quant = [values for fn, values in seen if fn.name.startswith("prepare quant")][-1]
    _, heads, seq, head_dim = k.shape
    assert quant[19:25] == (0, head_dim, seq * head_dim) * 2  # k's and v's head-major rows
    assert quant[1] == k.data_ptr() and quant[2] == v.data_ptr()


def test_a_capture_records_a_planned_call(device, tmp_path):
    q, k, v = qkv()
    tuner.attention(q, k, v)
    tuner.attention(q, k, v)
    with tuner.capture(tmp_path / "calib.safetensors") as recorder:
        tuner.attention(q, k, v)
    assert [r.seen for r in recorder.problems.values()] == [1]


def test_a_bf16_pv_kernel_runs_its_plan_on_the_callers_v(device, tmp_path):
    """pv_dtype=bf16 reads the caller's unquantized V: its plan quantizes q and k alone (no v
    part in the scratch block) and the kernel gets v's own pointer; fp16 inputs, whose V
    prepare casts to bf16 first, keep prepare + run."""
    _, seen = device
    bf16 = dataclasses.replace(DEFAULT, pv_dtype="bf16")
    url = f"sqlite:///{tmp_path / 'pv16.sqlite'}"
    add_winner(url, bf16)
    q, k, v = qkv()
    for _ in range(2):
        assert config_run(q, k, v, db=url) == bf16
    launch = plans.CALLS[api.signature(q, k, v, False, None, "auto", url, None)].launch
    assert launch is not None and launch.parts()["v8"] is None
    seen.clear()
    tuner.attention(q, k, v, db=url)
    (quant_fn, quant), (_, attend) = [(fn, a) for fn, a in seen if fn.name != "prepare mean"]
    assert quant_fn.name.startswith("prepare quant") and quant[5] == 0
    assert attend[2] == v.data_ptr()
    q, k, v = (x.half() for x in qkv())
    for _ in range(2):
        config_run(q, k, v, db=url)
    assert plans.CALLS[api.signature(q, k, v, False, None, "auto", url, None)].launch is None
    assert attention_launches(seen[-2:])[-1][1][2] != v.data_ptr()  # its bf16 copy


@pytest.mark.parametrize("bad, says", [(-1, "positive"), (0, "positive"), (float("nan"), "finite"),
                                       (float("inf"), "finite"), ("0.1", "number"),
                                       (True, "number")])
def test_a_bad_max_error_is_refused_by_name_before_any_lookup(device, bad, says):
    q, k, v = qkv()
    with pytest.raises(TunerError, match=f"max_error must be .*{says}"):
        tuner.attention(q, k, v, max_error=bad)
    with pytest.raises(TunerError, match=f"max_error must be .*{says}"):
        tuner.load_best_config(256, heads=2, max_error=bad)
