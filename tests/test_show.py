"""`tuner show`: what a winner's speedup compares and the times it is made of, the family set
that tells two winners of one problem apart, and the accuracy budget's error."""

from __future__ import annotations

import json

from tests.test_tables import SEED
from tests.test_tables_budget import DEVICE, WINNERS, budget_store
from tuner.cli import main
from tuner.store import TrialRecord


def show(capsys, url: str, *extra: str) -> str:
    """`tuner show --db url ...`'s standard output (it must exit 0)."""
    assert main(["show", "--db", url, *extra]) == 0
    return capsys.readouterr().out


def test_the_speedup_is_labelled_and_shown_with_its_four_times(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    budget_store(url).close()
    text = show(capsys, url)
    # The 4096 winner's kernel (0.910 ms) is slower than the default's (0.892 ms); its prepare
    # (0.052 against 0.078) makes it ahead: the ratio is kernel + prepare, and says so.
    assert "speedup (kernel+prepare)" in text and "the speedup compares kernel + prepare" in text
    row = next(line for line in text.splitlines() if "b1-h56-s4096" in line)
    cells = [c.strip() for c in row.split("│")]
    assert cells[6:11] == ["0.910", "0.052", "0.892", "0.078", "1.020"], cells
    rows = {r["problem"]: r for r in json.loads(show(capsys, url, "--json"))}
    four = rows["b1-h56-s4096-d128-full"]
    assert (four["median_ms"], four["prepare_ms"], four["default_ms"],
            four["default_prepare_ms"]) == (0.91, 0.052, 0.91 * 0.98, 0.052 * 1.5)


def test_winners_of_two_family_sets_are_told_apart(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    store = budget_store(url)
    problem = WINNERS[0][0]
    tid = store.record_trial(TrialRecord(
        id=None, device_id=DEVICE, problem_key=problem.key(), family_set="wgmma+mma_sync",
        family="mma_sync", config=SEED.to_dict(), config_hash="x", outcome="ok", median_ms=0.95))
    store.set_best(DEVICE, problem, "wgmma+mma_sync", tid, None, None)
    store.close()
    rows = [line for line in show(capsys, url).splitlines() if problem.key() in line]
    sets = sorted([c.strip() for c in row.split("│")][3] for row in rows)
    assert sets == ["mma_sync", "wgmma+mma_sync"]


def test_the_accuracy_budgets_error_and_its_data_are_shown(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    budget_store(url).close()
    text = show(capsys, url)
    assert "0.0660 realistic" in text and "0.0412 calib:" in text
    rows = {r["problem"]: r for r in json.loads(show(capsys, url, "--json"))}
    assert [(rows[p.key()]["e2e_error"], rows[p.key()]["e2e_data"], rows[p.key()]["max_error"])
            for p, *_ in WINNERS] == [(err, data, 0.1) for *_, err, data in WINNERS]
    (problem,) = json.loads(show(capsys, url, "--trials", "4096", "--json"))
    assert {t["e2e_error"] for t in problem["trials"]} == {0.066, None}


def test_the_gpu_filter_takes_auto_and_aliases_as_the_other_commands_do(tmp_path, capsys,
                                                                      monkeypatch):
    """--gpu auto is the local GPU's profile (as in search and export), a profile name keeps its
    devices, another GPU's keeps none, and an unknown name is one line naming the profiles."""
    from tuner import gpus

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    budget_store(url).close()  # winners of an H200
    monkeypatch.setattr(gpus, "local_profile", lambda device=0: gpus.PROFILES["h200"])
    rows = {gpu: json.loads(show(capsys, url, "--gpu", gpu, "--json"))
            for gpu in ("auto", "h200", "H200", "h100")}
    assert len(rows["auto"]) == len(WINNERS) and rows["auto"] == rows["h200"] == rows["H200"]
    assert rows["h100"] == []
    monkeypatch.setattr(gpus, "local_profile", lambda device=0: gpus.PROFILES["h100"])
    assert json.loads(show(capsys, url, "--gpu", "auto", "--json")) == []
    assert main(["show", "--db", url, "--gpu", "a100"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'a100'" in err and "h200" in err
