"""On the GPU: a call run as pieces (the bound lowered so that small tensors pass it) gives the
whole call's output and LSE; a call with nothing to compute launches nothing and answers as
F.sdpa does; a backward through a call raises."""

import pytest
import torch

import tuner
from tuner import pieces, runtime

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("empty_db")]


def _inputs(batch, seq_len, heads, seq_len_kv, kv_heads, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, seq_len, heads, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seq_len_kv, kv_heads, 128, device="cuda", generator=g,
                        dtype=torch.bfloat16) for _ in range(2))
    return q, k, v


def _close(got, want):
    """Pieces run the kernel on the same (batch, head) tiles; a piece mix-up is an O(1) error."""
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    err = (got.float() - want.float())[finite].norm() / want.float()[finite].norm()
    assert err < 1e-2, f"relative error {err:.3g} between the pieces and the whole call"


@pytest.mark.parametrize("limit", [2**22, 2**20], ids=["batch-pieces", "head-pieces"])
def test_a_call_in_pieces_gives_the_whole_calls_output_and_lse(monkeypatch, limit):
    q, k, v = _inputs(3, 700, 8, 1000, 2, seed=limit)
    # One config for the whole call and its pieces (a lookup by batch could pick another).
    cfg = tuner.load_best_config(700, heads=8, batch=3, seq_len_kv=1000, kv_heads=2,
                                 causal=True)
    whole, whole_lse = tuner.attention(q, k, v, causal=True, return_lse=True, config=cfg)
    monkeypatch.setattr(pieces, "MAX_ELEMENTS", limit)
    assert len(pieces.pieces(q.shape, k.shape)) > 1
    runtime.clear_cache()  # else the whole call's plan answers the same signature
    got, lse = tuner.attention(q, k, v, causal=True, return_lse=True, config=cfg)
    _close(got, whole)
    _close(lse, whole_lse)
    d = torch.rand(3, 8, device="cuda") + 0.5
    d_kv = torch.rand(3, 2, device="cuda") + 0.5
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    cfg8 = cfg.for_q_dtype("float8_e4m3fn")
    pieced = tuner.attention_fp8(q8, k8, v8, d, d_kv, d_kv, causal=True, config=cfg8)
    monkeypatch.setattr(pieces, "MAX_ELEMENTS", 2**31)
    _close(pieced, tuner.attention_fp8(q8, k8, v8, d, d_kv, d_kv, causal=True, config=cfg8))


def test_nothing_to_compute_and_no_backward_on_cuda_tensors():
    q, k, v = _inputs(2, 33, 4, 0, 4, seed=1)
    out, lse = tuner.attention(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and bool((lse == -float("inf")).all())
    q, k, v = _inputs(2, 64, 4, 64, 4, seed=2)
    q.requires_grad_()
    out = tuner.attention(q, k, v)
    with pytest.raises(tuner.TunerError, match="has no backward"):
        out.float().sum().backward()
