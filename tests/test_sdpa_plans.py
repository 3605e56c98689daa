"""A repeated SDPA drop-in call (tuner.sdpa.repeated), on the CPU with the device work stood in
(benchmarks/host_stub.py): it launches the plan of its transposed call on the SDPA-layout tensors
themselves, with the launch arguments of the checked call, without its checks or transposes;
every call it must not serve takes the checked path. The output bits on a GPU:
tests/gpu/test_sdpa_gpu.py."""

import numpy
import pytest
import torch

import tuner
from benchmarks.host_stub import device_work
from tests.doubles.recording import recorded_launches
from tests.test_call_plans import qkv
from tuner import plans, runtime, sdpa
from tuner.errors import TunerError
from tuner.integrations import routing
from variants import input_checks


@pytest.fixture
def device():
    with recorded_launches() as recorded:
        yield recorded


def sdpa_inputs(layout: str, **kw):
    """SDPA-layout (batch, heads, seq_len, head_dim) q, k, v: `contiguous` in that layout (what a
    RoPE written per head gives), or `projected`, transposes of contiguous (batch, seq_len,
    heads, head_dim) tensors (a projection viewed as heads, then transposed)."""
    q, k, v = qkv(**kw)
    if layout == "contiguous":
        return tuple(x.transpose(1, 2).contiguous() for x in (q, k, v))
    return tuple(x.transpose(1, 2) for x in (q, k, v))


def launches_of(seen, call):
    seen.clear()
    out = call()
    return out, [(fn.name, values) for fn, values in seen]


def scratch_free(launches, out, inputs):
    """Each launch's values, the scratch block's and output's pointers left out (fresh each
    call); the caller's pointers kept."""
    keep = {x.data_ptr() for x in inputs}
    return [(name, tuple(v for v in values if v in keep or not _pointer(v, out)))
            for name, values in launches]


def _pointer(value, out) -> bool:
    return isinstance(value, int) and value > 1 << 32 or value == out.data_ptr()


@pytest.mark.parametrize("layout", ["contiguous", "projected"])
@pytest.mark.parametrize("kw", [{}, {"kv_heads": 1, "heads": 4, "gqa": True},
                                {"causal": True}], ids=["full", "gqa", "causal"])
def test_a_repeated_drop_in_call_launches_the_checked_calls_arguments_without_its_checks(
        device, monkeypatch, layout, kw):
    launches, seen = device
    kw = dict(kw)
    gqa, causal = kw.pop("gqa", False), kw.pop("causal", False)
    q, k, v = sdpa_inputs(layout, seq=128, **kw)

    def call():
        return tuner.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa,
                                                  scale=0.1)

    first, checked = launches_of(seen, call)
    second, again = launches_of(seen, call)  # the first fast call reads the layout
    failed = []
    monkeypatch.setattr(sdpa, "unsupported", lambda *a: failed.append(a))
    monkeypatch.setattr(input_checks, "check_qkv", lambda *a, **kw: failed.append(a))
    third, fast = launches_of(seen, call)
    assert not failed
    assert third.data_ptr() in fast[-1][1]  # the kernel writes the returned output
    assert [name for name, _ in fast] == [name for name, _ in checked]
    for out in (first, second, third):
        assert out.shape == q.shape and out.dtype == torch.bfloat16
        assert out.stride() == out.transpose(1, 2).contiguous().transpose(1, 2).stride()
    assert scratch_free(fast, third, (q, k, v)) == scratch_free(checked, first, (q, k, v))
    assert scratch_free(again, second, (q, k, v)) == scratch_free(checked, first, (q, k, v))
    if layout == "projected":  # read in place: no view, no copy, the two allocations
        work = device_work(call, launches)
        assert work["views"] == 0
        assert work["ops"] == {"factory empty": 1, "factory empty_strided": 1}


def test_a_call_of_another_signature_or_layout_never_runs_anothers_plan(device):
    _, seen = device
    q, k, v = sdpa_inputs("contiguous", seq=128)
    for _ in range(2):
        tuner.scaled_dot_product_attention(q, k, v)
    _, causal = launches_of(seen, lambda: tuner.scaled_dot_product_attention(q, k, v,
                                                                             is_causal=True))
    _, plain = launches_of(seen, lambda: tuner.scaled_dot_product_attention(q, k, v))
    assert causal[-1][0] != plain[-1][0]  # another kernel build
    # Same shapes, the other layout: its own strides reach the quantization.
    p, pk, pv = sdpa_inputs("projected", seq=128)
    for _ in range(3):
        _, got = launches_of(seen, lambda: tuner.scaled_dot_product_attention(p, pk, pv))
        quant = [values for name, values in got if name.startswith("prepare quant")][-1]
        assert quant[1] == pk.data_ptr() and quant[19:22] == (0, pk.shape[1] * 128, 128)
    _, back = launches_of(seen, lambda: tuner.scaled_dot_product_attention(q, k, v))
    quant = [values for name, values in back if name.startswith("prepare quant")][-1]
    assert quant[1] == k.data_ptr() and quant[19:22] == (0, 128, k.shape[2] * 128)


