"""The custom op without a GPU: its fake implementation under FakeTensorMode and on meta
tensors, and torch.compile(fullgraph=True) tracing a model through tuner.attention and the SDPA
drop-in as one opaque node (GPU execution: tests/gpu/test_compile_gpu.py)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tuner
import tuner.ops  # registers fp8_attn_tuner::attention (tuner.attention imports it on first use)
from tuner.errors import TunerError
from variants import mma_sync

OP = torch.ops.fp8_attn_tuner.attention.default


def test_fake_gives_bf16_out_and_fp32_lse_shapes():
    with FakeTensorMode():
        q = torch.empty(2, 77, 3, 64, dtype=torch.float16, device="cuda")
        out, lse = OP(q, q, q, None, "", "auto", None, True)
    assert (out.shape, out.dtype, out.device.type) == ((2, 77, 3, 64), torch.bfloat16, "cuda")
    assert (lse.shape, lse.dtype) == ((2, 3, 77), torch.float32)


def test_the_op_takes_want_lse_and_its_fake_answers_either_way():
    """want_lse=False: the caller drops the LSE, so the runtime need not add K smoothing's
    shift to it (tuner.attention passes return_lse)."""
    assert "bool want_lse=True" in str(OP._schema)
    with FakeTensorMode():
        q = torch.empty(2, 77, 3, 64, dtype=torch.bfloat16, device="cuda")
        for want_lse in (True, False):
            out, lse = OP(q, q, q, None, "", "auto", None, False, True, want_lse)
            assert out.shape == (2, 77, 3, 64) and lse.shape == (2, 3, 77)


def test_meta_tensors_propagate_shapes_through_attention():
    q = torch.empty(1, 100, 4, 128, dtype=torch.bfloat16, device="meta")
    out, lse = tuner.attention(q, q, q, return_lse=True)
    assert out.is_meta and out.shape == (1, 100, 4, 128) and lse.shape == (1, 4, 100)


class Block(torch.nn.Module):
    """A transformer attention block written against F.scaled_dot_product_attention."""

    def __init__(self, sdpa, dim=256, heads=2):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = torch.nn.Linear(dim, 3 * dim, device="meta", dtype=torch.bfloat16)
        self.proj = torch.nn.Linear(dim, dim, device="meta", dtype=torch.bfloat16)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = self.sdpa(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, s, -1))


def _traced_ops(fn, *args):
    graphs = []

    def backend(gm, _example_inputs):
        graphs.append(gm)
        return gm.forward

    result = torch.compile(fn, fullgraph=True, backend=backend)(*args)
    # With inputs that require grad the op sits in ForwardOnly's forward subgraph.
    targets = [n.target for g in graphs for m in g.modules() if isinstance(m, torch.fx.GraphModule)
               for n in m.graph.nodes if n.op == "call_function"]
    return result, targets


def test_compile_fullgraph_traces_a_block_through_the_sdpa_drop_in():
    x = torch.empty(1, 64, 256, dtype=torch.bfloat16, device="meta")
    out, targets = _traced_ops(Block(tuner.scaled_dot_product_attention), x)
    assert out.shape == (1, 64, 256) and out.dtype == torch.bfloat16
    assert targets.count(OP) == 1


def test_compile_fullgraph_bakes_a_pinned_config_into_the_graph():
    cfg = mma_sync.default("sm_90a")
    q = torch.empty(1, 64, 2, 128, dtype=torch.bfloat16, device="meta")
    out, targets = _traced_ops(lambda q: tuner.attention(q, q, q, config=cfg), q)
    assert out.shape == q.shape and targets.count(OP) == 1


@pytest.mark.parametrize("return_lse", [True, False])
def test_compile_fullgraph_passes_return_lse_to_the_op(return_lse):
    graphs = []

    def backend(gm, _example_inputs):
        graphs.append(gm)
        return gm.forward

    q = torch.empty(1, 64, 2, 128, dtype=torch.bfloat16, device="meta")
    fn = torch.compile(lambda q: tuner.attention(q, q, q, return_lse=return_lse), fullgraph=True,
                       backend=backend)
    result = fn(q)
    assert (len(result) == 2) if return_lse else result.shape == q.shape
    (node,) = [n for g in graphs for n in g.graph.nodes if n.target == OP]
    # want_lse is the op's eleventh argument (after causal and max_error).
    want = node.kwargs.get("want_lse", node.args[10] if len(node.args) > 10 else True)
    assert want is return_lse


ARGS = dict(attn_mask=torch.empty(1, 64, 64, device="meta"), dropout_p=0.1, is_causal=True)


@pytest.mark.parametrize("name, value, expected", [
    ("attn_mask", ARGS["attn_mask"], r"attn_mask is not supported.*call torch\.nn\.functional"),
    ("dropout_p", 0.1, r"dropout_p=0.1 is not supported.*dropout_p=0\.0"),
])
def test_sdpa_refuses_what_the_kernels_cannot_honour(name, value, expected):
    q = torch.empty(1, 2, 64, 128, dtype=torch.bfloat16, device="meta")
    with pytest.raises(TunerError, match=expected):
        tuner.scaled_dot_product_attention(q, q, q, **{name: value})


@pytest.mark.parametrize("kv_shape, gqa, causal, expected", [
    ((1, 1, 64, 128), False, False, r"query has 2 heads, key/value 1: pass enable_gqa=True"),
    ((1, 2, 32, 128), False, True, r"is_causal=True with 64 queries and 32 keys: torch's "
                                   r"is_causal aligns the diagonal to the top left"),
    ((2, 64, 128), False, False, r"key has shape \(2, 64, 128\); expected 4 dims"),
])
def test_sdpa_refuses_what_torch_would_mean_otherwise(kv_shape, gqa, causal, expected):
    q = torch.empty(1, 2, 64, 128, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(*kv_shape, dtype=torch.bfloat16, device="meta")
    with pytest.raises(TunerError, match=expected):
        tuner.scaled_dot_product_attention(q, kv, kv, enable_gqa=gqa, is_causal=causal)


@pytest.mark.parametrize("kv_shape, gqa, causal", [
    ((1, 1, 64, 128), True, True), ((1, 2, 32, 128), False, False), ((1, 2, 64, 128), False, True),
])
def test_sdpa_takes_causal_grouped_heads_and_other_lengths(kv_shape, gqa, causal):
    q = torch.empty(1, 2, 64, 128, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(*kv_shape, dtype=torch.bfloat16, device="meta")
    out = tuner.scaled_dot_product_attention(q, kv, kv, enable_gqa=gqa, is_causal=causal)
    assert out.shape == q.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_layout_and_dtype_follow_torch(dtype):
    q = torch.empty(1, 2, 64, 128, dtype=dtype, device="meta")
    out = tuner.scaled_dot_product_attention(q, q, q, scale=0.1)
    assert out.shape == (1, 2, 64, 128) and out.dtype == dtype


def _cpu_run_attention(q, k, v, *rest):
    """tuner.runtime.run_attention's shapes on the CPU (no kernel here): what the op returns."""
    batch, seq_len, heads, _ = q.shape
    return q.to(torch.bfloat16) * 2, torch.zeros(batch, heads, seq_len)


