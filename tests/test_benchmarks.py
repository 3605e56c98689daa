"""The benchmark package's pure parts on the CPU: the --shapes syntax, the tables (TFLOP/s and
ratios included), the results pages (a run replaces its section, never appends, and leaves the
rest of the page as it was), the stamp's commit, and the helpers each suite's numbers rest on."""

import dataclasses
import datetime as dt
import subprocess
from dataclasses import dataclass

import pytest

from benchmarks import SUITES, common, results
from benchmarks.__main__ import build_parser, main
from tuner.errors import TunerError
from tuner.problem import Problem
from variants.base import ConfigMixin

# ---- shapes ------------------------------------------------------------------------------

COMMIT = "abc1234"  # history-ok: a commit id as test data


def test_a_shape_lists_lengths_and_optional_fields():
    assert common.parse_shape("1,4096/8192,56,128") == [Problem(1, 56, 4096), Problem(1, 56, 8192)]
    (gqa,) = common.parse_shape("1,8192,32,128,causal,kvh=8")
    assert (gqa.causal, gqa.heads, gqa.kv_heads, gqa.seq_len_kv) == (True, 32, 8, 8192)
    (cross,) = common.parse_shape(" 1, 75600, 40, 64, skv=512 ")
    assert (cross.seq_len, cross.seq_len_kv, cross.head_dim, cross.causal) == (75600, 512, 64,
                                                                                False)


def test_every_default_shape_reads_back_as_the_text_tables_show():
    for text in common.MODEL_SHAPES:
        for problem in common.parse_shape(text):
            assert common.parse_shape(common.shape_text(problem)) == [problem]
    assert common.shape_text(Problem(1, 32, 8192, 128, True, 512, 8)) == \
        "1,8192,32,128,causal,kvh=8,skv=512"


@pytest.mark.parametrize(("text", "says"), [
    ("1,4096,56", "expected B,S,H,D"),
    ("1,4096,56,128,sliding", "unknown field 'sliding'"),
    ("1,4096,56,128,kvh=", "unknown field 'kvh='"),
    ("1,4k,56,128", "S in shape"),
    ("1,4096,56,96", "head_dim 96 is not supported"),
    ("1,4096,56,128,kvh=5", "does not divide heads=56"),
])
def test_a_bad_shape_is_named(text, says):
    with pytest.raises(TunerError, match=says):
        common.parse_shape(text)


def test_a_bad_shape_on_the_command_line_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["kernel", "--shapes", "1,4096,56,96"])
    assert stop.value.code == 2
    assert "head_dim 96 is not supported" in capsys.readouterr().err


def test_shapes_come_from_the_option_else_quick_else_the_defaults():
    parse = build_parser().parse_args
    assert common.shapes_of(parse(["quant", "--shapes", "1,1024/2048,8,64"])) == [
        Problem(1, 8, 1024, 64), Problem(1, 8, 2048, 64)]
    quick = common.shapes_of(parse(["quant", "--quick"]))
    assert [common.shape_text(p) for p in quick] == list(common.QUICK_SHAPES)
    full = common.shapes_of(parse(["quant"]))
    assert len(full) == 10 and Problem(1, 40, 75600, seq_len_kv=512) in full


def test_every_suite_has_a_help_that_runs_without_a_gpu(capsys):
    for suite in SUITES:
        with pytest.raises(SystemExit) as stop:
            build_parser().parse_args([suite, "--help"])
        assert stop.value.code == 0
        assert "--shapes" in capsys.readouterr().out


def test_without_a_gpu_a_suite_says_so_and_writes_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["quant", "--quick", "--results", str(tmp_path)]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_unset_options_take_the_quick_value_only_with_quick():
    parse = build_parser().parse_args
    assert common.sized(None, 240, 48, parse(["gate"])) == 240
    assert common.sized(None, 240, 48, parse(["gate", "--quick"])) == 48
    assert common.sized(7, 240, 48, parse(["gate", "--quick"])) == 7


