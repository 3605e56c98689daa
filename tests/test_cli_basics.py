"""CLI plumbing: one-line errors, `tuner gpus`, `tuner space` without compiling."""

import json
import subprocess
import sys

import pytest

from tuner.cli import main


def test_gpus_json_lists_profiles_and_says_there_is_no_local_gpu(capsys):
    assert main(["gpus", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["profiles"]) >= {"5080", "h200"}
    assert "no CUDA GPU" in out["local"]["error"]


def test_user_errors_are_one_line_with_exit_2(capsys):
    assert main(["space", "--gpu", "a100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown GPU 'a100'" in err and "5080" in err


def test_python_dash_m_tuner_is_the_same_program():
    result = subprocess.run([sys.executable, "-m", "tuner", "--help"], capture_output=True,
                            text=True, check=True)
    assert "space" in result.stdout and "gpus" in result.stdout


def test_space_enumerates_and_explains_rejections(capsys):
    assert main(["space", "--gpu", "5080", "--family", "mma_sync", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    summary = report["summary"]
    assert report["arch"] == "sm_120a"
    assert 0 < summary["feasible"] < summary["total"]
    rejected = [c for c in report["configs"] if c["status"] == "rejected"]
    assert rejected and all(c["reason"] for c in rejected)
    assert any("shared memory" in reason for reason in summary["rejected_by_reason"])


@pytest.mark.compile
def test_space_compiles_a_subset_for_the_5080(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    args = ["space", "--gpu", "5080", "--family", "mma_sync", "--compile", "--limit", "2",
            "--jobs", "2", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    compiled = [c for c in report["configs"] if c["status"] == "compiled"]
    assert report["summary"]["compiled"] == 2 and len(compiled) == 2
    # --limit compiles fewer, it does not make the rest infeasible.
    assert report["summary"]["feasible"] > 2
    for c in compiled:
        assert 0 < c["registers"] <= 255 and c["smem_bytes"] > 0 and c["spill_bytes"] >= 0
    # The MMA class from each build's SASS: the first two configs differ only in pv_accum.
    from variants.cubin import nvdisasm_path

    if nvdisasm_path() is None:
        assert all(c["mma_class"] is None for c in compiled)
        return
    assert {c["config"]["pv_accum"] for c in compiled} == {"fp32", "fp16"}
    for c in compiled:
        fp16 = c["config"]["pv_accum"] == "fp16"
        assert ("QMMA.F16" in c["mma_class"]) == fp16 and "QMMA.F32" in c["mma_class"]
    assert report["summary"]["mma_classes"] == {c["mma_class"]: 1 for c in compiled}
