"""tuner.integrations.diffusers on real diffusers transformers (tiny, random weights, nothing
downloaded), without a GPU: which attention calls route to tuner.attention and which fall back to
torch's SDPA, with what logged reason, in eager code and under torch.compile(fullgraph=True).

Meta tensors stand in for CUDA ones where a call must route (tuner.attention answers them with
its custom op's fake implementation); the config lookup the routing decision makes needs a GPU,
so those tests replace it with a recording double. On CPU tensors every call falls back, and the
model's output must be bitwise the output without the integration. The numerics on the GPU:
tests/gpu/test_diffusers_gpu.py."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers import FluxTransformer2DModel, WanTransformer3DModel  # noqa: E402
from diffusers.models.attention_dispatch import dispatch_attention_fn  # noqa: E402

import tuner  # noqa: E402
import tuner.ops  # noqa: E402, F401  (registers fp8_attn_tuner::attention)
from tuner import runtime  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.integrations import diffusers as tuner_diffusers  # noqa: E402
from tuner.integrations import routing  # noqa: E402

OP = torch.ops.fp8_attn_tuner.attention.default
REPO = Path(__file__).resolve().parents[1]
TOKENS, TEXT = 32, 7  # Wan: a (2, 8, 8) latent in (1, 2, 2) patches; a 7-token prompt


@pytest.fixture(autouse=True)
def fresh_routing():
    routing.clear_cache()
    yield
    routing.clear_cache()


@pytest.fixture
def lookup(monkeypatch):
    """The config lookup of the routing decision, answering without a GPU: records each
    problem; `refuse` set to a message makes it raise a TunerError with it instead."""

    class Lookup:
        problems: list[str] = []
        refuse: str | None = None

        def __call__(self, problem, **kwargs):
            self.problems.append(problem.key())
            self.max_errors.add(kwargs.get("max_error"))
            if self.refuse:
                raise TunerError(self.refuse)

    double = Lookup()
    double.problems, double.max_errors = [], set()
    monkeypatch.setattr(runtime, "config_for_problem", double)
    return double


@pytest.fixture
def spy(monkeypatch):
    """tuner.attention, counted: each call's q, k shapes and flags, then the real function."""
    calls = []
    real = tuner.attention

    def attention(q, k, v, **kwargs):
        calls.append({"q": tuple(q.shape), "k": tuple(k.shape), "contiguous":
                      all(t.is_contiguous() for t in (q, k, v)), **kwargs})
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(tuner, "attention", attention)
    return calls


def wan(head_dim=64, dtype=torch.bfloat16, device="cpu"):
    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2,
                                  attention_head_dim=head_dim, in_channels=4, out_channels=4,
                                  text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
                                  rope_max_seq_len=64)
    return model.eval().to(device, dtype)


def wan_inputs(dtype=torch.bfloat16, device="cpu"):
    g = torch.Generator().manual_seed(1)
    latent = torch.randn(1, 4, 2, 8, 8, generator=g).to(device, dtype)
    text = torch.randn(1, TEXT, 32, generator=g).to(device, dtype)
    return latent, torch.tensor([500], device=device), text


def run(model, inputs):
    with torch.no_grad():
        return model(*inputs, return_dict=False)[0]


def fallbacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tuner.integrations" and "runs on torch SDPA" in r.getMessage()]


def test_self_and_cross_attention_route_through_tuner_attention(lookup, spy, caplog):
    model = wan(device="meta")
    tuner_diffusers.enable(model)
    out = run(model, wan_inputs(device="meta"))
    assert out.shape == (1, 4, 2, 8, 8)
    # Two blocks, each a self-attention over the latent tokens and a cross-attention to the
    # prompt, in the kernels' layout (batch, seq_len, heads, head_dim), unmasked, torch's scale.
    self_call = {"q": (1, TOKENS, 2, 64), "k": (1, TOKENS, 2, 64), "contiguous": True,
                 "causal": False, "softmax_scale": None, "max_error": None}
    cross_call = {**self_call, "k": (1, TEXT, 2, 64)}
    assert spy == [self_call, cross_call] * 2
    assert sorted(set(lookup.problems)) == ["b1-h2-s32-d64-full", "b1-h2-s32-d64-full-kv7"]
    assert not fallbacks(caplog)


