"""The FlashAttention-3 FP8 peer's coordination on the CPU: without its interface module it is
unavailable with the way to get it; with a stand-in module (tests record the call, FA3 itself
runs only on the H200) it passes e4m3 codes, per-(batch, KV head) descales and the mask as FA3
takes them, including a causal mask at unequal lengths (bottom-right aligned, as ours)."""

import sys
import types

import pytest
import torch

from tuner.errors import PeerUnavailable
from tuner.peers import make_peer
from tuner.problem import Problem


def test_without_its_module_the_peer_is_unavailable_and_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", None)  # import fails
    with pytest.raises(PeerUnavailable, match="fa3_fwd_interface.*fa3-fwd"):
        make_peer("fa3-fp8", Problem(1, 8, 100, 64))


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    def flash_attn_func(q, k, v, **kw):
        calls.append((q, k, v, kw))
        return torch.zeros(q.shape, dtype=torch.bfloat16), None

    module = types.ModuleType("fa3_fwd_interface")
    module.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", module)
    return calls


def test_the_peer_quantizes_per_kv_head_and_passes_the_mask(recorded):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 100, 8, 64, generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 37, 2, 64, generator=g, dtype=torch.bfloat16) for _ in range(2))
    q[:, :, 5] *= 10  # query head 5 (KV group 1) sets that group's q amax
    peer = make_peer("fa3-fp8", Problem(2, 8, 100, 64, True, 37, 2))  # bottom-right: runs
    out, _ = peer.run(peer.prepare(q, k, v))
    ((q8, k8, v8, kw),) = recorded
    assert out.shape == q.shape and kw["causal"] is True
    assert kw["softmax_scale"] == pytest.approx(64**-0.5)
    assert {x.dtype for x in (q8, k8, v8)} == {torch.float8_e4m3fn}
    for name, codes, x in (("q", q8, q), ("k", k8, k), ("v", v8, v)):
        descale = kw[f"{name}_descale"]
        assert descale.shape == (2, 2) and descale.dtype == torch.float32
        group = x.shape[2] // 2
        amax = x.abs().float().amax(dim=(1, 3)).view(2, 2, group).amax(dim=2)
        assert torch.allclose(descale, amax / 448)
        decoded = codes.float() * descale.repeat_interleave(group, dim=1)[:, None, :, None]
        assert torch.allclose(decoded, x.float(), rtol=2**-4, atol=float(amax.max()) * 2**-9)
