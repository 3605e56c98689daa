"""The custom op on the GPU: a small attention block under torch.compile(fullgraph=True) and in a
CUDA graph gives what eager gives; the SDPA drop-in swapped into a module stays within FP8 error
of torch's SDPA; torch.library.opcheck passes. One small problem, about 30 s cold."""

import pytest
import torch
import torch.nn.functional as F

import tuner

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("empty_db")]

B, S, H, D = 1, 320, 2, 128  # a ragged last tile at every block size


class Block(torch.nn.Module):
    """An attention block as models write it: (batch, heads, seq, dim) into an SDPA call."""

    def __init__(self, sdpa=F.scaled_dot_product_attention):
        super().__init__()
        self.sdpa = sdpa
        self.qkv = torch.nn.Linear(H * D, 3 * H * D, dtype=torch.bfloat16, device="cuda")
        self.proj = torch.nn.Linear(H * D, H * D, dtype=torch.bfloat16, device="cuda")

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D).permute(2, 0, 3, 1, 4)
        return self.proj(self.sdpa(q, k, v).transpose(1, 2).reshape(b, s, H * D))


def inputs(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, S, H, D, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in range(3)]


def test_compiled_fullgraph_equals_eager():
    q, k, v = inputs()
    eager_out, eager_lse = tuner.attention(q, k, v, return_lse=True)
    compiled = torch.compile(lambda q, k, v: tuner.attention(q, k, v, return_lse=True),
                             fullgraph=True)
    out, lse = compiled(q, k, v)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


def test_compiled_block_in_a_cuda_graph_equals_eager():
    torch.manual_seed(0)
    block = Block(tuner.scaled_dot_product_attention)
    x = torch.randn(B, S, H * D, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True)
        torch.testing.assert_close(compiled(x), eager, rtol=2e-2, atol=2e-2)  # inductor's GEMMs
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            expected = compiled(x)  # warm the allocator on the capture stream
            with torch.cuda.graph(graph, stream=side):
                captured = compiled(x)
        torch.cuda.current_stream().wait_stream(side)
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(captured, expected)


def test_sdpa_drop_in_matches_torch_sdpa_within_fp8_error():
    torch.manual_seed(1)
    reference = Block()
    swapped = Block(tuner.scaled_dot_product_attention)
    swapped.load_state_dict(reference.state_dict())
    x = torch.randn(B, S, H * D, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want, got = reference(x).float(), swapped(x).float()
    # The validation gate's bound (variants/reference_bounds.py: 2**-4 relative RMS, from e4m3).
    assert float((got - want).norm() / want.norm()) < 2.0**-4


def test_opcheck():
    q, k, v = inputs(seed=2)
    torch.library.opcheck(torch.ops.fp8_attn_tuner.attention.default,
                          (q, k, v, None, "", "auto", None, True),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
