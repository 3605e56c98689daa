"""What every command promises at its edges: malformed tables change nothing and fail in one line,
database passwords never show, errors are one line without a traceback, --json keys are pinned."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.cli import main
from tuner.dburl import display_url

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "db" / "tables" / "h200.yaml"  # a real exported table: the seed of the mutations
SECRET = "s3cr3t-Pw"


def run(args: list[str]) -> tuple[int, str, str]:
    """`tuner ARGS` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def one_line(err: str) -> bool:
    return err.endswith("\n") and len(err.splitlines()) == 1 and "Traceback" not in err


# ---- malformed tables ---------------------------------------------------------------------------

VALID = yaml.safe_load(SHIPPED.read_text())
TOP_REQUIRED = ("kind", "schema_version", "gpu", "device", "entries")
ENTRY_REQUIRED = ("problem", "family", "config", "median_ms")
PROBLEM_REQUIRED = ("batch", "heads", "seq_len")
OPTIONAL = ("iqr_ms", "tflops", "speedup_over_default", "default_median_ms", "rel_rms", "trials",
            "decided_at")
# Values no field of a table takes: every field they replace makes the table invalid. (None is
# valid for the optional fields, so it only replaces required ones.)
ALIEN = st.one_of(
    # Not empty: `entries: []` is a valid (empty) table, so an empty list is no alien value.
    st.lists(st.integers(), min_size=1, max_size=2),
    st.dictionaries(st.text("xyz", min_size=1, max_size=3), st.integers(), max_size=2),
    st.dates(),
    st.just(float("nan")),
)
ALIEN_OR_NULL = st.one_of(ALIEN, st.none())
BAD_YAML_LINES = ["[unclosed", "{unclosed: 1", "'unterminated", "a: b: c", "\tindented: 1",
                  "!!python/object/apply:os.system ['echo pwned']", "*undefined_alias",
                  "- x: &a [1]\n- y: *a"]


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


@st.composite
def broken_tables(draw) -> tuple[str | bytes, bool]:
    """(file content, whether it must be refused). Truncations may leave a valid prefix."""
    doc = json.loads(json.dumps(VALID))  # a deep copy of plain data
    entry = draw(st.sampled_from(doc["entries"]))
    kind = draw(st.sampled_from(["delete", "retype", "unknown_knob", "unknown_field",
                                 "duplicate", "family", "bytes", "bad_yaml", "truncate"]))
    if kind == "delete":
        where, key = draw(st.sampled_from(
            [(doc, k) for k in TOP_REQUIRED] + [(entry, k) for k in ENTRY_REQUIRED]
            + [(entry["problem"], k) for k in PROBLEM_REQUIRED] + [(doc["device"], "name")]))
        del where[key]
    elif kind == "retype":
        where, key, values = draw(st.sampled_from(
            [(doc, k, ALIEN_OR_NULL) for k in TOP_REQUIRED]
            + [(entry, k, ALIEN_OR_NULL) for k in (*ENTRY_REQUIRED, "family_set")]
            + [(entry["problem"], k, ALIEN_OR_NULL) for k in (*PROBLEM_REQUIRED, "head_dim")]
            + [(entry["config"], k, ALIEN_OR_NULL) for k in entry["config"]]
            + [(entry, k, ALIEN) for k in OPTIONAL]))
        where[key] = draw(values)
    elif kind == "unknown_knob":
        entry["config"][draw(st.sampled_from(["wraps", "tile_m", "block_k", "stage"]))] = 2
    elif kind == "unknown_field":
        entry[draw(st.sampled_from(["median", "winner", "notes"]))] = 1
    elif kind == "duplicate":
        doc["entries"].append(json.loads(json.dumps(entry)))
    elif kind == "family":  # a module path would be imported: only known families are
        entry["family"] = draw(st.sampled_from(["os", "os.path", "tests.doubles.fake_family",
                                                 ".", "", "mma_sync.kernel", "wgmma "]))
    elif kind == "bytes":
        return draw(st.binary(max_size=200)), True
    elif kind == "bad_yaml":
        lines = _dump(doc).splitlines()
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, draw(st.sampled_from(BAD_YAML_LINES)))
        return "\n".join(lines) + "\n", True
    else:
        # The checksum makes every cut that loses more than trailing whitespace fail.
        text = SHIPPED.read_text()
        cut = draw(st.integers(0, len(text) - 1))
        return text[:cut], bool(text[cut:].strip())
    return _dump(doc), True