def test_max_error_reaches_tuner_attention_and_the_lookup(lookup, spy):
    model = wan(device="meta")
    tuner_diffusers.enable(model, max_error=0.08)
    run(model, wan_inputs(device="meta"))
    assert len(spy) == 4 and {c["max_error"] for c in spy} == {0.08}
    assert lookup.max_errors == {0.08}
    tuner_diffusers.enable(model, max_error=None)  # wraps nothing again, sets the budget
    run(model, wan_inputs(device="meta"))
    assert len(spy) == 8 and spy[-1]["max_error"] is None


@pytest.mark.parametrize("bad", [0, -0.1, "0.1", True])
def test_a_max_error_that_is_no_positive_number_is_refused(bad):
    with pytest.raises(TunerError, match=f"max_error must be a positive number .* got {bad!r}"):
        tuner_diffusers.enable(wan(device="meta"), max_error=bad)


def test_grouped_query_attention_routes_and_a_masked_layer_falls_back(lookup, spy, caplog):
    ace_step = pytest.importorskip("diffusers.models.transformers.ace_step_transformer",
                                   reason="no ACE-Step in this diffusers")
    AceStepTransformer1DModel = ace_step.AceStepTransformer1DModel

    torch.manual_seed(0)
    model = AceStepTransformer1DModel(
        hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, in_channels=16, audio_acoustic_hidden_dim=8,
        patch_size=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
    ).eval().to("meta", torch.bfloat16)
    tuner_diffusers.enable(model)
    latents = torch.empty(1, 32, 8, device="meta", dtype=torch.bfloat16)
    text = torch.empty(1, 5, 256, device="meta", dtype=torch.bfloat16)
    t = torch.empty(1, device="meta")
    with torch.no_grad():
        model(latents, t, t, text, latents, return_dict=False)
    # Layer 0's self-attention carries its sliding-window mask: torch SDPA, said once.
    assert len(fallbacks(caplog)) == 1 and "attn_mask is not supported" in fallbacks(caplog)[0]
    # The others reach the kernels with their 2 KV heads for 4 query heads and the model's scale.
    gqa = {"q": (1, 16, 4, 64), "contiguous": True, "causal": False, "softmax_scale": 0.125,
           "max_error": None}
    assert spy == [{**gqa, "k": (1, 5, 2, 64)}, {**gqa, "k": (1, 16, 2, 64)},
                   {**gqa, "k": (1, 5, 2, 64)}]


def flux(head_dim=64, dtype=torch.bfloat16):
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1,
                                   attention_head_dim=head_dim, num_attention_heads=2,
                                   joint_attention_dim=32, pooled_projection_dim=16,
                                   axes_dims_rope=(head_dim // 8, 7 * head_dim // 16,
                                                   7 * head_dim // 16))
    return model.eval().to(dtype)


def flux_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, 64, 8, generator=g).to(dtype), torch.randn(1, TEXT, 32, generator=g)
            .to(dtype), torch.randn(1, 16, generator=g).to(dtype), torch.tensor([0.5]),
            torch.zeros(64, 3), torch.zeros(TEXT, 3))


def run_flux(model, inputs):
    hidden, text, pooled, t, img_ids, txt_ids = inputs
    with torch.no_grad():
        return model(hidden_states=hidden, encoder_hidden_states=text, pooled_projections=pooled,
                     timestep=t, img_ids=img_ids, txt_ids=txt_ids, return_dict=False)[0]


