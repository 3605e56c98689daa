"""Planted-bug families: a real family's default kernel with one realistic bug each, which the
correctness gate (tuner/gate.py) must reject as `wrong_result`.

`planted_family(base)` builds the five family functions around a base family module: the space
is one config per bug (and "none", the base kernel untouched, which must pass), so a real
`tuner search --families tests.doubles.planted_wgmma` measures every bug once. Each bug copies a
kind of wrong kernel that really happens; a gate that lets one through fails its test. A bug in
prepare's exact transforms runs on the base default with the knob it needs turned on (KNOBS);
a base family without that knob cannot plant it (can_implement says so).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

import torch

from variants.base import ConfigMixin
from variants.block_scales import quantize_key_blocks, quantize_rows

# bug -> the check of the gate expected to catch it first (variants/reference.py's reasons)
BUGS = {
    "none": None,
    "tail_row": "worst row",  # the last query row of every (batch, head) holds row S-2's output
    "head_scale": "head scale",  # the last head's output 3% too large (a wrong V descale)
    "v_group_swap": "prepare",  # prepare swaps V's keys 0-15 with 16-31
    "last_key_masked": "worst row",  # the mask is off by one: key S-1 is ignored
    "lse_shift": "LSE",  # LSE 0.05 too large
    "one_nan": "non-finite",  # one element of the output is NaN
    "batch_cross": "worst row",  # batch 0's output written into batch 1
    # causal: the diagonal itself masked (row r sees keys < r + offset, one too few): the first
    # row that sees one key then sees none, an LSE of -inf where the reference has a finite one
    "causal_diagonal_dropped": "non-finite",
    # grouped KV heads: query head h reads KV head h // group + 1 (mod kv_heads)
    "kv_head_shifted": "worst row",
    # query heads 0 and 1 trade outputs (and LSE): with grouped KV heads packed into one tile
    # (wgmma's pack_gqa) two rows of a group stored at each other's head
    "packed_heads_swapped": "worst row",
    # K smoothing: prepare subtracts the next KV head's mean (the next batch's with one KV
    # head) but declares the right one: k's codes are not those of k - m
    "k_mean_subtracted_wrong": "prepare",
    # K smoothing: prepare subtracts the right mean but declares the next KV head's
    "k_mean_declared_wrong": "prepare",
    # K smoothing: the LSE returned is the kernel's, of the smoothed scores (no q . m added)
    "lse_unshifted": "LSE",
    # the Q/K rotation: K's codes rotated, Q's not (both declared rotated)
    "rotation_k_only": "prepare",
    # the kernel runs with head_dim^-0.5 whatever softmax scale the caller gave
    "softmax_scale_ignored": "worst row",
    # P.V in 16 bits: the kernel reads V rounded to e4m3 (64-key block scales) while the config
    # declares it unquantized (prepare's output is right)
    "pv16_v_rounded_e4m3": "relative RMS",
    # QK^T in int8: prepare scales Q's codes by 448 / amax (e4m3's) instead of 127 / amax,
    # clamped to +-127, and writes the matching descales amax / 448
    "qk_int8_q_at_448": "prepare",
}

# The prepare-only knobs a bug's base config turns on (variants/transforms.py).
KNOBS = {"k_mean_subtracted_wrong": {"k_smoothing": "mean"},
         "k_mean_declared_wrong": {"k_smoothing": "mean"},
         "lse_unshifted": {"k_smoothing": "mean"},
         "rotation_k_only": {"qk_rotation": "hadamard"},
         "pv16_v_rounded_e4m3": {"pv_dtype": "bf16"},
         "qk_int8_q_at_448": {"qk_dtype": "int8"}}


def expected_check(bug: str, problem) -> str | None:
    """The gate's check that must catch `bug` on `problem`: BUGS's, except that without a
    causal mask causal_diagonal_dropped is a kernel that drops the last key (no row turns empty)."""
    if bug == "causal_diagonal_dropped" and not problem.causal:
        return "worst row"
    return BUGS[bug]


# Bugs the GPU suite plants only in problems with the feature they break.
# last_key_masked copies rows 0 .. S-2 of a run without the last key: under a causal mask only
# row S-1 sees that key, so there it would copy right answers.
APPLIES = {"causal_diagonal_dropped": lambda p: p.causal,
           "kv_head_shifted": lambda p: p.kv_heads >= 2,
           "packed_heads_swapped": lambda p: p.heads >= 2,
           "last_key_masked": lambda p: not p.causal}


@dataclass(frozen=True)
class Config(ConfigMixin):
    bug: str


def _swap_first_v_groups(prepared) -> None:
    """Keys 0-15 and 16-31 of V trade places, in whatever layout prepare wrote."""
    if prepared.seq_len < 32:
        return
    v = prepared.v
    if prepared.v_feature_major:
        slots = prepared.natural_key_slots()[:32]
        a, b = slots[:16], slots[16:]
        first = v[..., a].clone()
        v[..., a] = v[..., b]
        v[..., b] = first
    else:
        first = v[:, :16].clone()
        v[:, :16] = v[:, 16:32]
        v[:, 16:32] = first


def _v_rounded_e4m3(v: torch.Tensor) -> torch.Tensor:
    """V (batch, seq_len_kv, kv_heads, head_dim) as its e4m3 codes times their block scales,
    in V's dtype: what a 16-bit P.V kernel that quantized V anyway computes with."""
    codes, descale = quantize_key_blocks(v)
    per_key = descale.repeat_interleave(64, dim=1)[:, :v.shape[1], :, None]
    return (codes.float() * per_key).to(v.dtype)


