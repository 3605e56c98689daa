"""From a sandbox's result to the Store: the candidate on its way, the one row that records its
measurement (or rejection), and what the Store already holds for the study."""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path

import variants
from tuner.outcomes import Role
from tuner.problem import Problem
from tuner.sandbox import CandidateResult
from tuner.store import Store, TrialRecord

# TrialRecord columns copied by name from the dicts of a CandidateResult.
_FROM_TIMING = ("median_ms", "iqr_ms", "prepare_ms", "sm_clock_mhz", "temperature_c")
_FROM_ACCURACY = ("rel_rms", "max_abs", "lse_max_err", "nonfinite", "e2e_error", "e2e_data",
                  "max_error")
_FROM_RESOURCES = ("registers", "spill_bytes", "smem_bytes")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


@dataclass
class Candidate:
    """A config on its way from the study through the sandboxes to the Store. `trial` is None
    for the final re-time, which is no trial of the study."""

    trial: object  # optuna.Trial | None
    family: str
    config: dict
    hash: str
    role: Role
    started_at: dt.datetime = dataclasses.field(default_factory=utcnow)
    compile_result: CandidateResult | None = None


# Modules of variants/ that check and time nothing (the gate's fp32 reference, its bounds, its
# check of prepare; the public boundary's input checks): a change there leaves every stored time
# comparable.
CHECK_ONLY_MODULES = frozenset({"reference.py", "reference_bounds.py", "prepare_check.py",
                                "input_checks.py"})
# The runtime's repeated-call path: its launches are prepare + run's, which the searches time.
RUNTIME_ONLY_MODULES = frozenset({"launch_plan.py"})
# The default rules (variants/defaults.py, each family's defaults.py) choose which config runs
# untuned and change no config's time: a new default keeps every stored time comparable.
CHOICE_ONLY_MODULE = "defaults.py"


def code_version(family_module) -> str:
    """Hash of the code a stored time depends on: the family's source files, the device code and
    host work every family shares (variants/*.py but CHECK_ONLY_MODULES and RUNTIME_ONLY_MODULES:
    prepare and its quantization kernel, the launch, the block scales; variants/common/*.py),
    and the tuner's measuring code; the default rules (CHOICE_ONLY_MODULE) of both are left out.
    A stored time is only comparable with times the same code measured. The files count as code
    (code_hash): an edit of their comments or docstrings keeps the version."""
    path = Path(family_module.__file__)
    files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
    tuner = Path(__file__).parents[1]
    shared = Path(variants.__file__).parent
    left_out = CHECK_ONLY_MODULES | RUNTIME_ONLY_MODULES | {CHOICE_ONLY_MODULE}
    timed = [f for f in [*files, *sorted(shared.glob("*.py"))] if f.name not in left_out]
    return code_hash([*timed, *sorted((shared / "common").glob("*.py")),
                      tuner / "measure.py", tuner / "sandbox_task.py"])[:12]


def code_hash(paths) -> str:
    """sha256 (hex) of the named files' names and code, in the given order: each file's syntax
    tree without docstrings (code_text), so comments, docstrings and layout do not count."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode())
        h.update(code_text(path.read_text()).encode())
    return h.hexdigest()


def code_text(source: str) -> str:
    """The code of a Python source as text: its syntax tree with the docstrings of the module,
    classes and functions dropped, written out field by field (_tree_text)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
    return _tree_text(tree)


def _tree_text(node) -> str:
    """A syntax tree as text, without positions. Unlike ast.dump it leaves out empty and None
    fields, so Python versions that only add fields (3.12's type_params) write the same text:
    the device (3.12) and this checkout's CI (3.11) hash alike."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={_tree_text(value)}" for name in node._fields
                  if (value := getattr(node, name, None)) is not None and value != []]
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(_tree_text(v) for v in node)}]"
    return repr(node)


@dataclass(frozen=True)
class Records:
    """The rows of one study in the Store: what every row of it shares, written once here."""

    store: Store
    device_id: str
    problem: Problem
    family_set: str
    study_name: str
    seed: int
    versions: dict[str, str]  # family -> code_version

    def record(self, cand: Candidate, result: CandidateResult) -> TrialRecord:
        """Store the result of `cand`; returns the row as stored, with its id."""
        timing, accuracy = result.timing or {}, result.accuracy or {}
        measured = {**{k: timing.get(k) for k in _FROM_TIMING},
                    **{k: accuracy.get(k) for k in _FROM_ACCURACY},
                    **{k: (result.resources or {}).get(k) for k in _FROM_RESOURCES}}
        median = measured["median_ms"]
        rec = TrialRecord(
            id=None, device_id=self.device_id, problem_key=self.problem.key(),
            family_set=self.family_set, family=cand.family, config=cand.config,
            config_hash=cand.hash, outcome=result.outcome, message=result.message,
            role=cand.role, study_name=self.study_name,
            optuna_number=cand.trial.number if cand.trial is not None else None,
            tflops=self.problem.tflops(median) if median else None, compile_s=result.compile_s,
            timing=timing or None, seed=self.seed, code_version=self.versions[cand.family],
            started_at=cand.started_at, **measured,
        )
        return dataclasses.replace(rec, id=self.store.record_trial(rec))

    def stored(self) -> dict[str, TrialRecord]:
        """config hash -> the first stored search/default trial of this study, by any process."""
        found: dict[str, TrialRecord] = {}
        for rec in self.store.trials(self.problem, self.device_id, self.family_set,
                                     study_name=self.study_name):
            if rec.role != Role.RETIME:
                found.setdefault(rec.config_hash, rec)
        return found
