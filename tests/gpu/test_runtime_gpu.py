"""tuner.attention() on the GPU: correct against the fp32 reference, compiled once, capturable."""

import time

import pytest
import torch

from tuner import runtime
from variants.prepare_check import declared_transforms, prepare_mismatch
from variants.reference import quantize_reference, validate

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("empty_db")]


def qkv(seq, heads=56, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [
        torch.randn(1, seq, heads, 128, device="cuda", generator=g, dtype=torch.bfloat16)
        for _ in range(3)
    ]


@pytest.mark.parametrize("seq", [1, 1000, 8192])
def test_attention_matches_the_reference(seq):
    q, k, v = qkv(seq, seed=seq)
    out, lse = tuner_attention(q, k, v)
    best = runtime.load_best_config(seq, heads=56, with_source=True)
    # The gate's checks: the reference on its own quantization of q, k, v; the config's
    # prepare decodes to exactly those codes.
    # The config's transforms (the default smooths K; tuned rows may rotate Q and K as well).
    cfg = best.config
    kernel = runtime._kernel_for(best.family, cfg, runtime.Problem(1, 56, seq, 128), "auto")
    prepared = kernel.prepare(q, k, v)
    k_mean, mismatch = declared_transforms(prepared, k, cfg.k_smoothing, cfg.qk_rotation)
    assert mismatch is None
    ref = quantize_reference(q, k, v, k_mean=k_mean, rotate=cfg.qk_rotation == "hadamard")
    assert prepare_mismatch(prepared, ref) is None
    metrics = validate(q, k, v, out, lse, k_smoothing=cfg.k_smoothing,
                       qk_rotation=cfg.qk_rotation)
    print(
        f"\nS={seq}: {best.family} {best.config.short()} [{best.source}] "
        f"rel_rms={metrics.rel_rms:.4f}"
    )
    assert metrics.passed, metrics.reason
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and lse.shape == (1, 56, seq)


def tuner_attention(q, k, v, config=None):
    import tuner

    return tuner.attention(q, k, v, return_lse=True, config=config)


def _q_in_kernel_config():
    import dataclasses

    from variants import wgmma

    return dataclasses.replace(wgmma.default("sm_90a"), q_quant="kernel")


def test_second_call_does_not_compile(monkeypatch):
    q, k, v = qkv(1000)
    tuner_attention(q, k, v)  # compiles (or loads the disk cache)
    best = runtime.load_best_config(1000, heads=56, with_source=True)
    from variants import load_family

    family = load_family(best.family)
    calls = []
    real = family.compile
    monkeypatch.setattr(family, "compile", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tuner_attention(q, k, v)
    torch.cuda.synchronize()
    second_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for _ in range(1000):
        runtime.load_best_config(1000, heads=56)
    lookup_us = (time.perf_counter() - t0) * 1e3
    print(
        f"\nsecond attention() call {second_ms:.2f} ms (no compile); "
        f"cached load_best_config {lookup_us:.1f} us per call"
    )
    assert calls == []


@pytest.mark.parametrize("q_in_kernel", [False, True], ids=["looked-up", "q-quant-kernel"])
def test_cuda_graph_capture_and_replay_match_eager(q_in_kernel):
    config = _q_in_kernel_config() if q_in_kernel else None
    q, k, v = qkv(1000, seed=7)
    eager, eager_lse = tuner_attention(q, k, v, config)  # first call: compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tuner_attention(q, k, v, config)  # warm the allocator on the side stream (torch advice)
        with torch.cuda.graph(graph, stream=stream):
            captured, captured_lse = tuner_attention(q, k, v, config)
    torch.cuda.current_stream().wait_stream(stream)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager) and torch.equal(captured_lse, eager_lse)
    # New inputs copied into the captured buffers flow through the replay.
    q2, k2, v2 = qkv(1000, seed=8)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, tuner_attention(q2, k2, v2, config)[0])


@pytest.mark.parametrize("rotate", [False, True], ids=["smoothed", "smoothed-rotated"])
@pytest.mark.parametrize(("heads", "kv_heads", "seq_kv", "causal"),
                         [(56, 56, 1000, False), (8, 2, 777, True)],
                         ids=["self", "gqa-cross-causal"])
def test_a_planned_call_with_or_without_the_lse_gives_the_first_calls_bits(rotate, heads,
                                                                           kv_heads, seq_kv,
                                                                           causal):
    """The plan runs the quantization without q . m where the caller drops the LSE, and with it
    where the LSE is returned: both give the output, and the latter the LSE, of the first call
    (prepare + run) bit for bit; with grouped KV heads each query head's shift is its KV
    head's."""
    import dataclasses

    import tuner
    from variants import wgmma

    problem = runtime.Problem(1, heads, 1000, 128, seq_len_kv=seq_kv, kv_heads=kv_heads,
                              causal=causal)
    config = dataclasses.replace(wgmma.default("sm_90a", problem), q_quant="prepare",
                                 k_smoothing="mean", qk_rotation="hadamard" if rotate else "none")
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(1, 1000, heads, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(1, seq_kv, kv_heads, 128, device="cuda", generator=g,
                        dtype=torch.bfloat16) for _ in range(2))
    k += 4 * torch.randn(kv_heads, 128, device="cuda", generator=g,
                         dtype=torch.bfloat16)  # a bias per KV head, which smoothing removes
    first_out, first_lse = tuner.attention(q, k, v, causal=causal, return_lse=True,
                                           config=config)
    dropped = tuner.attention(q, k, v, causal=causal, config=config)
    out, lse = tuner.attention(q, k, v, causal=causal, return_lse=True, config=config)
    assert torch.equal(dropped, first_out) and torch.equal(out, first_out)
    assert torch.equal(lse, first_lse)
    metrics = validate(q, k, v, out, lse, causal=causal, k_smoothing="mean",
                       qk_rotation=config.qk_rotation)
    assert metrics.passed, metrics.reason