def test_the_gqa_flag_and_the_error_budget_are_part_of_the_signature(device, monkeypatch):
    q, k, v = sdpa_inputs("projected", seq=128, heads=4, kv_heads=2)
    for _ in range(2):
        tuner.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with pytest.raises(TunerError, match="enable_gqa=True"):  # as torch's SDPA refuses it
        tuner.scaled_dot_product_attention(q, k, v)
    layouts = []
    real = routing.checked_call
    monkeypatch.setattr(routing, "checked_call", lambda *a: layouts.append(1) or real(*a))
    # The drop-in's calls above made the plan of max_error None; another budget's first call is
    # a checked one.
    for max_error, checked in ((None, []), (0.5, [1]), (0.5, [1]), (None, [1])):
        with routing.SdpaRouter(max_error=max_error):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert layouts == checked


def test_a_misaligned_view_of_a_known_layout_is_not_read_in_place(device):
    _, seen = device
    q, k, v = sdpa_inputs("projected", seq=128)  # a layout the plan reads in place
    for _ in range(2):
        tuner.scaled_dot_product_attention(q, k, v)
    flat = torch.randn(k.numel() + 8, dtype=k.dtype)
    misaligned = flat[1:1 + k.numel()].view(k.transpose(1, 2).shape).transpose(1, 2)
    assert misaligned.stride() == k.stride() and misaligned.data_ptr() % 16
    out, got = launches_of(seen, lambda: tuner.scaled_dot_product_attention(q, misaligned, v))
    # prepare's path (it copies such an input) instead of the plan's launches on its address
    assert got and all(misaligned.data_ptr() not in values for _, values in got)
    assert out.shape == q.shape


def test_fp16_inputs_get_fp16_and_an_odd_scale_or_flag_takes_the_checked_path(device,
                                                                               monkeypatch):
    q, k, v = sdpa_inputs("contiguous", seq=128, dtype=torch.float16)
    for causal in (False, True):
        for _ in range(3):
            out = tuner.scaled_dot_product_attention(q, k, v, is_causal=causal)
            assert out.dtype == torch.float16 and out.shape == q.shape
    with pytest.raises(TunerError, match="softmax_scale"):
        tuner.scaled_dot_product_attention(q, k, v, scale=-1.0)
    with pytest.raises(TunerError, match="dropout_p"):
        tuner.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    checked = []
    real = sdpa.unsupported
    monkeypatch.setattr(sdpa, "unsupported", lambda *a: checked.append(a[5]) or real(*a))
    tuner.scaled_dot_product_attention(q, k, v, is_causal=1)  # equal to True as a key
    tuner.scaled_dot_product_attention(q, k, v, scale=numpy.float64(0.1))  # not a plain float
    assert checked == [1, False]


def test_inputs_that_require_grad_or_a_capture_take_the_checked_path(device, tmp_path):
    q, k, v = sdpa_inputs("contiguous", seq=128)
    for _ in range(2):
        tuner.scaled_dot_product_attention(q, k, v)
    with tuner.capture(tmp_path / "calib.safetensors") as recorder:
        tuner.scaled_dot_product_attention(q, k, v)
    assert [r.seen for r in recorder.problems.values()] == [1]
    q.requires_grad_()
    out = tuner.scaled_dot_product_attention(q, k, v)
    with pytest.raises(TunerError, match="has no backward"):
        out.float().sum().backward()


def test_clear_cache_and_a_stale_plan_send_the_next_call_through_the_checks(device,
                                                                              monkeypatch):
    q, k, v = sdpa_inputs("contiguous", seq=128)
    for _ in range(2):
        tuner.scaled_dot_product_attention(q, k, v)
    assert plans.SDPA_CALLS
    runtime.clear_cache()
    assert not plans.SDPA_CALLS
    for _ in range(2):
        tuner.scaled_dot_product_attention(q, k, v)
    plan, = plans.SDPA_CALLS.values()
    plan.fresh_until = 0.0  # as STAMP_INTERVAL_S after the last stamp read
    checked = []
    real = sdpa.unsupported
    monkeypatch.setattr(sdpa, "unsupported", lambda *a: checked.append(1) or real(*a))
    tuner.scaled_dot_product_attention(q, k, v)
    assert checked


def test_the_diffusers_router_serves_a_repeated_call_from_the_plan(device, monkeypatch):
    q, k, v = sdpa_inputs("projected", seq=128)
    with routing.SdpaRouter():
        for _ in range(2):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
        layouts = []
        real = routing.checked_call
        monkeypatch.setattr(routing, "checked_call", lambda *a: layouts.append(1) or real(*a))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert not layouts and out.shape == q.shape
