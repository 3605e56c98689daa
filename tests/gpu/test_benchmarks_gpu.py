"""Every benchmark suite runs on the GPU at a tiny shape and writes its section, stamped, with
numbers in it, into one results page in the suites' order (no timing is asserted: performance is
a benchmark, never a test). About two minutes on an H100, most of it compiles and two searches."""

import re

import pytest

from benchmarks import SUITES
from benchmarks.__main__ import main

pytestmark = pytest.mark.gpu

TINY = "1,1024,4,128"
ARGS = {
    "kernel": ["--shapes", TINY, f"{TINY},causal"],
    "e2e": ["--shapes", TINY, "--loop-ms", "20"],
    "quant": ["--shapes", TINY, "2,1000,4,64,kvh=2", "--transforms"],
    "accuracy": ["--shapes", TINY, "--kinds", "randn", "k_bias_8", "--cases",
                 "realistic@1,1024,4,128,causal", "--cost-shapes", TINY],
    "gate": ["--shapes", TINY, "--sweep-shapes", "1,1/77,2,128", "--sweep-configs", "2",
             "--procs", "2"],
    "search": ["--shapes", TINY, "--trials", "2", "--families", "wgmma"],
    "host": ["--shapes", TINY, "--calls", "20", "--profile-calls", "20"],
}


def test_every_suite_writes_its_stamped_section(tmp_path, capsys):
    from benchmarks.common import local_gpu

    for suite in SUITES:
        assert main([suite, "--repeats", "10", "--results", str(tmp_path), *ARGS[suite]]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out
    page = (tmp_path / f"{local_gpu().name}.md").read_text()
    starts = [page.index(f"<!-- begin {suite} -->") for suite in SUITES]
    assert starts == sorted(starts)
    for suite in SUITES:
        section = page[page.index(f"<!-- begin {suite} -->"):page.index(f"<!-- end {suite} -->")]
        assert f"`python -m benchmarks {suite} --repeats 10" in section
        # A table row whose measured cells hold a number, not only "-".
        rows = [line for line in section.splitlines()
                if line.startswith("| ") and not line.startswith("| shape |")
                and re.search(r"\| \d+\.\d+", line)]
        assert rows, f"{suite}: no measured row in\n{section}"
