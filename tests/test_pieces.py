"""Calls past the kernels' 32-bit offsets run as pieces (tuner/pieces.py): which pieces, and
that their outputs and LSEs make the whole call's. On the GPU: tests/gpu/test_pieces_gpu.py."""

import math

import pytest
import torch

import tuner
from tuner import pieces as pieces_module
from tuner.errors import TunerError
from tuner.pieces import MAX_ELEMENTS, PAD_SLACK, descale_piece, pieces, run_in_pieces


def _covers_once_within_the_bound(parts, q_shape, k_shape):
    batch, seq_len, heads, head_dim = q_shape
    seq_len_kv, kv_heads = k_shape[1], k_shape[2]
    seen = torch.zeros(batch, heads, dtype=torch.int64)
    for rows, q_heads, kv in parts:
        seen[rows, q_heads] += 1
        n_rows = len(range(batch)[rows])
        n_q, n_kv = len(range(heads)[q_heads]), len(range(kv_heads)[kv])
        assert n_q == n_kv * (heads // kv_heads)  # whole groups, each with its KV heads
        assert range(heads)[q_heads][0] == range(kv_heads)[kv][0] * (heads // kv_heads)
        assert n_rows * n_q * (seq_len + PAD_SLACK) * head_dim < MAX_ELEMENTS
        assert n_rows * n_kv * (seq_len_kv + PAD_SLACK) * head_dim < MAX_ELEMENTS
    assert bool((seen == 1).all())


@pytest.mark.parametrize("q_shape, k_shape", [
    ((1, 30272, 56, 128), (1, 30272, 56, 128)),
    ((2, 75600, 40, 128), (2, 512, 40, 128)),
    ((4, 1024, 32, 128), (4, 1024, 32, 128)),
])
def test_the_shapes_models_run_take_one_launch(q_shape, k_shape):
    assert pieces(q_shape, k_shape) is None


@pytest.mark.parametrize("q_shape, k_shape", [
    ((8, 32768, 64, 128), (8, 32768, 64, 128)),  # batch pieces
    ((4, 75600, 56, 128), (4, 75600, 56, 128)),
    ((1, 600000, 56, 128), (1, 600000, 8, 128)),  # one batch element past it: KV-head pieces
    ((2, 20000, 8, 64), (2, 4_000_000, 8, 64)),  # a long key/value sequence decides
])
def test_a_call_past_the_bound_is_pieces_that_cover_it_once_each_under_it(q_shape, k_shape):
    parts = pieces(q_shape, k_shape)
    assert parts is not None and len(parts) > 1
    _covers_once_within_the_bound(parts, q_shape, k_shape)


def test_one_kv_head_past_the_bound_is_refused_naming_the_fix():
    with pytest.raises(TunerError, match="split the sequence into chunks and merge them"):
        pieces((1, 2**25, 4, 128), (1, 2**25, 1, 128))


def _reference(q, k, v, want_lse):
    """fp32 attention with grouped KV heads, (out, lse)."""
    group = q.shape[2] // k.shape[2]
    k, v = (x.float().repeat_interleave(group, dim=2) for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) / math.sqrt(q.shape[-1])
    out = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).to(torch.bfloat16)
    return out, (s.logsumexp(-1) if want_lse else None)


@pytest.mark.parametrize("limit", [2**12, 2**10])  # batch pieces, KV-head pieces
def test_pieces_outputs_and_lses_make_the_whole_calls(monkeypatch, limit):
    monkeypatch.setattr(pieces_module, "MAX_ELEMENTS", limit)
    monkeypatch.setattr(pieces_module, "PAD_SLACK", 0)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 16, 8, 16, generator=g)
    k, v = torch.randn(3, 24, 4, 16, generator=g), torch.randn(3, 24, 4, 16, generator=g)
    parts = pieces(q.shape, k.shape)
    assert parts is not None and len(parts) > 1
    for return_lse in (True, False):
        got = run_in_pieces(parts, lambda _part, *x: _reference(*x), q, k, v, return_lse)
        want = _reference(q, k, v, True)
        if return_lse:
            assert torch.equal(got[0], want[0]) and torch.allclose(got[1], want[1])
        else:
            assert torch.equal(got, want[0])


def test_tuner_attention_and_attention_fp8_launch_a_call_per_piece(monkeypatch):
    """A call past the bound (lowered here) makes one op call per piece, each under the bound,
    and answers the whole call's shapes; attention_fp8's descales follow each piece's batch and
    heads, per head, per tensor and fine."""
    monkeypatch.setattr(pieces_module, "MAX_ELEMENTS", 2**22)  # batch pieces
    seen = []

    def op(q, k, v, *rest):
        seen.append((tuple(q.shape), tuple(k.shape)))
        out = torch.empty(q.shape, dtype=torch.bfloat16, device="meta")
        return out, torch.empty(q.shape[0], q.shape[2], q.shape[1], device="meta")

    monkeypatch.setattr("tuner.ops.attention_op", op)
    q = torch.empty(6, 100, 8, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(6, 100, 2, 128, dtype=torch.bfloat16, device="meta")
    out, lse = tuner.attention(q, k, k, return_lse=True)
    assert out.shape == q.shape and lse.shape == (6, 8, 100)
    parts = pieces(q.shape, k.shape)
    assert len(seen) == len(parts) > 1
    assert all(s[0] * s[2] * (s[1] + PAD_SLACK) * 128 < 2**22 for s, _ in seen)

    calls = []

    def run_fp8(q, k, v, descales, *rest):
        calls.append((q.shape, [tuple(d.shape) for d in descales]))
        return (torch.empty(q.shape, dtype=torch.bfloat16, device="meta"),
                torch.empty(q.shape[0], q.shape[2], q.shape[1], device="meta"))

    monkeypatch.setattr("tuner.runtime.run_attention_fp8", run_fp8)
    q8, k8 = (x.to(torch.float8_e4m3fn) for x in (q, k))
    descales = (torch.ones(6, 100, 8, device="meta"), torch.ones(6, 2, device="meta"),
                torch.ones(1, device="meta"))
    assert tuner.attention_fp8(q8, k8, k8, *descales).shape == q.shape
    assert len(calls) == len(parts)
    for (shape, scales), (rows, _, _) in zip(calls, parts, strict=True):
        n = len(range(6)[rows])
        assert shape[0] == n and scales == [(n, 100, 8), (n, 2), (1,)]


def test_a_descale_piece_keeps_its_broadcast_dimensions():
    per_head = torch.arange(12.0).view(3, 4)
    assert torch.equal(descale_piece(per_head, slice(1, 2), slice(2, 4)), per_head[1:2, 2:4])
    assert descale_piece(torch.ones(1, 4), slice(1, 2), slice(0, 2)).shape == (1, 2)
    assert descale_piece(torch.ones(3, 1), slice(1, 2), slice(0, 2)).shape == (1, 1)
    assert torch.equal(descale_piece(torch.arange(4.0), slice(0, 1), slice(1, 3)),
                       torch.tensor([1.0, 2.0]))
    assert descale_piece(torch.tensor(2.0), slice(0, 1), slice(0, 1)).shape == ()
    fine = torch.arange(60.0).view(3, 5, 4)
    assert torch.equal(descale_piece(fine, slice(0, 2), slice(1, 2)), fine[0:2, :, 1:2])
