"""The edges a user hits first: bad search arguments on a machine without a GPU,
help text, `tuner space` output in a 100-column terminal and its progress, `show --plot`."""

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from tuner.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "db" / "tables" / "h200.yaml"


@pytest.mark.parametrize("args, named, message", [
    (["--seq-lens", "0"], "--seq-lens", "must be >= 1, got 0"),
    (["--seq-lens", "4096,x"], "--seq-lens", "expected an integer, got 'x'"),
    (["--seq-lens", str(2**40)], "--seq-lens", "must be <= 1073741824"),
    (["--heads", "-1"], "--heads", "must be >= 1, got -1"),
    (["--head-dim", "100"], "--head-dim", "head_dim 100 is not supported"),
    (["--time-budget", "xyz"], "--time-budget", "bad duration 'xyz'"),
    (["--time-budget=-5m"], "--time-budget", "must be a positive duration, got '-5m'"),
    (["--time-budget", "0"], "--time-budget", "must be a positive duration"),
    (["--repeats", "5"], "--repeats", "must be >= 10, got 5"),
    (["--trials", "0"], "--trials", "must be >= 1, got 0"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_search_arguments_are_named_before_looking_for_a_gpu(args, named, message, capsys):
    base = {"--seq-lens": "4096", "--heads": "8"}
    for a in args:
        base.pop(a.split("=")[0], None)
    argv = ["search", *[x for kv in base.items() for x in kv], *args]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert f"argument {named}" in err and message in err and "GPU" not in err, err


# Every list-valued option: (command, option, a malformed value, what the one line says).
BAD_LISTS = [
    (command, "--seq-lens", value, said) for command in ("search", "bench") for value, said in [
        ("4096,,8192", "empty item in '4096,,8192' (item 2)"),
        ("4096,", "empty item in '4096,' (item 2)"),
        (",4096", "empty item in ',4096' (item 1)"),
        (",", "expected at least one value"),
        ("40 96", "expected an integer, got '40 96'"),
        ("4096,8192,4096", "4096 given more than once"),
        ("4096,1.5", "expected an integer, got '1.5'"),
    ]
] + [
    ("search", "--families", "mma_sync,,wgmma", "empty item in 'mma_sync,,wgmma' (item 2)"),
    ("search", "--families", "wgmma,wgmma", "wgmma given more than once"),
    ("bench", "--against", "default,", "empty item in 'default,' (item 2)"),
    ("bench", "--against", "sdpa,default,sdpa", "sdpa given more than once"),
]


@pytest.mark.parametrize("command, option, value, said", BAD_LISTS,
                         ids=[f"{c} {o} {v!r}" for c, o, v, _ in BAD_LISTS])
def test_a_malformed_list_is_a_usage_error_naming_the_option(command, option, value, said,
                                                              capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--seq-lens", "4096", "--heads", "8", f"{option}={value}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert f"argument {option}: " in err and said in err, err
    if "empty" in said:  # the fix: how a good list looks
        assert re.search(r"e\.g\. \w+,\w+", err), err


def test_blanks_around_list_items_are_allowed():
    args = build_parser().parse_args(["search", "--seq-lens", " 4096, 8192 ", "--heads", "8",
                                      "--families", "mma_sync, wgmma"])
    assert args.seq_lens == [4096, 8192] and args.families == "mma_sync,wgmma"


@pytest.mark.parametrize("command", ["search", "bench"])
@pytest.mark.parametrize("option", ["--heads", "--batch", "--head-dim", "--repeats"])
def test_problem_options_have_help_and_a_shown_default(command, option):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    action = next(a for a in sub._actions if option in a.option_strings)
    assert action.help, f"{command} {option} has no help"
    assert "required" in action.help if action.required else \
        re.search(rf"default {action.default}\b", action.help), action.help


def _space_text(monkeypatch, capsys, *args) -> str:
    from tuner.commands import space

    buffer = io.StringIO()
    monkeypatch.setattr(space, "wide_console",
                        lambda: Console(width=100, file=buffer, color_system=None))
    main(["space", "--gpu", "5080", "--family", "mma_sync", *args])
    capsys.readouterr()
    return buffer.getvalue()


def test_space_in_100_columns_shows_whole_configs_and_counts_rejections(monkeypatch, capsys):
    from tuner.gpus import PROFILES
    from tuner.problem import Problem
    from tuner.space import enumerate_rows

    text = _space_text(monkeypatch, capsys)
    rows = enumerate_rows(PROFILES["5080"], "mma_sync", Problem(1, 56, 4096))
    feasible = [r for r in rows if r.feasible]
    assert "…" not in text
    words = set(text.split())
    assert {f"{k}={v}" for r in feasible for k, v in r.config.items()} <= words
    # Rejected configs are counted per reason with real numbers, not listed one by one.
    assert "rejected" not in {w for line in text.splitlines() if "│" in line for w in line.split()}
    assert len(text.splitlines()) < 3 * len(feasible) + 20
    assert re.search(r"\n +\d+ +shared memory \d+\.\.\d+ B per CTA > 101376 B per block on "
                     r"5080\n", text), text[-600:]
    assert not re.search(r"\bN\b", text)
    listed = _space_text(monkeypatch, capsys, "--rejected")
    assert listed.count(" rejected ") >= len(rows) - len(feasible)


def test_space_summary_json_keeps_the_numbers(capsys):
    import json

    main(["space", "--gpu", "5080", "--family", "mma_sync", "--json"])
    reasons = json.loads(capsys.readouterr().out)["summary"]["rejected_by_reason"]
    assert reasons and all(re.search(r"\d", r) and not re.search(r"\bN\b", r) for r in reasons)


def test_space_compile_shows_progress(monkeypatch, capsys):
    from tuner.commands import space

    def fake_compile(rows, gpu, problem, jobs, progress=None):
        for row in rows:
            row.registers, row.spill_bytes, row.smem_bytes, row.compile_s = 128, 0, 1024, 0.1
            progress()

    monkeypatch.setattr(space, "compile_rows", fake_compile)
    assert main(["space", "--gpu", "5080", "--family", "mma_sync", "--compile", "--limit", "3",
                 "--json"]) == 0
    err = capsys.readouterr().err
    assert "compiling" in err and "3/3" in err


@pytest.mark.parametrize("compile_", [False, True], ids=["listed", "compiled"])
def test_space_limit_lists_and_compiles_only_the_first_configs(compile_, monkeypatch, capsys):
    from tuner.commands import space

    built = []
    monkeypatch.setattr(space, "compile_rows", lambda rows, *a, **k: built.extend(rows))
    args = ["space", "--gpu", "5080", "--family", "mma_sync", "--limit", "3"]
    assert main([*args, *(["--compile"] if compile_ else []), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    listed = [c for c in doc["configs"] if c["status"] != "rejected"]
    assert len(listed) == 3 and len(built) == (3 if compile_ else 0)
    # The counts still cover the whole space.
    assert doc["summary"]["feasible"] > 3 and doc["summary"]["listed"] == 3
    text = _space_text(monkeypatch, capsys, "--limit", "3", *(["--compile"] if compile_ else []))
    assert len([line for line in text.splitlines() if line.startswith("│ mma_sync")]) == 3
    assert "the first 3 listed (--limit)" in text


def test_show_plot_draws_a_series_per_head_dim(tmp_path, monkeypatch, capsys):
    from tuner import report

    url = f"sqlite:///{tmp_path / 'p.sqlite'}"
    assert main(["import", str(SHIPPED), "--db", url, "--force"]) == 0
    drawn = {}
    monkeypatch.setattr(report, "_plot_tflops",
                        lambda series, path, title: drawn.update(series) or Path(path))
    assert main(["show", "--db", url, "--plot", str(tmp_path / "x.png")]) == 0
    tuned = {label: sorted(s for s, _ in points) for label, points in drawn.items()
             if label.startswith("tuned")}
    # One series per batch, head count, KV side, head_dim and mask of the shipped table.
    import yaml

    problems = [e["problem"] for e in yaml.safe_load(SHIPPED.read_text())["entries"]]
    groups = {(p["batch"], p["heads"], p.get("kv_heads", p["heads"]),
               p.get("seq_len_kv", p["seq_len"]) != p["seq_len"], p["head_dim"], p["causal"])
              for p in problems}
    assert len(tuned) == len(groups) > 2
    assert {"tuned (NVIDIA H200 B=1 H=56 D=64)", "tuned (NVIDIA H200 B=1 H=56 D=128)",
            "tuned (NVIDIA H200 B=1 H=32 Hkv=8 D=128 causal)"} <= set(tuned)
    for seq_lens in tuned.values():
        assert len(seq_lens) == len(set(seq_lens))  # one point per seq_len in a line
