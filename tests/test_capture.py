"""tuner.capture: what it records from tuner.attention, tuner.scaled_dot_product_attention and
torch's SDPA, how it subsamples (whole sequences of sampled (batch, KV head) slices, calls
reservoir-sampled per problem, a byte limit), the file it writes, and what it leaves as it was."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

import tuner
from tuner import api, calibration
from tuner.capturing import Recorder, capture
from tuner.errors import TunerError
from tuner.problem import Problem


def qkv(batch=2, heads=4, seq_len=64, head_dim=64, kv_heads=2, seq_len_kv=None, seed=0,
        dtype=torch.bfloat16):
    """q (batch, seq_len, heads, head_dim), k, v (batch, seq_len_kv, kv_heads, head_dim)."""
    gen = torch.Generator().manual_seed(seed)
    kv = (batch, seq_len_kv or seq_len, kv_heads, head_dim)
    return tuple(torch.randn(s, generator=gen).to(dtype)
                 for s in ((batch, seq_len, heads, head_dim), kv, kv))


def sdpa(q, k, v, **kw):
    """torch's SDPA in its own layout (batch, heads, seq_len, head_dim) on q, k, v of ours."""
    return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), **kw)


def tensors(path):
    with safe_open(str(path), framework="pt") as fh:
        return json.loads(fh.metadata()["calls"]), {n: fh.get_tensor(n) for n in fh.keys()}


def test_torch_sdpa_calls_are_recorded_whole_and_still_computed(tmp_path):
    q, k, v = qkv()
    expected = sdpa(q, k, v, enable_gqa=True, scale=0.1)
    original = F.scaled_dot_product_attention
    path = tmp_path / "c.safetensors"
    with capture(path, slices_per_call=3, seed=1):
        assert F.scaled_dot_product_attention is not original
        got = sdpa(q, k, v, enable_gqa=True, scale=0.1)
    assert F.scaled_dot_product_attention is original
    assert torch.equal(got, expected)
    (call,), stored = tensors(path)
    assert call["problem"] == "b2-h4-s64-d64-full-kvh2" and call["softmax_scale"] == 0.1
    assert call["causal"] is False and len(call["slices"]) == 3
    # Each slice: the whole sequences of one (batch, KV head) and its group of query heads.
    for i, (b, g) in enumerate(call["slices"]):
        assert torch.equal(stored["c0.q"][i], q[b, :, 2 * g:2 * g + 2])
        assert torch.equal(stored["c0.k"][i, :, 0], k[b, :, g])
        assert torch.equal(stored["c0.v"][i, :, 0], v[b, :, g])
    found = calibration.read(path)
    assert found.problems() == ["b2-h4-s64-d64-full-kvh2"]


def test_torch_sdpa_is_restored_after_an_exception(tmp_path):
    original = F.scaled_dot_product_attention
    with pytest.raises(ZeroDivisionError):
        with capture(tmp_path / "c.safetensors"):
            sdpa(*qkv(kv_heads=4))
            raise ZeroDivisionError("the model failed")
    assert F.scaled_dot_product_attention is original and api._CAPTURE is None
    assert not (tmp_path / "c.safetensors").exists()  # written only by a block that completed


def test_calls_the_kernels_cannot_run_are_counted_not_recorded(tmp_path):
    q, k, v = qkv(kv_heads=4)
    with capture(tmp_path / "c.safetensors") as recorder:
        sdpa(q, k, v, attn_mask=torch.ones(64, 64, dtype=torch.bool))
        sdpa(q[:, :32], k, v, is_causal=True)  # torch's top-left diagonal, unequal lengths
        sdpa(*qkv(kv_heads=4, head_dim=80))  # no kernel has head_dim 80
        sdpa(q, k, v)
    assert sum(recorder.skipped.values()) == 3
    assert any("attn_mask" in why for why in recorder.skipped)
    assert any("head_dim 80" in why for why in recorder.skipped)
    assert [r.seen for r in recorder.problems.values()] == [1]


def test_nothing_recorded_is_an_error_and_writes_no_file(tmp_path):
    path = tmp_path / "c.safetensors"
    with pytest.raises(TunerError, match="no attention call recorded.*eagerly"):
        with capture(path):
            pass
    assert not path.exists()


def test_calls_inside_torch_compile_are_not_recorded(tmp_path):
    q, k, v = qkv(kv_heads=4)
    compiled = torch.compile(lambda q, k, v: sdpa(q, k, v), backend="eager", fullgraph=True)
    with pytest.raises(TunerError, match="no attention call recorded"):
        with capture(tmp_path / "c.safetensors"):
            out = compiled(q, k, v)
    assert torch.allclose(out, sdpa(q, k, v))


