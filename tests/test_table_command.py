"""`tuner table GPU`: the shipped table of a GPU row by row, each row's code version marked
current (the family's today, what a search confirms) or older; rows written before the
transforms say they run the default's; a missing table, an unknown GPU and a malformed table
are one clear line."""

from __future__ import annotations

import json

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