# (model, inputs, runner, the shapes of its attention calls as the log shows them)
WAN_SHAPES = {((1, 2, TOKENS, 64), (1, 2, TOKENS, 64)), ((1, 2, TOKENS, 64), (1, 2, TEXT, 64))}
FLUX_SHAPES = {((1, 2, 64 + TEXT, 64), (1, 2, 64 + TEXT, 64))}  # joint text + image tokens


@pytest.mark.parametrize("name", ["wan", "flux"])
def test_a_cpu_model_falls_back_with_its_reason_logged_once_per_shape(name, spy, caplog):
    make, inputs, go, shapes = {"wan": (wan, wan_inputs(), run, WAN_SHAPES),
                                "flux": (flux, flux_inputs(), run_flux, FLUX_SHAPES)}[name]
    model = make()
    want = go(model, inputs)
    tuner_diffusers.enable(model)
    caplog.set_level(logging.WARNING, "tuner.integrations")
    got = [go(model, inputs) for _ in range(2)]
    assert all(torch.equal(g, want) for g in got)  # torch's SDPA with the caller's arguments
    logged = fallbacks(caplog)
    assert len(logged) == len(shapes)  # one per shape, not per call nor per forward
    assert {_shapes_of(m) for m in logged} == shapes
    assert all("q is on cpu; the kernels run on a CUDA GPU" in m for m in logged)
    assert spy == []


def test_one_reason_for_one_shape_is_logged_once_whatever_the_call_flags(caplog):
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    with routing.SdpaRouter(), torch.no_grad():
        for causal in (False, True, False):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=causal)
    assert len(fallbacks(caplog)) == 1 and "q is on cpu" in fallbacks(caplog)[0]


def test_routes_says_what_an_active_router_sends_to_tuner_attention(lookup):
    q = meta(1, 16, 2, 64)
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool, device="meta")
    assert not routing.routes(q, q, q)  # no router active
    with routing.SdpaRouter():
        assert routing.routes(q, q, q) and not routing.routes(q, q, q, attn_mask=mask)


def test_capture_records_a_routed_call_once_and_a_fallen_back_one_once(tmp_path, monkeypatch):
    # tuner.capture wraps torch's SDPA and hooks tuner.attention; a call an SdpaRouter sends to
    # tuner.attention is recorded there only. A stand-in kernel (this CPU has none) records as
    # tuner.attention's hook does; the call of 24 tokens routes, the one of 16 falls back.
    from tuner import api

    real_decide = routing._decide
    monkeypatch.setattr(routing, "_decide", lambda call: None if call[0][0][2] == 24
                        else real_decide(call))

    def kernel(q, k, v, causal, softmax_scale, max_error):
        api._CAPTURE.record(q, k, v, softmax_scale, causal)
        return routing.TORCH_SDPA(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)

    monkeypatch.setattr(tuner, "attention", kernel)
    with tuner.capture(tmp_path / "acts.safetensors") as recorder, torch.no_grad():
        with routing.SdpaRouter():
            for seq_len in (16, 24):
                q = torch.randn(1, 2, seq_len, 64, dtype=torch.bfloat16)
                torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert {key: r.seen for key, r in recorder.problems.items()} == {
        "b1-h2-s16-d64-full": 1, "b1-h2-s24-d64-full": 1}


COMPILE_INSIDE_A_CAPTURE = """
import sys, torch, tuner, tuner.ops
from tuner import runtime
from tuner.integrations import routing

runtime.config_for_problem = lambda problem, **kwargs: None
sdpa = lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q)
q = torch.randn(1, 2, 16, 64)
with tuner.capture(sys.argv[1]):
    torch.compile(sdpa, backend="eager", fullgraph=True)(q)  # this process's first compile
    sdpa(q)
graphs = []


def routed(q):
    with routing.SdpaRouter():
        return sdpa(q)


torch.compile(routed, fullgraph=True, backend=lambda gm, _: graphs.append(gm) or gm.forward)(
    torch.empty(1, 2, 16, 64, device="meta", dtype=torch.bfloat16))
print(sum(n.target is torch.ops.fp8_attn_tuner.attention.default
          for g in graphs for n in g.graph.nodes))
"""


