"""The SDPA drop-in on the GPU: a repeated call (tuner.sdpa.repeated, launched on the SDPA-layout
tensors themselves) gives the bits of tuner.attention on the transposed inputs, for both layouts
a model hands SDPA, with GQA, a causal mask and fp16; fresh inputs in the same buffers each
round, so a call that read stale codes or another layout's strides shows."""

import pytest
import torch

import tuner
from tuner import plans
from variants.launch_plan import LaunchPlan

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("empty_db")]


@pytest.mark.parametrize("layout", ["contiguous", "projected"])
@pytest.mark.parametrize("batch, heads, kv_heads, seq, causal, dtype", [
    (2, 8, 8, 1000, False, torch.bfloat16),
    (1, 16, 4, 4096, True, torch.bfloat16),
    (2, 8, 2, 777, False, torch.float16),
], ids=["full", "gqa-causal", "gqa-fp16"])
def test_a_repeated_drop_in_call_gives_tuner_attentions_bits(monkeypatch, layout, batch, heads,
                                                             kv_heads, seq, causal, dtype):
    served = []
    real = LaunchPlan.heads_first

    def heads_first(self, *args):
        out = real(self, *args)
        served.append(out is not None)
        return out

    monkeypatch.setattr(LaunchPlan, "heads_first", heads_first)
    g = torch.Generator(device="cuda").manual_seed(seq)
    shapes = [(batch, seq, heads, 128), (batch, seq, kv_heads, 128), (batch, seq, kv_heads, 128)]
    if layout == "contiguous":  # (batch, heads, seq_len, head_dim) in memory
        buffers = [torch.empty(b, h, s, d, device="cuda", dtype=dtype) for b, s, h, d in shapes]
    else:  # a projection's (batch, seq_len, heads, head_dim), transposed for SDPA
        buffers = [torch.empty(shape, device="cuda", dtype=dtype).transpose(1, 2)
                   for shape in shapes]
    gqa = heads != kv_heads
    for round_ in range(4):
        for x in buffers:  # new values, same addresses and strides
            x.copy_(torch.randn(x.shape, device="cuda", generator=g, dtype=dtype))
        q, k, v = buffers
        got = tuner.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        want = tuner.attention(*(x.transpose(1, 2) for x in buffers), causal=causal)
        assert got.dtype == dtype and got.shape == q.shape
        assert torch.equal(got, want.transpose(1, 2).to(dtype)), f"round {round_}"
    # The first call made the plan; the three after it ran on it.
    assert served == [True] * 3 and len(plans.SDPA_CALLS) == 1
    assert torch.isfinite(got).all()
