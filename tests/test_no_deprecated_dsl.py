"""The project's own CuTe DSL calls use the DSL's current API: compiling each kernel (both
attention families for their archs, the block quantization and the FP8 layout copy) raises no
DeprecationWarning from a file of this repository."""

import warnings
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.compile

REPO = Path(__file__).resolve().parents[1]


def _compile_wgmma():
    from tuner.problem import Problem
    from variants import wgmma

    problem = Problem(1, 2, 77)
    wgmma.compile(wgmma.default("sm_90a", problem), problem, "sm_90a")


def _compile_mma_sync():
    from tuner.problem import Problem
    from variants import mma_sync

    problem = Problem(1, 2, 77)
    mma_sync.compile(mma_sync.default("sm_120a", problem), problem, "sm_120a")


def _compile_block_quantize(tmp_path):
    from variants.block_quantize_kernel import compile_kernel

    compile_kernel("quant", torch.bfloat16, 128, "sm_90a", keep_ptx_in=str(tmp_path))


def _compile_layout(tmp_path):
    from variants.layout_kernel import compile_kernel

    compile_kernel(128, "sm_90a", True, keep_ptx_in=str(tmp_path))


@pytest.mark.parametrize("build", ["wgmma", "mma_sync", "block_quantize", "layout"])
def test_compiling_raises_no_deprecation_warning_from_this_repository(build, own_build, tmp_path,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)  # --keep-cubin writes the cubin to the working directory
    compile_ = {"wgmma": _compile_wgmma, "mma_sync": _compile_mma_sync,
                "block_quantize": lambda: _compile_block_quantize(tmp_path),
                "layout": lambda: _compile_layout(tmp_path)}[build]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile_()
    ours = sorted({f"{Path(w.filename).relative_to(REPO)}:{w.lineno}: {w.message}"
                   for w in caught if issubclass(w.category, DeprecationWarning)
                   and Path(w.filename).resolve().is_relative_to(REPO)})
    assert not ours, "\n".join(ours)
