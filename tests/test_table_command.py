"""`tuner table GPU`: the shipped table of a GPU row by row, each row's code version marked
current (the family's today, what a search confirms) or older; rows written before the
transforms say they run the default's; a missing table, an unknown GPU and a malformed table
are one clear line."""

from __future__ import annotations

import json

import pytest

from tests.doubles.tables import write_table
from tuner import runtime
from tuner.cli import main
from tuner.problem import Problem
from tuner.search.records import code_version
from variants import wgmma

PROBLEM = Problem(1, 8, 4096, 128)


def _row(problem, **fields):
    cfg = wgmma.default("sm_90a", problem).to_dict()
    return {"problem": problem.to_dict(), "family": "wgmma", "config": cfg, "median_ms": 1.5,
            **fields}


def _table(tmp_path, monkeypatch, entries):
    write_table(tmp_path, entries, gpu="h100", device="NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(runtime, "TABLES_DIR", tmp_path)


def test_each_row_says_whether_todays_code_searched_it(tmp_path, monkeypatch, capsys):
    today = code_version(wgmma)
    old = _row(Problem(1, 8, 8192, 128), code_version="older-source")
    old["config"] = {k: v for k, v in old["config"].items()
                     if k not in ("k_smoothing", "qk_rotation")}
    _table(tmp_path, monkeypatch, [
        _row(PROBLEM, code_version=today, prepare_ms=0.2, e2e_error=0.06, e2e_data="realistic",
             max_error=0.12),
        old])
    assert main(["table", "h100", "--json"]) == 0
    rows = {r["problem"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    new, stale = rows[PROBLEM.key()], rows[Problem(1, 8, 8192, 128).key()]
    assert (new["current"], new["code_version"], new["e2e_error"]) == (True, today, 0.06)
    # The default's at 4096 tokens, as written.
    assert new["transforms"] == "k_smoothing=mean qk_rotation=hadamard"
    assert (stale["current"], stale["code_version"]) == (False, "older-source")
    assert stale["transforms"] == "the default's"
    assert main(["table", "h100"]) == 0
    text = capsys.readouterr().out
    assert "2 rows, 1 searched with today's code" in text
    assert f"{today} (current)" in text and "older-source (older)" in text


def test_a_missing_table_an_unknown_gpu_and_a_bad_table_are_one_line(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setattr(runtime, "TABLES_DIR", tmp_path)
    assert main(["table", "h100"]) == 2
    assert "no tuning table ships for h100" in capsys.readouterr().err
    assert main(["table", "nosuchgpu"]) == 2
    assert "unknown GPU 'nosuchgpu'" in capsys.readouterr().err
    _table(tmp_path, monkeypatch, [_row(PROBLEM)])
    path = tmp_path / "h100.yaml"
    path.write_text(path.read_text().replace("median_ms: 1.5", "median_ms: -1"))
    assert main(["table", "h100"]) == 2
    err = capsys.readouterr().err
    assert "h100.yaml" in err and "median_ms" in err and len(err.strip().splitlines()) == 1


def test_the_shipped_tables_list_without_a_gpu(capsys):
    for gpu in ("h100", "h200"):
        assert main(["table", gpu, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert rows and all(r["family"] in ("wgmma", "mma_sync") for r in rows)


def test_searches_name_the_older_rows_and_parse_back_to_their_problems(tmp_path, monkeypatch,
                                                                       capsys):
    """--searches: one `tuner search` per group of older rows alike but for seq_len; each line
    parses with the CLI's own parser to exactly those rows' problems (and family set), and a
    current row gets no search."""
    import shlex

    from tuner.cli import build_parser
    from tuner.commands._args import problems_from_args

    today = code_version(wgmma)
    cross = Problem(2, 8, 1000, 64, causal=True, seq_len_kv=512, kv_heads=2)
    older = [Problem(1, 8, 8192, 128), Problem(1, 8, 16384, 128), cross]
    entries = [_row(PROBLEM, code_version=today),
               *(_row(p, code_version="older-source") for p in older[:2]),
               {**_row(cross, code_version="older-source"), "family_set": "wgmma+mma_sync"}]
    _table(tmp_path, monkeypatch, entries)
    assert main(["table", "h100", "--searches"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    found, families = [], []
    for line in lines:
        argv = shlex.split(line)
        assert argv[:2] == ["tuner", "search"]
        args = build_parser().parse_args(argv[1:])
        found += problems_from_args(args)
        families.append(args.families)
    assert sorted(p.key() for p in found) == sorted(p.key() for p in older)
    # A row of the family alone names it; one of the arch's whole set leaves the CLI's auto.
    assert families == ["wgmma", "auto"]


def _parsed(lines):
    """The problems of `tuner search` command lines, parsed by the CLI's own parser."""
    import shlex

    from tuner.cli import build_parser
    from tuner.commands._args import problems_from_args

    found = []
    for line in lines:
        argv = shlex.split(line)
        assert argv[:2] == ["tuner", "search"]
        found += problems_from_args(build_parser().parse_args(argv[1:]))
    return sorted(p.key() for p in found)


def test_missing_names_the_coverage_problems_the_table_lacks(tmp_path, monkeypatch, capsys):
    """--missing: the problems of coverage.yaml with no row (current or older), as searches
    that parse back to exactly them; a covered table prints none."""
    (tmp_path / "coverage.yaml").write_text(
        "problems:\n"
        "  - {heads: 8, seq_lens: [4096, 8192, 16384]}\n"
        "  - {heads: 32, seq_lens: [8192], kv_heads: 8, causal: true, head_dim: 64}\n"
        "  - {heads: 40, seq_lens: [75600], kv_len: 512, batch: 2}\n")
    held = [Problem(1, 8, 8192, 128), Problem(2, 40, 75600, seq_len_kv=512)]
    _table(tmp_path, monkeypatch, [_row(p, code_version="older-source") for p in held])
    assert main(["table", "h100", "--missing"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert _parsed(lines) == sorted(p.key() for p in (
        Problem(1, 8, 4096), Problem(1, 8, 16384),
        Problem(1, 32, 8192, 64, causal=True, kv_heads=8)))
    everything = [Problem(1, 8, s) for s in (4096, 8192, 16384)] + [
        Problem(1, 32, 8192, 64, causal=True, kv_heads=8),
        Problem(2, 40, 75600, seq_len_kv=512)]
    _table(tmp_path, monkeypatch, [_row(p) for p in everything])
    assert main(["table", "h100", "--missing"]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("text, says", [
    ("problems:\n  - {heads: 8, seq_len: [4096]}\n", "entry 1 has keys ['heads', 'seq_len']"),
    ("problems:\n  - {heads: 0, seq_lens: [4096]}\n", "heads"),
    ("nothing: here\n", "problems"),
])
def test_a_malformed_coverage_file_is_one_line_naming_it(tmp_path, monkeypatch, capsys, text,
                                                          says):
    _table(tmp_path, monkeypatch, [_row(PROBLEM)])
    (tmp_path / "coverage.yaml").write_text(text)
    assert main(["table", "h100", "--missing"]) == 2
    err = capsys.readouterr().err
    assert "coverage.yaml" in err and says in err and len(err.strip().splitlines()) == 1


def test_the_shipped_coverage_is_what_the_kernels_implement():
    """Every problem the tables should hold parses and has a feasible wgmma default on sm_90a."""
    from tuner.commands.table import coverage
    from tuner.gpus import PROFILES

    problems = coverage()
    assert len(problems) == len({p.key() for p in problems}) > 20
    for p in problems:
        assert wgmma.can_implement(wgmma.default("sm_90a", p), p, PROFILES["h100"]) == \
            (True, None), p.key()