def _another_head(m: torch.Tensor) -> torch.Tensor:
    """A smoothing vector (batch, kv_heads, head_dim) moved one KV head on (one batch on with a
    single KV head): every (batch, KV head) gets another one's mean."""
    return m.roll(1, dims=1 if m.shape[1] >= 2 else 0)


def _requantize_k(prepared, k_t: torch.Tensor) -> None:
    """prepared's k codes and K block scales replaced by those of k_t (batch, seq_len_kv,
    kv_heads, head_dim), in place (k is token-major in every layout)."""
    codes, descale = quantize_key_blocks(k_t)
    prepared.k[:, :prepared.seq_len_kv] = codes
    k_scales = prepared.scale_layout.views(prepared.packed)[1]
    k_scales[..., :descale.shape[1]] = descale.permute(0, 2, 1)


def _q_int8_at_448(prepared, q: torch.Tensor) -> None:
    """prepared's int8 q codes scaled by e4m3's 448 / amax (clamped to +-127) and q's descales
    amax / 448, in place."""
    amax = q.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    codes = (q.float() * (448.0 / amax)).round().clamp(-127, 127).to(torch.int8)
    prepared.q[:, :prepared.seq_len] = codes
    prepared.scale_layout.views(prepared.packed)[0][..., :prepared.seq_len] = \
        (amax[..., 0] / 448.0).permute(0, 2, 1)


def _requantize_q(prepared, q_t: torch.Tensor) -> None:
    """prepared's q codes and scales replaced by those of q_t, in place."""
    codes, descale = quantize_rows(q_t)
    prepared.q[:, :prepared.seq_len] = codes
    prepared.scale_layout.views(prepared.packed)[0][..., :prepared.seq_len] = \
        descale.permute(0, 2, 1)


