"""Output that is not a terminal: a reader that goes away (`tuner ... | head`) ends every command
quietly with exit 141 whether rich or print was writing, and a log file gets whole table rows."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doubles import ANY_ACCURACY
from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "db" / "tables" / "h200.yaml"
FAKE_SEARCH = ["search", "--gpu", "h200", "--seq-lens", "64", "--heads", "2", "--head-dim", "64",
               "--families", "tests.doubles.fake_family", "--trials", "2", "--repeats", "10",
               "--timeout", "5", "--compile-jobs", "1", "--seed", "1", *ANY_ACCURACY]


@pytest.fixture(scope="module")
def shipped_db(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('pipes') / 'shipped.sqlite'}"
    assert main(["import", str(SHIPPED), "--force", "--db", url]) == 0
    return url


def _into_a_closed_pipe(args: list[str]) -> tuple[int, str]:
    """`tuner ARGS` whose stdout reader is gone before the first write (the child is still
    importing when the pipe closes): its exit code and stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-m", "tuner", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, cwd=REPO)
    child.stdout.close()
    err = child.stderr.read().decode()
    return child.wait(timeout=300), err


# bench is left out: without a GPU it stops with an error before it writes to stdout.
@pytest.mark.parametrize("args", [
    ["gpus"],                                         # a rich table
    ["space", "--gpu", "5080", "--family", "mma_sync"],  # a rich table
    ["show", "--db", "{db}"],                         # a rich table
    ["show", "--db", "{db}", "--json"],               # print
    ["export", "--gpu", "h200", "--db", "{db}"],      # sys.stdout.write
    ["import", str(SHIPPED), "--force", "--db", "{new}"],  # print, one line
    [*FAKE_SEARCH, "--db", "{new}"],                  # a rich table after the search
], ids=["gpus", "space", "show", "show-json", "export", "import", "search"])
def test_a_reader_that_goes_away_ends_the_command_quietly_with_141(args, shipped_db, tmp_path):
    args = [a.replace("{db}", shipped_db).replace("{new}", f"sqlite:///{tmp_path / 'n.sqlite'}")
            for a in args]
    code, err = _into_a_closed_pipe(args)
    # The search's progress lines go to stderr, which is still read: only they may appear.
    assert code == 141 and not [line for line in err.splitlines()
                                if not re.match(r"^(\[\d\d:\d\d:\d\d\]| |s=64 )", line)], err


def test_the_search_table_keeps_whole_rows_in_a_log(tmp_path, capsys):
    # capsys's stdout is no terminal, as a log file is: rich would wrap at 80 columns.
    assert main([*FAKE_SEARCH, "--db", f"sqlite:///{tmp_path / 'log.sqlite'}"]) == 0
    table = capsys.readouterr().out.splitlines()
    header = next(line for line in table if "seq_len" in line)
    assert all(col in header for col in ("winner", "kernel ms", "prepare ms", "vs default"))
    rows = [line for line in table if line.startswith("│")]
    # One line per searched length: a wrapped row would add lines with an empty seq_len cell.
    assert len(rows) == 1 and re.match(r"│ +64 │ fake_family: ", rows[0]), table
