import pytest

from tuner import gpus
from tuner.errors import TunerError
from tuner.gpus import PROFILES, fingerprint_id, resolve_gpu


def test_every_target_has_a_complete_profile():
    assert set(PROFILES) == {"5080", "5090", "pro6000", "4090", "l40s", "h100", "h200"}
    arch = {name: p.arch for name, p in PROFILES.items()}
    assert {arch[n] for n in ("5080", "5090", "pro6000")} == {"sm_120a"}
    assert {arch[n] for n in ("4090", "l40s")} == {"sm_89"}
    assert {arch[n] for n in ("h100", "h200")} == {"sm_90a"}
    for p in PROFILES.values():
        assert p.sm_count > 0 and p.l2_bytes > 0 and p.mem_bandwidth_gbs > 0
        assert p.fp8_full_tflops >= p.fp8_tflops > p.bf16_tflops / 2 > 0
    assert PROFILES["h200"].smem_per_block == 227 * 1024
    assert PROFILES["5080"].smem_per_block == 99 * 1024


def test_unknown_name_lists_known_profiles():
    with pytest.raises(TunerError, match="known profiles: 5080, 5090, pro6000"):
        resolve_gpu("a100", require_local=False)


def test_named_profile_without_local_check():
    assert resolve_gpu("5080", require_local=False) is PROFILES["5080"]
    assert resolve_gpu("RTX5090", require_local=False) is PROFILES["5090"]


@pytest.fixture
def fake_h200(monkeypatch):
    monkeypatch.setattr(gpus, "_cuda_available", lambda: True)
    monkeypatch.setattr(gpus, "_local_device_name", lambda device=0: ("NVIDIA H200", (9, 0)))


def test_auto_returns_the_local_profile(fake_h200):
    assert resolve_gpu("auto") is PROFILES["h200"]


def test_wrong_local_gpu_names_the_found_gpu_and_the_flag(fake_h200):
    with pytest.raises(TunerError) as err:
        resolve_gpu("5080")
    message = str(err.value)
    assert "NVIDIA H200" in message and "gpu='h200'" in message and "RTX 5080" in message


def test_matching_local_gpu_is_accepted(fake_h200):
    assert resolve_gpu("h200") is PROFILES["h200"]


def test_no_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(gpus, "_cuda_available", lambda: False)
    with pytest.raises(TunerError, match="no CUDA GPU found"):
        resolve_gpu("auto")
    with pytest.raises(TunerError, match="gpu='5080' needs that GPU"):
        resolve_gpu("5080")


def test_unknown_local_gpu(monkeypatch):
    monkeypatch.setattr(gpus, "_cuda_available", lambda: True)
    monkeypatch.setattr(gpus, "_local_device_name", lambda device=0: ("NVIDIA A100", (8, 0)))
    with pytest.raises(TunerError, match="no profile for the local GPU 'NVIDIA A100'"):
        resolve_gpu("auto")


def test_fingerprint_id_keys_on_hardware_not_versions():
    base = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "torch": "2.11"}
    assert fingerprint_id(base) == fingerprint_id({**base, "torch": "2.13", "driver": "580"})
    assert fingerprint_id(base) != fingerprint_id({**base, "sm_count": 114})