class PlantedKernel:
    """The base kernel with `cfg.bug`; `config` is the base kernel's (the transforms its
    prepare applies, the q dtypes it reads: what the gate asks of it)."""

    def __init__(self, kernel, cfg: Config) -> None:
        self._kernel = kernel
        self.bug = cfg.bug
        self.config = kernel.config
        self.resources = kernel.resources

    def prepare(self, q, k, v, softmax_scale=None, **kwargs):
        prepared = self._kernel.prepare(q, k, v, softmax_scale, **kwargs)
        if self.bug == "v_group_swap":
            _swap_first_v_groups(prepared)
        elif self.bug == "k_mean_subtracted_wrong":
            _requantize_k(prepared, k.float() - _another_head(prepared.k_mean)[:, None])
        elif self.bug == "k_mean_declared_wrong":
            prepared = dataclasses.replace(prepared, k_mean=_another_head(prepared.k_mean))
        elif self.bug == "rotation_k_only":
            _requantize_q(prepared, q)
        elif self.bug == "qk_int8_q_at_448":
            _q_int8_at_448(prepared, q)
        return prepared

    def run(self, prepared, out=None, lse=None, *, want_lse=True):
        bug, s = self.bug, prepared.seq_len
        if bug == "lse_unshifted":
            want_lse = False
        elif bug == "softmax_scale_ignored":
            prepared = dataclasses.replace(prepared, softmax_scale=prepared.q.shape[-1] ** -0.5)
        elif bug == "pv16_v_rounded_e4m3":
            prepared = dataclasses.replace(prepared, v=_v_rounded_e4m3(prepared.v))
        out, lse = self._kernel.run(prepared, out=out, lse=lse, want_lse=want_lse)
        if bug == "last_key_masked" and s >= 2:
            # The same kernel over keys 0 .. S-2 gives rows 0 .. S-2 of a kernel whose mask
            # drops the last key.
            # K smoothing's q . m is cut to those rows, for run to add back as it does.
            raw = prepared.raw_lse_shift()
            short_out, short_lse = self._kernel.run(dataclasses.replace(
                prepared, seq_len=s - 1, seq_len_kv=prepared.seq_len_kv - 1,
                q_dot_mean=None if raw is None else raw[:, :, : s - 1]), want_lse=want_lse)
            out[:, : s - 1] = short_out
            lse[:, :, : s - 1] = short_lse
        elif bug == "tail_row" and s >= 2:
            out[:, s - 1] = out[:, s - 2]
            lse[:, :, s - 1] = lse[:, :, s - 2]
        elif bug == "head_scale":
            out[:, :, -1] *= 1.03
        elif bug == "lse_shift":
            lse += 0.05
        elif bug == "one_nan":
            out[0, s // 2, 0, 0] = float("nan")
        elif bug == "packed_heads_swapped" and out.shape[2] >= 2:
            out[:, :, [0, 1]] = out[:, :, [1, 0]]
            lse[:, [0, 1]] = lse[:, [1, 0]]
        elif bug == "batch_cross" and out.shape[0] >= 2:
            out[1] = out[0]
            lse[1] = lse[0]
        elif bug == "causal_diagonal_dropped" and prepared.seq_len_kv >= 2:
            # Bottom-right causal over keys 0 .. Skv-2: row r sees keys <= r + offset - 1, the
            # real kernel with its diagonal moved one key left.
            short = dataclasses.replace(prepared, seq_len_kv=prepared.seq_len_kv - 1)
            out, lse = self._kernel.run(short, out=out, lse=lse, want_lse=want_lse)
        elif bug == "kv_head_shifted" and prepared.k.shape[2] >= 2:
            # K and V read one KV head further on (their descales with them): prepare's codes
            # are right, the kernel's head mapping is not.
            def roll(x, dim):  # torch has no roll for e4m3: roll the bytes
                return x.view(torch.uint8).roll(-1, dims=dim).view(torch.float8_e4m3fn)

            packed = prepared.packed.clone()  # K's and V's scales roll by one head with them
            for part in prepared.scale_layout.views(packed)[1:]:  # (batch, kv_heads, blocks)
                part.copy_(part.roll(-1, dims=1))
            shifted = dataclasses.replace(
                prepared, k=roll(prepared.k, 2),
                v=roll(prepared.v, 1 if prepared.v_feature_major else 2), packed=packed)
            out, lse = self._kernel.run(shifted, out=out, lse=lse, want_lse=want_lse)
        return out, lse


def planted_family(base_name: str):
    """(space, default, can_implement, compile) of the planted family around `base_name`."""
    base = importlib.import_module(base_name)
    knob_names = {f.name for f in dataclasses.fields(base.Config)}

    def base_config(arch, problem, bug):
        """The base default, with the knobs the bug needs on (None: the base has no such
        knob). The rotation and int8 Q need Q quantized in prepare: a config that quantizes it in
        the kernel runs its twin that does not (the one fp16 callers get)."""
        cfg = base.default(arch, problem)
        knobs = KNOBS.get(bug, {})
        if not set(knobs) <= knob_names:
            return None
        if {"qk_rotation", "qk_dtype"} & set(knobs) and cfg.q_in_kernel:
            cfg = cfg.for_q_dtype("float16")
        return dataclasses.replace(cfg, **knobs)

    def space(arch: str) -> dict[str, list]:
        return {"bug": list(BUGS)}

    def default(arch: str, problem=None) -> Config:
        return Config("none")

    def can_implement(cfg, problem, gpu) -> tuple[bool, str | None]:
        if cfg.bug not in BUGS:
            return False, f"unknown planted bug {cfg.bug!r}"
        arch = gpu.arch if gpu is not None else "cpu"
        base_cfg = base_config(arch, problem, cfg.bug)
        if base_cfg is None:
            return False, f"{cfg.bug} needs the base family to have the knobs {KNOBS[cfg.bug]}"
        return base.can_implement(base_cfg, problem, gpu)

    def compile(cfg, problem, arch: str):
        return PlantedKernel(base.compile(base_config(arch, problem, cfg.bug), problem, arch),
                             cfg)

    return space, default, can_implement, compile