def test_bad_arguments_and_nested_captures_are_refused(tmp_path):
    with pytest.raises(TunerError, match="max_bytes must be a positive int"):
        with capture(tmp_path / "c.safetensors", max_bytes=0):
            pass
    with pytest.raises(TunerError, match="no directory"):
        with capture(tmp_path / "missing" / "c.safetensors"):
            pass
    with capture(tmp_path / "c.safetensors"):
        sdpa(*qkv(kv_heads=4))
        with pytest.raises(TunerError, match="already active"):
            with capture(tmp_path / "d.safetensors"):
                pass


def test_reservoir_keeps_every_call_with_equal_probability():
    # 20 calls of one problem, 4 kept: each call's chance is 4/20 whatever its position.
    q, k, v = qkv(batch=1, heads=1, seq_len=2, kv_heads=1)
    kept = Counter()
    runs = 400
    for seed in range(runs):
        recorder = Recorder(2**30, calls_per_problem=4, slices_per_call=1, seed=seed)
        for _ in range(20):
            recorder.record(q, k, v, None, False)
        (res,) = recorder.problems.values()
        assert res.seen == 20 and len(res.kept) == 4
        kept.update(c.index for c in res.kept)
    # Binomial(400, 0.2): mean 80, sd 8; a scheme that keeps the first or last calls fails.
    assert set(kept) == set(range(20))
    assert all(48 <= kept[i] <= 112 for i in range(20)), sorted(kept.items())


def test_the_file_stays_under_max_bytes_and_every_problem_keeps_a_call(tmp_path):
    big, small = Problem(1, 2, 512, 64), Problem(1, 2, 64, 64)
    one_big = (512 + 2 * 512) * 64 * 2  # bytes of one slice of `big` (group 1, bf16)
    path = tmp_path / "c.safetensors"
    limit = 6 * one_big
    with capture(path, max_bytes=limit, calls_per_problem=8, slices_per_call=2) as recorder:
        for seed in range(12):
            for p in (big, small):
                sdpa(*qkv(p.batch, p.heads, p.seq_len, 64, p.kv_heads, seed=seed))
    calls, stored = tensors(path)
    assert sum(t.numel() * t.element_size() for t in stored.values()) <= limit
    by_problem = Counter(c["problem"] for c in calls)
    assert by_problem[small.key()] == 8 and 1 <= by_problem[big.key()] <= 3
    assert recorder.problems[big.key()].seen == 12


def test_a_slice_over_max_bytes_is_counted_not_recorded(tmp_path):
    with capture(tmp_path / "c.safetensors", max_bytes=(64 + 128) * 64 * 2) as recorder:
        sdpa(*qkv(1, 2, 64, 64, 2))  # fits: one slice is (64 + 2 * 64) * 64 * 2 bytes
        sdpa(*qkv(1, 2, 512, 64, 2))
    assert any("over max_bytes" in why for why in recorder.skipped)
    assert list(recorder.problems) == ["b1-h2-s64-d64-full"]


def _cpu_attention(monkeypatch, calls):
    """tuner.attention on CPU tensors: its input check and the op stood in for, so that what
    is tested is the hook around them."""
    import variants.prepare
    from tuner import ops

    monkeypatch.setattr(variants.prepare, "check_qkv", lambda *a, **kw: None)

    def op(q, k, v, *args):
        calls.append(args)
        return torch.zeros_like(q), torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    monkeypatch.setattr(ops, "attention_op", op)


def test_tuner_attention_and_its_sdpa_drop_in_are_recorded_once_each(tmp_path, monkeypatch):
    launched = []
    _cpu_attention(monkeypatch, launched)
    q, k, v = qkv(1, 4, 64, 64, 2)
    tuner.attention(q, k, v)  # no capture: nothing recorded, nothing held
    path = tmp_path / "c.safetensors"
    with capture(path) as recorder:
        tuner.attention(q, k, v, causal=True, softmax_scale=0.2)
        tuner.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                           enable_gqa=True)
    assert len(launched) == 3  # every call still ran
    assert {key: r.seen for key, r in recorder.problems.items()} == {
        "b1-h4-s64-d64-causal-kvh2": 1, "b1-h4-s64-d64-full-kvh2": 1}
    calls, stored = tensors(path)
    causal = next(c for c in calls if c["causal"])
    assert causal["softmax_scale"] == 0.2
    assert torch.equal(stored[f"{causal['name']}.k"][:, :, 0],
                       torch.stack([k[b, :, g] for b, g in causal["slices"]]))


def test_the_hook_is_one_global_check_and_no_graph_break(monkeypatch):
    _cpu_attention(monkeypatch, [])
    assert api._CAPTURE is None
    # fullgraph: any graph break in tuner.attention around the (stood-in) op raises.
    compiled = torch.compile(lambda q, k, v: tuner.attention(q, k, v) + 1, backend="eager",
                             fullgraph=True)
    q, k, v = qkv(1, 4)
    assert torch.equal(compiled(q, k, v), torch.ones_like(q))
