"""A CPU family whose kernel is the real families' arithmetic without the GPU: prepare is the real
`quantize_inputs` (with the prepare-only knobs k_smoothing and qk_rotation, and wgmma's pv_dtype:
V left unquantized in bf16 for P.V in 16 bits, qk_dtype: int8 Q and K codes, and kv_scales: one
K and V scale per head, which the fold then reads in every block), run is
`block_scales.folded_attention` (the torch emulation of what both families compute: Q's and K's
scales in the exponent's factor, V's as log2 sv, P' rounded to e4m3, or to bf16 with
pv_dtype="bf16", the row sum of P' / sv) followed by what CompiledKernel.run does after its
launch (`restore_lse` unless want_lse=False).

The gate must accept it as it accepts the GPU kernels (tests/test_gate_fold.py), and the planted
bugs around it (tests/doubles/planted_folded.py) prove on the CPU that the gate rejects wrong
transforms in prepare and a wrong LSE shift in run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from variants import transforms
from variants.base import ConfigMixin, ResourceUsage
from variants.block_scales import KV_SCALES, folded_attention
from variants.prepare import quantize_inputs

DEVICE = "cpu"
PAD_TO = 128
PV_DTYPES = ("e4m3", "bf16")  # wgmma's (variants/wgmma/config.py)
QK_DTYPES = ("e4m3", "int8")  # wgmma's


@dataclass(frozen=True)
class Config(ConfigMixin):
    block_n: int = 128  # keys per strip of the emulated loop
    k_smoothing: str = "mean"  # as both families default
    qk_rotation: str = "none"
    pv_dtype: str = "e4m3"  # wgmma's knob: "bf16" rounds P to bf16 and reads V unquantized
    qk_dtype: str = "e4m3"  # wgmma's knob: "int8" quantizes Q and K to int8 (amax / 127)
    kv_scales: str = "block"  # wgmma's knob: "head" scales K and V once per (batch, KV head)

    @property
    def register_p(self) -> bool:
        return False

    @property
    def v_unquantized(self) -> bool:
        return self.pv_dtype == "bf16"

    @property
    def qk_int8(self) -> bool:
        return self.qk_dtype == "int8"

    @property
    def v_feature_major(self) -> bool:
        return False  # folded_attention reads V token-major, like K

    def pad_to(self) -> int:
        return PAD_TO


def space(arch: str) -> dict[str, list]:
    return {"block_n": [64, 128], "k_smoothing": list(transforms.K_SMOOTHINGS),
            "qk_rotation": list(transforms.QK_ROTATIONS), "pv_dtype": list(PV_DTYPES),
            "qk_dtype": list(QK_DTYPES), "kv_scales": list(KV_SCALES)}


def default(arch: str, problem=None) -> Config:
    return Config()


def can_implement(cfg, problem, gpu) -> tuple[bool, str | None]:
    unknown = transforms.check_knobs(cfg.k_smoothing, cfg.qk_rotation)
    if not unknown and cfg.pv_dtype not in PV_DTYPES:
        unknown = f"pv_dtype={cfg.pv_dtype!r} unknown; one of {PV_DTYPES}"
    if not unknown and cfg.qk_dtype not in QK_DTYPES:
        unknown = f"qk_dtype={cfg.qk_dtype!r} unknown; one of {QK_DTYPES}"
    if not unknown and cfg.kv_scales not in KV_SCALES:
        unknown = f"kv_scales={cfg.kv_scales!r} unknown; one of {KV_SCALES}"
    return (False, unknown) if unknown else (True, None)


class FoldedKernel:
    def __init__(self, cfg: Config, problem) -> None:
        self.config, self.problem = cfg, problem
        self.resources = ResourceUsage(registers=0, spill_bytes=0, smem_bytes=0)

    def prepare(self, q, k, v, softmax_scale=None, validate=True, want_lse=True):
        return quantize_inputs(q, k, v, pad_to=PAD_TO, softmax_scale=softmax_scale,
                               validate=validate, v_feature_major=False,
                               k_smoothing=self.config.k_smoothing,
                               qk_rotation=self.config.qk_rotation,
                               v_unquantized=self.config.v_unquantized,
                               qk_dtype=self.config.qk_dtype,
                               kv_scales=self.config.kv_scales)

    def run(self, prepared, out=None, lse=None, *, want_lse: bool = True):
        skv = prepared.seq_len_kv
        q_codes, q_descale = prepared.q_codes_and_descales()
        scales = prepared.scales
        o, lse_ = folded_attention(
            q_codes, q_descale.permute(0, 2, 1), prepared.k[:, :skv],
            scales.k.permute(0, 2, 1), prepared.v[:, :skv], scales.v.permute(0, 2, 1),
            softmax_scale=prepared.softmax_scale, block_n=self.config.block_n,
            causal=self.problem.causal,
            p_dtype=torch.bfloat16 if prepared.v_unquantized else torch.float8_e4m3fn)
        out = o.bfloat16() if out is None else out.copy_(o)
        lse = lse_ if lse is None else lse.copy_(lse_)
        if want_lse:
            prepared.restore_lse(lse)
        return out, lse


def compile(cfg, problem, arch: str):  # noqa: A001 - the family contract's name
    return FoldedKernel(cfg, problem)