def test_a_call_autograd_records_raises_at_backward_instead_of_passing_no_gradient(monkeypatch):
    """The op has no autograd kernel of its own (torch would hand the inputs no gradient and a
    warning); where autograd records a call, tuner.attention runs it through ForwardOnly: the
    forward is the op's, the backward raises a TunerError naming the fix. Without grad mode, or
    without an input that requires grad, the op runs bare."""
    monkeypatch.setattr("tuner.ops.run_attention", _cpu_run_attention)
    q = torch.randn(1, 8, 2, 64, requires_grad=True)
    k = torch.randn(1, 8, 2, 64)
    args = (None, "", "auto", None, False, False, None, True)
    out, lse = tuner.ops.ForwardOnly.apply(q, k, k, *args)
    assert torch.equal(out, q.detach().to(torch.bfloat16) * 2) and out.requires_grad
    with pytest.raises(TunerError, match="tuner.attention has no backward.*torch.no_grad"):
        out.float().sum().backward()

    meta = torch.empty(1, 64, 4, 128, dtype=torch.bfloat16, device="meta")
    wants = meta.clone().requires_grad_()
    assert type(tuner.attention(wants, meta, meta).grad_fn).__name__ == "ForwardOnlyBackward"
    with torch.no_grad():
        assert tuner.attention(wants, meta, meta).grad_fn is None
    assert tuner.attention(meta, meta, meta).grad_fn is None


