"""The synthetic activation kinds have the structure their names promise."""

import pytest
import torch

from tuner.activations import KINDS, activations, kind
from tuner.problem import Problem

PROBLEM = Problem(2, 8, 300, 128, seq_len_kv=200, kv_heads=2)


def test_shapes_dtype_and_seed():
    for name in KINDS:
        q, k, v = activations(name, PROBLEM, "cpu", 5, torch.float16)
        assert q.shape == (2, 300, 8, 128) and k.shape == v.shape == (2, 200, 2, 128)
        assert q.dtype == k.dtype == v.dtype == torch.float16
        again = activations(name, PROBLEM, "cpu", 5, torch.float16)
        assert all(torch.equal(a, b) for a, b in zip((q, k, v), again, strict=True))


def test_k_bias_is_shared_by_tokens():
    q, k, v = (x.float() for x in activations("k_bias_20", PROBLEM, "cpu", 1))
    # The per-channel mean over tokens carries the bias (std 20); the tokens' spread stays 1.
    assert 12 < float(k.mean(dim=1).std()) < 28
    assert 0.8 < float((k - k.mean(dim=1, keepdim=True)).std()) < 1.2
    assert float(q.mean(dim=1).std()) < 0.2 and float(v.mean(dim=1).std()) < 0.2


def test_outlier_channels_match_in_q_and_k():
    q, k, _ = (x.float() for x in activations("outliers", PROBLEM, "cpu", 2))
    k_big = k.abs().mean(dim=1) > 10  # (batch, kv_heads, dim)
    q_big = q.abs().mean(dim=1) > 10
    assert int(k_big.sum()) == 2 * 2 * 4
    # Query head h shares its KV head's (h // group) channels.
    assert torch.equal(q_big, k_big.repeat_interleave(PROBLEM.group, dim=1))


def test_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match="k_bias_8"):
        kind("k_bias")