def _content(db: Path) -> dict:
    con = sqlite3.connect(db)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
                for t in ("tuner_devices", "tuner_problems", "tuner_trials", "tuner_best")}
    finally:
        con.close()


@pytest.fixture(scope="module")
def imported_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("fuzz") / "db.sqlite"
    code, _, err = run(["import", str(SHIPPED), "--db", f"sqlite:///{db}", "--force"])
    assert code == 0, err
    return db


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=broken_tables())
def test_malformed_table_import_fails_in_one_line_and_changes_nothing(imported_db, case):
    content, must_fail = case
    path = imported_db.parent / "table.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    before = _content(imported_db)
    code, out, err = run(["import", str(path), "--db", f"sqlite:///{imported_db}", "--force"])
    if code == 0 and not must_fail:  # a cut of the final newline only: the same table
        assert out.startswith("nothing new from "), out
        assert _content(imported_db) == before
        return
    assert code == 2, err
    assert one_line(err) and err.startswith("tuner import: error: "), err
    assert _content(imported_db) == before


def test_table_refuses_aliases_without_expanding_them(tmp_path):
    # Nine levels of ten aliases: a billion strings if expanded.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    code, _, err = run(["import", str(path), "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"])
    assert code == 2 and one_line(err) and "aliases" in err


def test_table_timestamps_are_read_as_utc():
    from tuner.tables import _datetime

    aware = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert _datetime(aware) == dt.datetime(2026, 1, 2, 1, 4, 5)
    assert _datetime("2026-01-02T03:04:05") == dt.datetime(2026, 1, 2, 3, 4, 5)
    with pytest.raises(ValueError):
        _datetime(dt.date(2026, 1, 2))


# ---- passwords ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, shown", [
    (f"postgresql+psycopg://tuner:{SECRET}@db.example:5432/tuner",
     "postgresql+psycopg://tuner:***@db.example:5432/tuner"),
    (f"postgresql://u:{SECRET}@h/x?sslmode=require", "postgresql://u:***@h/x?sslmode=require"),
    ("sqlite:////tmp/tuner.sqlite", "sqlite:////tmp/tuner.sqlite"),
    ("postgresql://host/db", "postgresql://host/db"),
    (f"not a url with {SECRET}@host:port", "host:port"),
])
def test_display_url_hides_the_password(url, shown):
    assert display_url(url) == shown


# Port 1 on loopback refuses at once: a server that is not there.
UNREACHABLE = f"postgresql+psycopg://tuner:{SECRET}@127.0.0.1:1/tuner"
SEARCH = ["search", "--gpu", "h200", "--seq-lens", "64", "--heads", "2", "--head-dim", "64",
          "--families", "tests.doubles.fake_family", "--trials", "2"]


@pytest.mark.parametrize("args", [
    ["show", "--db", UNREACHABLE],
    ["show", "--db", UNREACHABLE, "--json"],
    ["export", "--gpu", "h200", "--db", UNREACHABLE],
    ["import", str(SHIPPED), "--db", UNREACHABLE, "--force"],
    [*SEARCH, "--db", UNREACHABLE],
    [*SEARCH, "--db", "sqlite:///{tmp}/db.sqlite", "--storage", UNREACHABLE],
    ["show", "--db", f"postgresql+nosuchdriver://tuner:{SECRET}@127.0.0.1:1/tuner"],
    ["show", "--db", f"postgresql://tuner:{SECRET}@127.0.0.1:notaport/tuner"],
], ids=["show", "show-json", "export", "import", "search-db", "search-storage", "no-driver",
        "bad-port"])