def test_a_compiled_graph_with_inputs_that_require_grad_serves_its_forward(monkeypatch):
    """AOTAutograd traces the backward of such a graph at compile time: the raise is an op of
    its own (fp8_attn_tuner::no_backward), so the graph builds, its forward runs, and only
    running its backward raises."""
    monkeypatch.setattr("tuner.ops.run_attention", _cpu_run_attention)
    args = (None, "", "auto", None, False, False, None, True)

    def block(q, k, v):
        return tuner.ops.ForwardOnly.apply(q, k, v, *args)[0].float() + 1

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    q = torch.randn(1, 8, 2, 64, requires_grad=True)
    k, v = torch.randn(1, 8, 2, 64), torch.randn(1, 8, 2, 64)
    out = compiled(q, k, v)
    assert torch.equal(out, q.detach().to(torch.bfloat16).float() * 2 + 1)
    with pytest.raises(TunerError, match="tuner.attention has no backward"):
        out.sum().backward()


def test_a_traced_call_with_q_as_k_and_v_and_an_input_that_requires_grad_compiles():
    """Dynamo traces an autograd.Function only with distinct tensors: tuner.attention hands
    ForwardOnly a view where self-attention passes one tensor three times."""
    q = torch.empty(1, 64, 2, 128, dtype=torch.bfloat16, device="meta", requires_grad=True)
    out, targets = _traced_ops(lambda q: tuner.attention(q, q, q), q)
    assert out.shape == q.shape and targets.count(OP) == 1


@pytest.mark.parametrize("dims", [{1: "s"}, {0: "b"}, {0: "b", 1: "s"}])
def test_export_with_dynamic_sizes_keeps_one_op_and_no_guard_on_the_split(dims):
    """With symbolic sizes the decision to split (tuner/pieces.py) is left to the op's body,
    where sizes are known: export adds no constraint and the graph holds the op once."""
    from torch.export import Dim, export

    class Model(torch.nn.Module):
        def forward(self, q, k, v):
            return tuner.attention(q, k, v, causal=True)

    x = torch.empty(2, 64, 4, 128, dtype=torch.bfloat16, device="meta")
    spec = {i: Dim(name) for i, name in dims.items()}
    program = export(Model(), (x, x.clone(), x.clone()), dynamic_shapes=(spec, spec, spec))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count(OP) == 1


def test_the_ops_body_splits_a_call_past_the_bound(monkeypatch):
    """A call the trace could not split (symbolic sizes) is split by the op's real body: one
    run_attention per piece, the pieces' outputs and LSEs written into the whole call's."""
    from tuner import pieces

    monkeypatch.setattr(pieces, "MAX_ELEMENTS", 2**20)
    seen = []

    def run(q, k, v, *rest):
        seen.append(q.shape[0])
        return _cpu_run_attention(q, k, v)

    monkeypatch.setattr("tuner.ops.run_attention", run)
    q = torch.randn(5, 100, 4, 128)
    out, lse = OP(q, q, q, None, "", "auto", None, False)
    assert len(seen) == len(pieces.pieces(q.shape, q.shape)) > 1 and sum(seen) == 5
    assert torch.equal(out, q.to(torch.bfloat16) * 2) and lse.shape == (5, 4, 100)