# ---- tables --------------------------------------------------------------------------------


def test_tables_mark_missing_values_and_refuse_ragged_rows():
    table = common.markdown_table(["a", "b"], [[1.23456, None], ["x", 2.0]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1.235 | - |", "| x | 2.000 |"]
    with pytest.raises(ValueError, match="2 cells"):
        common.markdown_table(["a", "b"], [[1.0]])
    assert common.ratio(1.1, 1.0) == "1.10x" and common.ratio(None, 1.0) == "-"


def _e2e_result(problem, ours_ms, peers):
    return {"problem": problem, "source": "default", "kernel_ms": 0.4, "prepare_ms": 0.05,
            "ms": {"ours e2e": ours_ms, **peers}, "notes": [], "host": {
                "ours e2e": {"gpu_us": ours_ms * 1e3, "host_us": 120.0,
                             "wall_minus_gpu_us": 3.0, "sync_minus_gpu_us": 30.0}}}


def test_e2e_rows_give_tflops_of_the_visible_region_and_the_faster_peer():
    from benchmarks.e2e import format_tables

    full, causal = Problem(1, 56, 4096), Problem(1, 56, 4096, causal=True)
    text = format_tables([_e2e_result(full, 0.5, {"FA3 bf16": 0.6, "SDPA bf16": 0.7}),
                          _e2e_result(causal, 0.5, {"SDPA bf16": 0.55})],
                         {"sync_us": 8.0, "event_pair_us": 3.0})
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| 1,4096")]
    # 4 * 56 * 128 * 4096^2 FLOPs in 0.5 ms = 962 TFLOP/s; causal counts half the square.
    assert rows[0][3] == "962" and rows[1][3] == "481"
    assert rows[0][-1] == "1.20x |" and rows[1][-1] == "1.10x |"
    assert rows[0][7:10] == ["0.600", "0.700", "-"]
    assert rows[0][6] == "0.450"  # kernel + prepare


def test_kernel_rows_set_ours_against_the_faster_peer_of_the_same_run():
    from benchmarks.kernel import _against, format_table
    from tuner.bench import BenchRow

    causal = Problem(1, 56, 8192, causal=True)
    rows = [BenchRow(8192, "tuned", "wgmma: ...", median_ms=1.0, iqr_ms=0.01, prepare_ms=0.15,
                     tflops=causal.tflops(1.0), rel_rms=0.021),
            BenchRow(8192, "default", "wgmma default", median_ms=0.9),
            BenchRow(8192, "head-scales", "wgmma: ... kv_scales=head", median_ms=0.95),
            BenchRow(8192, "fa3-fp8", "fp8", median_ms=1.08),
            BenchRow(8192, "cudnn-fp8", "fp8", median_ms=1.05)]
    skipped = [BenchRow(1024, "tuned", "wgmma: ...", median_ms=0.1, prepare_ms=0.03),
               BenchRow(1024, "fa3-fp8", "fp8", note="skipped: not installed")]
    table = format_table([(causal, "default", rows), (Problem(4, 32, 1024), "table", skipped)])
    header, _, first, second = table.splitlines()
    assert header.split(" | ")[7:11] == ["default ms", "head-scales ms", "fa3-fp8 ms",
                                         "cudnn-fp8 ms"]
    cells = first.split(" | ")
    # causal 1,8192,56,128 in 1 ms: 4 * 56 * 128 * (8192^2 / 2) FLOPs = 962 TFLOP/s
    assert cells[4] == "962" and cells[6] == "1.150"
    # the faster peer (cuDNN) over ours, not the default nor our per-head-scale kernel
    assert cells[-2] == "1.05x" and cells[8] == "0.950"
    assert second.split(" | ")[7:12] == ["-", "-", "-", "-", "-"]
    with pytest.raises(TunerError, match="unknown fa4"):
        _against("fa3-fp8,fa4")


# ---- the suites' arithmetic -----------------------------------------------------------------


def test_the_quantization_floor_counts_one_read_one_write_and_the_scales():
    from benchmarks.quant import floor_bytes

    p = Problem(1, 2, 100, 64, seq_len_kv=100, kv_heads=1)
    # q: read 2*1*100*2*64, codes 1*128*2*64, scales 4*2*128; k and v each: read 2*100*64,
    # codes 128*64, scales 4*ceil(128/64).
    q = 25600 + 16384 + 1024
    kv = 2 * (12800 + 8192 + 8)
    assert floor_bytes(p, 128, 128) == q + kv
    assert floor_bytes(p, 128, 128, q_in_kernel=True) == kv


def test_the_quant_suite_times_each_transform_setting_only_when_asked():
    from benchmarks.quant import settings
    from variants import mma_sync, wgmma

    small = Problem(4, 32, 1024)  # wgmma's default quantizes Q in the kernel here
    cfg = wgmma.default("sm_90a", small)
    assert cfg.q_in_kernel and build_parser().parse_args(["quant"]).transforms is False
    assert settings(cfg, False) == [("as run", cfg)]
    rows = dict(settings(cfg, True))
    assert list(rows) == ["as run", "plain", "smoothed", "rotated", "both"]
    knobs = {k: (c.k_smoothing, c.qk_rotation, c.q_in_kernel) for k, c in rows.items()}
    assert knobs["plain"] == ("off", "none", True)
    assert knobs["smoothed"] == ("mean", "none", True)
    # The rotation needs Q quantized in prepare: its rows say so, as the runtime would run them.
    assert knobs["rotated"] == ("off", "hadamard", False)
    assert knobs["both"] == ("mean", "hadamard", False)
    sm120 = dict(settings(mma_sync.default("sm_120a", small), True))
    assert (sm120["both"].k_smoothing, sm120["both"].qk_rotation) == ("mean", "hadamard")


def test_the_sweep_spreads_its_sample_over_the_whole_space():
    from benchmarks.gate import spread

    items = list(range(10))
    assert spread(items, 3) == [0, 3, 6]
    assert spread(items, 0) == items and spread(items, 12) == items
    assert spread(list(range(8424)), 240)[-1] > 8300


def test_the_sweep_counts_every_run_and_names_each_failure_with_its_seed():
    from argparse import Namespace

    from benchmarks.gate import sweep
    from tests.doubles import planted_fake
    from tuner.gpus import PROFILES
    from variants.base import judge_space

    # The planted-bug family on the CPU: only the config without a bug is correct.
    problem = Problem(1, 2, 64, 64)
    gpu = common.Gpu(PROFILES["h200"], "a CPU stand-in")
    bugs = [c.bug for c, ok, _ in judge_space(planted_fake, problem, gpu.profile) if ok]
    args = Namespace(sweep_shapes=[[problem]], families="tests.doubles.planted_fake",
                     sweep_configs=0, quick=False, shard=(0, 1), procs=1, seed=5)
    text = sweep(args, gpu)
    assert f"| 1,64,2,64: {len(bugs)} of {len(bugs)} | 1 of {len(bugs)} |" in text
    failures = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(failures) == len(bugs) - 1
    for bug in bugs:
        named = [line for line in failures if f"'bug': '{bug}'" in line]
        assert len(named) == (bug != "none") and all(" seed " in line for line in named)
    args.shard = (1, 2)
    half = sweep(args, gpu)
    assert f"1,64,2,64: {len(bugs) // 2} of {len(bugs)}" in half


def test_a_search_command_per_group_of_lengths():
    from benchmarks.search import groups, search_command

    problems = [p for t in ("1,4096/8192,56,128", "1,8192,32,128,causal,kvh=8",
                            "1,2048,56,128", "1,75600,40,128,skv=512", "1,4096,56,128,causal")
                for p in common.parse_shape(t)]
    found = groups(problems)
    assert [[p.seq_len for p in g] for g in found] == [[4096, 8192, 2048], [8192], [75600],
                                                       [4096]]
    assert found[3][0].causal and not found[0][0].causal
    cmd = search_command(found[0], 8, "sqlite:///x", "auto", 0)
    assert cmd[cmd.index("--seq-lens") + 1] == "4096,8192,2048"
    assert "--causal" not in cmd and "--kv-len" not in cmd
    gqa = search_command(found[1], 8, "sqlite:///x", "wgmma", 0)
    assert "--causal" in gqa and gqa[gqa.index("--kv-heads") + 1] == "8"
    cross = search_command(found[2], 8, "sqlite:///x", "wgmma", 0)
    assert cross[cross.index("--kv-len") + 1] == "512"


def test_the_search_suite_runs_tuner_search_cold_then_warm_and_reads_back_its_trials():
    from argparse import Namespace

    from benchmarks.search import run
    from tuner.gpus import PROFILES

    # A CPU family (tuner search takes the profile by name for it): the suite's whole path,
    # the two `tuner search` processes and the stored trials read back, without a GPU.
    # The doubles' error is FP8's on the realistic data, over the default budget: lift it.
    args = Namespace(shapes=[[Problem(1, 2, 77, 64)]], quick=False, trials=2, seed=0,
                     families="tests.doubles.planted_fake", timeout=300.0, max_error=10.0)
    text = run(args, common.Gpu(PROFILES["h200"], "a CPU stand-in"))
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| 1,77,2,64")]
    assert [r[1] for r in rows] == ["cold", "warm"]
    for row in rows:
        ok, stored = (int(x) for x in row[3].split(" of "))
        assert stored >= 2 and 1 <= ok <= stored  # the planted bugs fail the gate, "none" not
        assert float(row[5]) > 0  # validate seconds summed from the stored trials
    assert "Failed" not in text


def test_the_search_stage_sums_leave_out_bench_rows():
    from benchmarks.search import stage_sums
    from tuner.store import TrialRecord

    def trial(outcome, role, compile_s, timing):
        return TrialRecord(id=None, device_id="d", problem_key="p", family_set="f",
                           family="wgmma", config={}, config_hash="h", outcome=outcome,
                           role=role, compile_s=compile_s, timing=timing)

    sums = stage_sums([trial("ok", "default", 2.0, {"validate_s": 0.5, "accuracy_s": 0.125,
                                                    "time_s": 0.25}),
                       trial("infeasible", "search", None, None),
                       trial("ok", "search", 3.0, {"validate_s": 0.5, "time_s": 0.5}),
                       trial("ok", "bench", 9.0, {"validate_s": 9.0, "time_s": 9.0})])
    assert sums == {"trials": 3, "ok": 2, "compile_s": 5.0, "validate_s": 1.0,
                    "accuracy_s": 0.125, "time_s": 0.75}


def test_host_loops_stay_between_5_and_50_calls():
    from benchmarks.e2e import loop_calls

    assert loop_calls(0.1, 250) == 50
    assert loop_calls(10.0, 250) == 25
    assert loop_calls(130.0, 250) == 5


@dataclass(frozen=True)
class _WithKnobs(ConfigMixin):
    tile: int = 128
    k_smoothing: str = "mean"
    qk_rotation: str = "hadamard"


@dataclass(frozen=True)
class _WithPvOnly(_WithKnobs):
    pv_dtype: str = "e4m3"


@dataclass(frozen=True)
class _WithoutKnobs:
    tile: int = 128


def test_accuracy_columns_set_the_transforms_and_name_a_config_without_them():
    from benchmarks.accuracy import parse_case, with_setting

    plain = with_setting(_WithKnobs(), "plain")
    assert (plain.tile, plain.k_smoothing, plain.qk_rotation) == (128, "off", "none")
    assert with_setting(_WithKnobs(), "rotated").qk_rotation == "hadamard"
    assert with_setting(_WithKnobs(), "rotated").k_smoothing == "off"
    assert "no k_smoothing / qk_rotation" in with_setting(_WithoutKnobs(), "both")
    kind, problems = parse_case("k_bias_8@1,4096,32,128,kvh=8")
    assert kind == "k_bias_8" and problems[0].kv_heads == 8
    with pytest.raises(TunerError, match="unknown activation kind"):
        parse_case("k_bias_9@1,4096,8,128")
    with pytest.raises(TunerError, match="KIND@SHAPE"):
        parse_case("1,4096,8,128")


def test_the_bf16_pv_column_sets_both_transforms_and_pv_dtype_where_the_family_has_it():
    from benchmarks.accuracy import with_pv16
    from variants import wgmma

    cfg = with_pv16(dataclasses.replace(wgmma.default("sm_90a"), q_quant="prepare"))
    assert (cfg.k_smoothing, cfg.qk_rotation, cfg.pv_dtype) == ("mean", "hadamard", "bf16")
    assert "no pv_dtype" in with_pv16(_WithKnobs())
    assert "no k_smoothing" in with_pv16(_WithoutKnobs())


def test_the_int8_qk_column_adds_qk_dtype_and_q_in_prepare_to_the_bf16_pv_config():
    from benchmarks.accuracy import with_qk8
    from variants import wgmma

    cfg = with_qk8(wgmma.default("sm_90a"))
    assert (cfg.k_smoothing, cfg.qk_rotation, cfg.pv_dtype, cfg.qk_dtype, cfg.q_quant) == (
        "mean", "hadamard", "bf16", "int8", "prepare")
    assert "no qk_dtype" in with_qk8(_WithPvOnly())
    assert "no k_smoothing" in with_qk8(_WithoutKnobs())


def test_e2e_has_columns_for_the_rungs_and_the_drop_in_beside_the_peers():
    from benchmarks.e2e import DROPIN, PV16, QK8, format_tables

    result = _e2e_result(Problem(1, 56, 4096), 0.5,
                         {"SDPA bf16": 0.7, PV16: 0.65, QK8: 0.6, DROPIN: 0.55})
    header, _, row = format_tables([result], {"sync_us": 8.0, "event_pair_us": 3.0}
                                   ).splitlines()[:3]
    cells = row.split(" | ")
    assert cells[header.split(" | ").index(f"{PV16} ms")] == "0.650"
    assert cells[header.split(" | ").index(f"{QK8} ms")] == "0.600"
    assert cells[header.split(" | ").index(f"{DROPIN} ms")] == "0.550"
    assert cells[-1] == "1.40x |"  # the peers against tuner.attention, not the drop-in


def test_the_drop_in_column_runs_where_sdpa_masks_like_tuner_attention():
    from benchmarks.e2e import _ours_dropin
    from benchmarks.systems import bf16_peers

    cross = Problem(1, 8, 1024, 128, seq_len_kv=512, causal=True)
    assert "top left" in _ours_dropin(cross)
    assert bf16_peers(cross, ("SDPA bf16",))["SDPA bf16"] == _ours_dropin(cross)  # one reason
    for problem in (Problem(1, 8, 1024, 128, seq_len_kv=512), Problem(1, 8, 1024, causal=True)):
        assert callable(_ours_dropin(problem))


# ---- results pages ---------------------------------------------------------------------------


def _section(name, body):
    return results.render_section(name, f"stamp of {name}", body)


def test_a_first_run_creates_the_page_with_its_title_and_section(tmp_path):
    path = tmp_path / "results" / "h100.md"
    results.write_section(path, "quant", _section("quant", "| q |"), SUITES, "# Title\n")
    page = path.read_text()
    assert page.startswith("# Title\n")
    assert page.count("<!-- begin quant -->") == 1 and "| q |" in page


def test_a_run_replaces_its_section_and_leaves_the_others_as_they_were(tmp_path):
    path = tmp_path / "h100.md"
    for name, body in (("search", "search table"), ("kernel", "kernel v1")):
        results.write_section(path, name, _section(name, body), SUITES, "# Title\n")
    path.write_text(path.read_text() + "\nA note added by hand.\n")
    before = path.read_text()
    search_part = before[before.index("<!-- begin search -->"):
                         before.index("<!-- end search -->")]
    results.write_section(path, "kernel", _section("kernel", "kernel v2"), SUITES, "# Title\n")
    results.write_section(path, "e2e", _section("e2e", "e2e table"), SUITES, "# Title\n")
    page = path.read_text()
    assert "kernel v1" not in page and page.count("kernel v2") == 1
    assert page.count("<!-- begin kernel -->") == 1
    assert search_part in page and "A note added by hand." in page
    # Suites' order: kernel, e2e, ..., search.
    assert page.index("begin kernel") < page.index("begin e2e") < page.index("begin search")


def test_a_page_with_broken_markers_is_left_untouched(tmp_path):
    path = tmp_path / "h100.md"
    path.write_text("# Title\n<!-- begin kernel -->\n## kernel\nold\n")
    with pytest.raises(TunerError, match="markers of section 'kernel' are broken"):
        results.write_section(path, "kernel", _section("kernel", "new"), SUITES, "# Title\n")
    assert path.read_text() == "# Title\n<!-- begin kernel -->\n## kernel\nold\n"


def test_the_stamp_names_device_date_commit_and_command():
    line = results.stamp("NVIDIA H100 80GB HBM3", "python -m benchmarks kernel --quick",
                         commit=f"{COMMIT}+dirty", date=dt.date(2026, 12, 6),
                         software="torch 2.11")
    assert line == (f"Measured on NVIDIA H100 80GB HBM3, 2026-12-06, commit {COMMIT}+dirty, "
                    "torch 2.11: `python -m benchmarks kernel --quick`")
    assert results.command_line(["e2e", "--shapes", "1,4096,56,128"]) == \
        "python -m benchmarks e2e --shapes 1,4096,56,128"


def test_the_commit_is_dirty_for_changes_outside_the_results_pages(tmp_path, monkeypatch):
    monkeypatch.delenv("BENCHMARKS_COMMIT", raising=False)
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path,
                          capture_output=True, text=True).stdout.strip()
    assert results.commit_id(tmp_path) == head
    (tmp_path / "benchmarks" / "results" / "h100.md").write_text("page\n")
    assert results.commit_id(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert results.commit_id(tmp_path) == head + "+dirty"
    assert results.commit_id(tmp_path / "benchmarks" / "results" / "missing") == "unknown"
    # A tree copied without .git (a lent GPU machine) is told its commit.
    monkeypatch.setenv("BENCHMARKS_COMMIT", COMMIT)
    assert results.commit_id(tmp_path / "benchmarks" / "results" / "missing") == COMMIT


# ---- timing settings side by side ---------------------------------------------------------------

def test_interleaved_timing_takes_the_settings_in_turn_and_gives_each_its_own_median(
        monkeypatch):
    """common.time_interleaved: the timed sequence alternates the settings call by call with
    the input sets rotating, and each setting's median is over its own calls only (a setting
    whose calls the fake GPU makes slower comes out slower by that much)."""
    import torch

    from tuner import measure

    ran = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def samples(fn, repeats, host_ms, device, sync):
        start = len(ran)
        for c in range(repeats):
            fn(c)
        # a drifting clock (each call 1% slower than the one before) times every call
        return [(1.0 + 0.01 * c) * (2.0 if ran[start + c][0] == "slow" else 1.0)
                for c in range(repeats)]

    monkeypatch.setattr(measure, "queued_event_samples", samples)
    calls = [lambda i, s=s: ran.append((s, i)) for s in ("plain", "slow", "other")]
    medians = common.time_interleaved(calls, n_sets=2, repeats=5)
    timed = ran[-15:]
    assert [s for s, _ in timed] == ["plain", "slow", "other"] * 5
    assert [i for _, i in timed] == [c % 2 for c in range(15)]
    # each setting's five calls: plain 0, 3, ..., 12; slow 1, 4, ...; other 2, 5, ...
    assert medians == pytest.approx([1.06, 2 * 1.07, 1.08])