def test_a_compile_inside_a_capture_leaves_later_compiled_routing_intact(tmp_path):
    # torch lists its overridable functions by name once per process: listed while the capture's
    # stand-in for torch's SDPA is in place, SDPA would never reach a mode under torch.compile.
    out = subprocess.run([sys.executable, "-c", COMPILE_INSIDE_A_CAPTURE,
                          str(tmp_path / "acts.safetensors")], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out.split()[-1] == "1"


def _shapes_of(message: str) -> tuple:
    query = message.split("query ")[1].split(" and key")[0]
    key = message.split("key ")[1].split(" (batch")[0]
    return tuple(int(d) for d in query.strip("()").split(", ")), \
        tuple(int(d) for d in key.strip("()").split(", "))


@pytest.mark.parametrize("head_dim, dtype, reason", [
    (64, torch.float32, "q has dtype torch.float32; pass bfloat16 or float16"),
    (32, torch.bfloat16, "head_dim 32 is not supported; supported: (64, 128)"),
])
def test_what_the_kernels_cannot_run_runs_to_the_end_on_torch_sdpa(head_dim, dtype, reason, spy,
                                                                   caplog):
    model = wan(head_dim, dtype)
    inputs = wan_inputs(dtype)
    want = run(model, inputs)
    tuner_diffusers.enable(model)
    assert torch.equal(run(model, inputs), want)
    assert fallbacks(caplog) and all(reason in m for m in fallbacks(caplog))
    assert spy == []


def meta(*shape):
    return torch.empty(*shape, device="meta", dtype=torch.bfloat16)


# diffusers' own dispatch (its native backend, the default) with (batch, seq_len, heads,
# head_dim) tensors, inside the router an enabled processor runs in.
@pytest.mark.parametrize("v_dim, kv_len, kwargs, reason", [
    (64, 16, {"attn_mask": torch.ones(1, 1, 16, 16, dtype=torch.bool, device="meta")},
     "attn_mask is not supported (the FP8 kernels run unmasked attention)"),
    (64, 16, {"dropout_p": 0.1}, "dropout_p=0.1 is not supported"),
    (64, 9, {"is_causal": True}, "is_causal=True with 16 queries and 9 keys: torch's is_causal "
                                 "aligns the diagonal to the top left"),
    (128, 16, {}, "value head_dim other than key's is not supported"),
])
def test_each_refusal_falls_back_naming_its_reason(v_dim, kv_len, kwargs, reason, lookup, spy,
                                                  caplog):
    q = meta(1, 16, 4, 64)
    k, v = meta(1, kv_len, 4, 64), meta(1, kv_len, 4, v_dim)
    with routing.SdpaRouter() as router, torch.no_grad():
        out = dispatch_attention_fn(q, k, v, **kwargs)
    assert out.shape == (1, 16, 4, v_dim) and router.calls == 1
    assert spy == [] and len(fallbacks(caplog)) == 1 and reason in fallbacks(caplog)[0]


@pytest.mark.parametrize("kv_len, kv_heads, kwargs", [
    (16, 4, {"is_causal": True}), (9, 2, {"enable_gqa": True}), (16, 4, {"scale": 0.3}),
])
def test_what_the_kernels_honour_routes_with_its_arguments(kv_len, kv_heads, kwargs, lookup, spy):
    q = meta(1, 16, 4, 64)
    kv = meta(1, kv_len, kv_heads, 64)
    with routing.SdpaRouter(), torch.no_grad():
        dispatch_attention_fn(q, kv, kv, **kwargs)
    assert spy == [{"q": (1, 16, 4, 64), "k": (1, kv_len, kv_heads, 64), "contiguous": True,
                    "causal": kwargs.get("is_causal", False),
                    "softmax_scale": kwargs.get("scale"), "max_error": None}]


def test_inputs_that_need_grad_fall_back(lookup, spy, caplog):
    q = meta(1, 16, 2, 64).requires_grad_()
    with routing.SdpaRouter():
        dispatch_attention_fn(q, q, q)
    with routing.SdpaRouter(), torch.no_grad():
        dispatch_attention_fn(q, q, q)
    assert len(spy) == 1  # the second, without grad, runs on the kernels
    assert fallbacks(caplog) and "requires grad: the FP8 kernels have no backward" in \
        fallbacks(caplog)[0]


def test_a_lookup_refusal_falls_back_with_its_message(lookup, spy, caplog):
    lookup.refuse = "no kernel can run b1-h2-s16-d64-full on the h100 (planted)"
    q = meta(1, 16, 2, 64)
    with routing.SdpaRouter(), torch.no_grad():
        dispatch_attention_fn(q, q, q)
    assert spy == []
    assert "no kernel to run it: no kernel can run b1-h2-s16-d64-full on the h100 (planted)" in \
        fallbacks(caplog)[0]


def test_a_tuner_error_from_the_call_falls_back_and_is_not_tried_again(lookup, monkeypatch,
                                                                       caplog):
    tried = []

    def refusing(q, k, v, **kwargs):
        tried.append(tuple(q.shape))
        raise TunerError("config X cannot run b1-h2-s16-d64-full (planted)")

    monkeypatch.setattr(tuner, "attention", refusing)
    q = meta(1, 16, 2, 64)
    with routing.SdpaRouter(), torch.no_grad():
        outs = [dispatch_attention_fn(q, q, q) for _ in range(2)]
    assert [o.shape for o in outs] == [(1, 16, 2, 64)] * 2
    assert tried == [(1, 16, 2, 64)]
    assert len(fallbacks(caplog)) == 1
    assert "tuner.attention refused it: config X cannot run" in fallbacks(caplog)[0]


def compiled_ops(model, inputs, dynamic):
    graphs = []

    def backend(gm, _example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, fullgraph=True, backend=backend, dynamic=dynamic)
    out = run(compiled, inputs)
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    return out, targets


@pytest.mark.parametrize("dynamic", [False, True])
def test_fullgraph_compile_holds_the_op_for_each_routed_call(dynamic, lookup):
    model = wan(device="meta")
    tuner_diffusers.enable(model)
    out, targets = compiled_ops(model, wan_inputs(device="meta"), dynamic)
    assert out.shape == (1, 4, 2, 8, 8)
    assert targets.count(OP) == 4
    assert torch.nn.functional.scaled_dot_product_attention not in targets


def test_fullgraph_compile_bakes_max_error_into_the_op(lookup):
    model = wan(device="meta")
    tuner_diffusers.enable(model, max_error=0.08)
    graphs = []

    def backend(gm, _example_inputs):
        graphs.append(gm)
        return gm.forward

    run(torch.compile(model, fullgraph=True, backend=backend), wan_inputs(device="meta"))
    calls = [n for g in graphs for n in g.graph.nodes if n.target is OP]
    assert len(calls) == 4 and all(0.08 in n.args or n.kwargs.get("max_error") == 0.08
                                   for n in calls)


def test_fullgraph_compile_of_a_cpu_model_holds_torch_sdpa_and_its_output(caplog):
    model = wan()
    inputs = wan_inputs()
    want = run(model, inputs)
    tuner_diffusers.enable(model)
    out, targets = compiled_ops(model, inputs, dynamic=False)
    assert targets.count(torch.nn.functional.scaled_dot_product_attention) == 4
    assert OP not in targets and torch.equal(out, want)
    assert len(fallbacks(caplog)) == 2  # decided while tracing, logged once per shape
