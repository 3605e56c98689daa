"""Heuristic defaults as data, for every family: a table of rules (condition -> knobs), each with
a one-line reason and the docs page that holds its measurements.

Every rule whose condition holds is applied in order, a later one overriding the knobs it names;
the first rule of a table holds for every problem and names the knobs that have no dataclass
default. A condition names some of a problem's head_dim, mask, key-length bounds and query-length
floor (inclusive); what it leaves out it does not test. default(arch) without a problem sees
head_dim 128, no mask and unknown lengths, which no bound on a length matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class When:
    head_dim: int | None = None
    causal: bool | None = None
    min_keys: int | None = None  # seq_len_kv >= min_keys
    max_keys: int | None = None  # seq_len_kv <= max_keys
    min_queries: int | None = None  # seq_len >= min_queries

    def holds(self, problem) -> bool:
        if problem is None:
            head_dim, causal, keys, queries = 128, False, None, None
        else:
            head_dim, causal = problem.head_dim, problem.causal
            keys, queries = problem.seq_len_kv, problem.seq_len
        if self.head_dim is not None and head_dim != self.head_dim:
            return False
        if self.causal is not None and causal != self.causal:
            return False
        if self.min_keys is not None and (keys is None or keys < self.min_keys):
            return False
        if self.min_queries is not None and (queries is None or queries < self.min_queries):
            return False
        return self.max_keys is None or (keys is not None and keys <= self.max_keys)

    def describe(self) -> str:
        parts = []
        if self.head_dim is not None:
            parts.append(f"head_dim {self.head_dim}")
        if self.causal is not None:
            parts.append("causal" if self.causal else "full mask")
        if self.min_keys is not None:
            parts.append(f"keys >= {self.min_keys}")
        if self.max_keys is not None:
            parts.append(f"keys <= {self.max_keys}")
        if self.min_queries is not None:
            parts.append(f"queries >= {self.min_queries}")
        return ", ".join(parts) or "always"


@dataclass(frozen=True)
class Rule:
    when: When
    knobs: dict = field(hash=False)
    why: str = ""
    docs: str = ""


def apply_rules(rules, problem) -> dict:
    """The knobs of every rule that holds for `problem`, in order."""
    knobs = {}
    for rule in rules:
        if rule.when.holds(problem):
            knobs.update(rule.knobs)
    return knobs


def markdown_table(rules) -> str:
    """The rules as the Markdown table the family's docs page shows (a test keeps them equal)."""
    lines = ["| when | knobs | why |", "|---|---|---|"]
    for rule in rules:
        knobs = ", ".join(f"{k}={v}" for k, v in rule.knobs.items())
        lines.append(f"| {rule.when.describe()} | {knobs} | {rule.why} |")
    return "\n".join(lines)


def k_smoothing_rule(docs: str) -> Rule:
    """Both families' last rule: prepare's K smoothing on for every problem (docs/accuracy.md
    has its measured cost and accuracy, and the rotation's cost that keeps it off below
    wgmma's rotation thresholds, variants/wgmma/defaults.py)."""
    return Rule(When(), dict(k_smoothing="mean"),
                "K smoothing on: exact, and K's per-channel bias no longer costs FP8 accuracy "
                "(docs/accuracy.md); one sampled-mean reduction beside the quantization", docs)
