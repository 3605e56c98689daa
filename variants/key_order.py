"""The register-P key order of V (mma.sync m16n8k32 and wgmma k32 fragments): which stored slot
holds which key, in both directions. Pure integer arithmetic, so it serves torch tensors, Python
ints and the fused cast's DSL integers alike (variants/quantize_kernel.py computes slots inline
with key_slot)."""

from __future__ import annotations

import torch


def register_p_key_order(length: int) -> torch.Tensor:
    """Stored position -> original key, for the register-P layout of mma.sync m16n8k32.

    A thread of the S accumulator holds keys 2t, 2t+1 (lane t = lane % 4) of every 8-key n-tile;
    the A fragment of m16n8k32 wants k-slots 4t..4t+3 of every 16 keys from that same thread. So
    within each 16-key group, slot 4t + e holds key 8*(e // 2) + 2t + e % 2. `length` must be a
    multiple of 16 (prepare pads first).
    """
    if length % 16:
        raise ValueError(f"key-order permutation needs a multiple of 16 keys, got {length}")
    return key_at_slot(torch.arange(length))


def key_at_slot(pos):
    """The key stored at position `pos` (register_p_key_order elementwise): integer arithmetic
    only, for torch tensors, Python ints and the cast kernel's DSL integers alike."""
    group, quad, element = pos // 16 * 16, (pos % 16) // 4, pos % 4
    return group + 8 * (element // 2) + 2 * quad + element % 2


def key_slot(key):
    """The stored position of `key` under register_p_key_order (its inverse): within each 16
    keys, key 8a + 2t + c sits in slot 4t + 2a + c. Integer arithmetic only, so it serves torch
    tensors, Python ints and the fused cast's DSL integers alike."""
    k = key % 16
    return key - k + 4 * ((k % 8) // 2) + 2 * (k // 8) + k % 2


def inverse_key_order(length: int) -> torch.Tensor:
    if length % 16:
        raise ValueError(f"key-order permutation needs a multiple of 16 keys, got {length}")
    return key_slot(torch.arange(length))
