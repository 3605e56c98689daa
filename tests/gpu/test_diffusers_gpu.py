"""tuner.integrations.diffusers on the GPU: real diffusers transformers (tiny, random weights,
nothing downloaded) at 4096 tokens, their attention routed through tuner.attention in bf16,
against the same weights in fp32 on torch SDPA: Wan (self-attention and cross-attention to a
512-token prompt, head_dim 128) in eager code, under torch.compile(fullgraph=True) and replayed
from a CUDA graph; ACE-Step (grouped-query attention, 8 query heads on 2 KV heads) in eager code.

Thresholds. One routed call's FP8 error is at most the gate's bound, 2**-4 relative RMS of that
call's output (variants/reference.py; about 0.05 on random inputs). An error e_i in call i's
output moves the model's output by about J_i e_i, and zeroing that output moves it by J_i a_i,
whose size relative to the output is share_i, measured here in fp32. To first order the model's
relative RMS error is then at most 2**-4 * sum(share_i) (errors of different calls adding at
most linearly), times 1.5 for second-order terms, on top of the bf16 model's own error against
fp32 (its floor, measured here too); cosine similarity 1 - cos ~ rel**2 / 2 for an error
orthogonal to the output, so cos >= 1 - bound**2 keeps a 2x margin. The check can fail: zeroing
every call moves the output by about sum(share_i), and a model where that is not twice the
limit fails the test as too weak. On the CPU, this Wan in fp32 with the FP8 rounding of q, k, v
simulated (variants.reference.quantize_reference): per call 0.007-0.016, model 0.0007, shares
summing to 0.134, bound 0.0126.

Run (about a minute, most of it inductor's compile): python -m pytest -m gpu
tests/gpu/test_diffusers_gpu.py (diffusers installed: pip install -e '.[diffusers]').
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytest.importorskip("diffusers")

import tuner  # noqa: E402
import tuner.ops  # noqa: E402, F401  (registers fp8_attn_tuner::attention)
from tuner import runtime  # noqa: E402
from tuner.integrations import diffusers as tuner_diffusers  # noqa: E402
from tuner.integrations import routing  # noqa: E402

pytestmark = pytest.mark.gpu

OP = torch.ops.fp8_attn_tuner.attention.default
GATE_BOUND = 2.0**-4  # variants/reference_bounds.py: relative RMS of one call's output
SECOND_ORDER = 1.5
TOKENS, TEXT = 4096, 512  # Wan: a (1, 128, 128) latent in (1, 2, 2) patches; a Wan-length prompt


@pytest.fixture(scope="module", autouse=True)
def empty_db(tmp_path_factory):
    # Nothing tuned: every call runs the family default, the same config on any database.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_DB_URL", f"sqlite:///{tmp_path_factory.mktemp('db') / 'empty.sqlite'}")
        runtime.clear_cache()
        routing.clear_cache()
        yield
    runtime.clear_cache()


class ZeroCall(TorchFunctionMode):
    """torch SDPA with the output of call `which` (in call order) zeroed."""

    def __init__(self, which: int) -> None:
        super().__init__()
        self.which, self.seen = which, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.seen += 1
            if self.seen - 1 == self.which:
                out = torch.zeros_like(out)
        return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(),
                                                       dim=0))


class Case:
    """A model in bf16 with its inputs, and in fp32 the reference, the bf16 floor and the bound."""

    def __init__(self, model32, inputs32, forward, calls: int) -> None:
        self.forward = forward
        with torch.no_grad():
            self.ref = forward(model32, inputs32)
            shares = []
            for which in range(calls):
                with ZeroCall(which):
                    shares.append(rel(forward(model32, inputs32), self.ref))
            self.model = model32.to(torch.bfloat16)
            self.inputs = [x.to(torch.bfloat16) if x.is_floating_point() else x
                           for x in inputs32]
            self.floor = rel(forward(self.model, self.inputs), self.ref)
        self.shares = shares
        self.bound = SECOND_ORDER * GATE_BOUND * sum(shares)

    def check(self, out, floor=None) -> None:
        floor = self.floor if floor is None else floor
        error, cos, limit = rel(out, self.ref), cosine(out, self.ref), floor + self.bound
        print(f"rel RMS {error:.5f} (bf16 SDPA floor {self.floor:.5f}, bound {limit:.5f}), "
              f"cos {cos:.6f}, shares {[round(s, 4) for s in self.shares]}")
        # Zeroing every call moves the output by about sum(shares): that must fail the check.
        assert sum(self.shares) > 2 * limit, "attention barely moves this model's output"
        assert error < limit
        assert cos > 1 - limit**2


@pytest.fixture(scope="module")
def wan():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2,
                                  attention_head_dim=128, in_channels=16, out_channels=16,
                                  text_dim=64, freq_dim=64, ffn_dim=512, num_layers=2,
                                  rope_max_seq_len=1024).eval().cuda()
    g = torch.Generator(device="cuda").manual_seed(1)
    inputs = [torch.randn(1, 16, 1, 128, 128, device="cuda", generator=g),
              torch.tensor([500], device="cuda"),
              torch.randn(1, TEXT, 64, device="cuda", generator=g)]
    with torch.backends.cudnn.flags(allow_tf32=False):  # the patch embedding's conv, in fp32
        case = Case(model, inputs, lambda m, x: m(*x, return_dict=False)[0], calls=4)
    tuner_diffusers.enable(case.model)
    return case


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = tuner.attention

    def attention(q, k, v, **kwargs):
        calls.append((tuple(q.shape), tuple(k.shape)))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(tuner, "attention", attention)
    return calls


def test_wan_eager_within_fp8_error_of_fp32(wan, spy):
    with torch.no_grad():
        out = wan.forward(wan.model, wan.inputs)
    self_call, cross_call = ((1, TOKENS, 2, 128),) * 2, ((1, TOKENS, 2, 128), (1, TEXT, 2, 128))
    assert spy == [self_call, cross_call] * 2
    wan.check(out)


def test_wan_capture_records_each_routed_call_once(wan, tmp_path):
    with tuner.capture(tmp_path / "acts.safetensors") as recorder, torch.no_grad():
        wan.forward(wan.model, wan.inputs)
    assert {key: r.seen for key, r in recorder.problems.items()} == {
        f"b1-h2-s{TOKENS}-d128-full": 2, f"b1-h2-s{TOKENS}-d128-full-kv{TEXT}": 2}
    assert (tmp_path / "acts.safetensors").exists()


def test_wan_compiled_fullgraph_within_fp8_error_of_fp32(wan):
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(wan.model, fullgraph=True, backend=counter)
    with torch.no_grad():
        out = wan.forward(compiled, wan.inputs)
        again = wan.forward(compiled, wan.inputs)
    ops = [n.target for g in counter.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert counter.frame_count == 1 and ops.count(OP) == 4
    assert torch.equal(out, again)
    # Inductor rounds the bf16 pointwise work its own way: a second floor of the same size.
    wan.check(out, floor=2 * wan.floor)


def test_wan_replayed_from_a_cuda_graph_equals_eager(wan):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.stream(side):
        expected = wan.forward(wan.model, wan.inputs)  # plans made, allocator warm on this stream
        with torch.cuda.graph(graph, stream=side):
            captured = wan.forward(wan.model, wan.inputs)
    torch.cuda.current_stream().wait_stream(side)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)
    wan.check(captured)


def test_ace_step_grouped_query_attention_within_fp8_error_of_fp32(spy):
    ace_step = pytest.importorskip("diffusers.models.transformers.ace_step_transformer",
                                   reason="no ACE-Step in this diffusers")
    AceStepTransformer1DModel = ace_step.AceStepTransformer1DModel

    torch.manual_seed(0)
    model = AceStepTransformer1DModel(
        hidden_size=1024, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=128, in_channels=16, audio_acoustic_hidden_dim=8,
        patch_size=2, layer_types=["full_attention"] * 2).eval().cuda()
    g = torch.Generator(device="cuda").manual_seed(1)
    frames, text = 2 * TOKENS, 300  # a prompt length that is no multiple of any tile
    t = torch.tensor([0.5], device="cuda")
    inputs = [torch.randn(1, frames, 8, device="cuda", generator=g), t, t,
              torch.randn(1, text, 1024, device="cuda", generator=g),
              torch.randn(1, frames, 8, device="cuda", generator=g)]
    case = Case(model, inputs, lambda m, x: m(*x, return_dict=False)[0], calls=4)
    tuner_diffusers.enable(case.model)
    with torch.no_grad():
        out = case.forward(case.model, case.inputs)
    self_call, cross_call = ((1, TOKENS, 8, 128), (1, TOKENS, 2, 128)), \
        ((1, TOKENS, 8, 128), (1, text, 2, 128))
    assert spy == [self_call, cross_call] * 2
    case.check(out)
