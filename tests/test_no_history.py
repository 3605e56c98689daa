"""The tracked text states the present (docs/DESIGN.md, "Where things are written down"): no
numbered sessions or rounds of work, no issue numbers, no withdrawn accounts, no "we tried"
narratives, no branch names, no commits cited as provenance. How the work went lives in git log.

A line that must name one of these anyway (say, an upstream bug by its number) carries the
marker `history-ok` with the reason beside it, in a comment of its file's kind:
`# history-ok: upstream CUTLASS issue` or `<!-- history-ok: ... -->`.
"""

import bisect
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLOW = "history-ok"
# This file names the words it looks for; the results pages are written by `python -m benchmarks`,
# whose stamp names the commit measured: the scan leaves these out.
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()
GENERATED = "benchmarks/results/"

_ORDINAL = (r"(?:\d+(?:st|nd|rd|th)|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
            r"|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth"
            r"|eighteenth|nineteenth|twentieth|thirtieth|fortieth"
            r"|(?:twenty|thirty|forty)-(?:first|second|third|fourth|fifth|sixth|seventh|eighth"
            r"|ninth))")
# name -> pattern (case-insensitive), each a way the tree would tell its history, and the
# lowercase words a line needs for the pattern to be tried on it (a pass over ~40,000 lines).
PATTERNS = {
    "numbered session": rf"\b{_ORDINAL}[\s-]+sessions?\b|\bsessions?\s+\d+\b",
    "session narrative": r"\b(?:this|that|previous|earlier|last|next|later|same)\s+session",
    "numbered round": rf"\b{_ORDINAL}[\s-]+round of (?:work|review|fixes)\b|\brounds?\s+\d+\b",
    "issue number": r"\b(?:issues?|pull request|PR)\s*#?\d+\b|(?:^|[\s(\[])#\d+\b",
    "withdrawn": r"\bwithdr(?:aw|awn|ew)\b",
    "we tried": r"\b(?:we|I)\s+(?:had\s+)?tried\b|\bearlier\s+(?:version|attempt|round)s?\b",
    "branch name": r"\bbranch(?:es)?\s+(?:named\s+|called\s+)?[`'\"]?[\w-]+/[\w./-]+"
                   r"|\b(?:origin|upstream)/[\w-]+",
    "commit": r"\bcommits?\s+(?:since\s+)?`?[0-9a-f]{7,40}\b",
}
_TRIGGERS = ("session", "round", "issue", "#", "pr ", "pull request", "withdr", "tried", "earlier",
             "branch", "origin/", "upstream/", "commit")
_COMPILED = {name: re.compile(p, re.IGNORECASE) for name, p in PATTERNS.items()}
# A bare abbreviated (7-12) or full (40) commit id: hex with a digit and a letter, alone. Not in
# data files, where hex strings are checksums, code versions and device fingerprints, nor in a
# patch's index lines (its format).
_HEX = re.compile(r"(?<![\w./-])[0-9a-f]{7,40}(?![\w-])")
_HEX_IS_DATA = (".yaml", ".yml", ".json")
_PATCH_INDEX = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+")


# A file named after its issue or session (benchmarks/issue19_peers_h200.md).
_NAME = re.compile(r"(?:issue|session|round)[-_]?\d+", re.IGNORECASE)


def _commit_id(word: str) -> bool:
    return (len(word) <= 12 or len(word) == 40) and not word.isdigit() and \
        any(c.isdigit() for c in word)


def _tracked() -> list[str]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    return [name for name in names if name]


def _tracked_text() -> dict[str, str]:
    texts = {}
    for name in _tracked():
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def findings(name: str, text: str) -> list[str]:
    """'file:line: pattern: the words' for every line of `text` that tells history."""
    lines = text.splitlines()
    found = {}
    for number, line in enumerate(lines, 1):
        low = line.lower()
        if ALLOW in low or not any(t in low for t in _TRIGGERS):
            continue
        for pattern, regex in _COMPILED.items():
            match = regex.search(line)
            if match:
                found.setdefault((number, pattern), match.group(0).strip())
    if not name.endswith(_HEX_IS_DATA):
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        for match in _HEX.finditer(text):
            number = bisect.bisect_right(starts, match.start())
            line = lines[number - 1]
            if _commit_id(match.group(0)) and ALLOW not in line and not _PATCH_INDEX.match(line):
                found.setdefault((number, "commit"), match.group(0))
    return [f"{name}:{n}: {pattern}: {words!r}" for (n, pattern), words in sorted(found.items())]


def test_tracked_text_states_the_present():
    found = [f"{name}: file name: {_NAME.search(name).group(0)!r}" for name in _tracked()
             if _NAME.search(name)]
    found += [f for name, text in sorted(_tracked_text().items()) if name != SELF
              and not name.startswith(GENERATED) for f in findings(name, text)]
    assert not found, (f"{len(found)} lines tell the tree's history (reword to the present, or "
                       f"mark a needed one `{ALLOW}: reason`):\n" + "\n".join(found))


def test_each_pattern_catches_its_kind_and_the_marker_allows_a_line():
    told = {
        "numbered session": "measured in the nineteen" + "th session on the H200",
        "session narrative": "as the previous " + "session found",
        "numbered round": "fixed in round" + " 3",
        "issue number": "the bug of issue" + " 19; see also #" + "17",
        "withdrawn": "that account is with" + "drawn",
        "we tried": "we " + "tried a 256-key strip",
        "branch name": "from the branch experiment" + "/longest-first",
        "commit": "the per-head kernel (3099" + "e4a)",
    }
    for pattern, line in told.items():
        assert [f.split(": ")[1] for f in findings("x.md", line)][:1] == [pattern], line
        assert findings("x.md", f"{line} <!-- {ALLOW}: a test line -->") == []
    present = ["a SQLAlchemy session per call", "median of 30, two rounds",
               "round-to-nearest-even", "shape (1, 56, 30272)", "entries_sha256: " + "ab12" * 16,
               "device 19e43925299d9dba", "if cond:  # the causal branch of the mask",
               "format(x, '#06x')", "PRs welcome"]
    for line in present:
        assert findings("x.md", line) == [], line
    assert findings("t.yaml", "code_version: de5ad1ded147") == []
    assert _NAME.search("benchmarks/issue" + "19_peers_h200.md")
    assert not _NAME.search("benchmarks/round_trip.py")
    assert findings("p.patch", "index 8d8db9e..ff3deb3 100644") == []