def test_no_command_prints_a_database_password(args, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = run(args)
    assert code == 2, err
    assert one_line(err), err
    assert SECRET not in out + err
    assert "cannot open" in err or "database URL" in err or "driver" in err, err


def test_a_refused_login_names_the_database_without_its_password(pg_url):
    from sqlalchemy.engine import make_url

    wrong = make_url(pg_url).set(password=SECRET).render_as_string(hide_password=False)
    code, out, err = run(["show", "--db", wrong])
    assert code == 2 and one_line(err) and SECRET not in out + err
    assert "password authentication failed" in err and ":***@" in err


# ---- --json -------------------------------------------------------------------------------------
# The top-level keys scripts rely on (README, Usage): a change here is a change of the interface.

def test_json_keys_of_gpus_and_space():
    code, out, _ = run(["gpus", "--json"])
    doc = json.loads(out)
    assert code == 0 and set(doc) == {"profiles", "local"}
    assert set(doc["profiles"]["h200"]) >= {"name", "arch", "sm_count", "smem_per_block",
                                            "l2_bytes"}
    code, out, _ = run(["space", "--gpu", "h200", "--family", "mma_sync", "--json"])
    doc = json.loads(out)
    assert code == 0 and set(doc) == {"gpu", "arch", "problem", "summary", "configs"}
    assert set(doc["summary"]) >= {"total", "feasible", "rejected_by_reason"}
    assert set(doc["configs"][0]) >= {"family", "config", "status", "reason"}


def test_json_keys_of_show(imported_db):
    code, out, _ = run(["show", "--db", f"sqlite:///{imported_db}", "--json"])
    rows = json.loads(out)
    assert code == 0 and rows
    assert set(rows[0]) == {"device", "device_id", "problem", "seq_len", "heads", "seq_len_kv",
                            "kv_heads", "causal", "family_set", "family", "config", "median_ms",
                            "prepare_ms", "iqr_ms", "tflops", "default_ms", "default_prepare_ms",
                            "default_tflops", "speedup_over_default", "rel_rms", "e2e_error",
                            "e2e_data", "max_error", "decided_at", "code_version"}


def test_json_keys_of_show_trials(imported_db):
    code, out, _ = run(["show", "--db", f"sqlite:///{imported_db}", "--trials", "4096",
                        "--heads", "56", "--json"])
    problems = json.loads(out)
    assert code == 0 and problems
    assert set(problems[0]) == {"problem", "outcomes", "trials"}
    assert set(problems[0]["trials"][0]) == {"id", "family", "config", "outcome", "median_ms",
                                             "prepare_ms", "e2e_error", "e2e_data", "max_error",
                                             "message"}


def test_json_keys_of_bench_and_its_peers_stored(tmp_path, monkeypatch):
    # The timing needs a GPU; what `bench --json` prints and stores around it does not.
    from tuner import bench, gpus
    from tuner.bench import BenchRow

    def fake_bench(problem, gpu, against, **_):
        return [BenchRow(problem.seq_len, "tuned", "wgmma: default", 1.0, 0.01, 900.0, 45.5, 1.0),
                BenchRow(problem.seq_len, "sdpa-cudnn", "bf16", 1.5, 0.01, 600.0, 30.3, 1.5)]

    monkeypatch.setattr(bench, "bench_seq_len", fake_bench)
    monkeypatch.setattr(gpus, "resolve_gpu", lambda name: gpus.PROFILES["h200"])
    monkeypatch.setattr(gpus, "device_fingerprint", lambda: {
        "name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132})
    db = tmp_path / "bench.sqlite"
    code, out, err = run(["bench", "--seq-lens", "4096", "--against", "sdpa-cudnn",
                          "--db", f"sqlite:///{db}", "--json"])
    doc = json.loads(out)
    assert code == 0, err
    assert set(doc) == {"device", "rows"}
    assert set(doc["rows"][0]) == {"seq_len", "system", "detail", "median_ms", "iqr_ms", "tflops",
                                   "pct_of_fp8_peak", "tuned_speedup", "rel_rms", "note",
                                   "prepare_ms"}
    # The peer's row is stored for `tuner show --plot`; the tuned row is not (search owns it).
    stored = sqlite3.connect(db).execute(
        "SELECT family, role FROM tuner_trials").fetchall()
    assert stored == [("sdpa-cudnn", "bench")]


def test_bench_names_an_unknown_peer_with_the_choices():
    code, out, err = run(["bench", "--seq-lens", "4096", "--against", "default,cudnn"])
    assert code == 2 and one_line(err)
    assert "unknown cudnn" in err and "cudnn-fp8" in err
