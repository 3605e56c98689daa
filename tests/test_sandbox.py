"""Sandbox isolation and the measuring helpers that need no GPU."""

from __future__ import annotations

import time
from multiprocessing.connection import wait

import pytest

from tests.doubles import fake_family
from tuner.measure import (
    CandidateFailure,
    classify_launch_error,
    guarded,
    rotation_sets,
    summarize,
)
from tuner.sandbox import Sandbox, SandboxBug, Task

PROBLEM = dict(batch=1, heads=2, seq_len=64, head_dim=64, causal=False)


def task(kind: str, tile: int, stages: int, timeout_s: float = 30.0) -> Task:
    return Task(kind=kind, family="tests.doubles.fake_family",
                config={"tile": tile, "stages": stages}, problem=PROBLEM, arch="sm_90a",
                device="cpu", timeout_s=timeout_s, repeats=10)


def result_of(sandbox: Sandbox):
    while True:
        readable = wait([sandbox.connection], timeout=0.5)
        got = sandbox.collect() if readable else sandbox.expire()
        if got is not None:
            return got[1]


def test_compile_sandbox_survives_a_dying_compiler_and_restarts():
    w = Sandbox("compile-test", preload=("variants",))
    try:
        w.submit(task("compile", 16, 2))  # the fake compiler calls os._exit(7)
        dead = result_of(w)
        assert dead.outcome == "crash" and "exit code 7" in dead.message
        w.submit(task("compile", 64, 2))
        ok = result_of(w)
        assert ok.outcome == "ok" and ok.resources["smem_bytes"] == 64 * 2 * 64
        assert w.restarts == 1
        w.submit(task("compile", 16, 1))
        err = result_of(w)
        assert err.outcome == "compile_error" and "cannot partition" in err.message
    finally:
        w.close()


def test_a_bug_in_the_tuner_is_raised_not_stored():
    w = Sandbox("bug-test")
    try:
        w.submit(task("no-such-kind", 64, 2))
        with pytest.raises(SandboxBug, match="unknown task kind"):
            result_of(w)
    finally:
        w.close()


def test_hung_kernel_is_killed_at_its_deadline_and_the_next_candidate_runs():
    w = Sandbox("gpu-test", preload=("torch", "tuner.measure", "variants.reference"))
    try:
        # The deadline starts when the child is ready: torch's import is not the task's time.
        w.submit(task("evaluate", 16, 4, timeout_s=1.0))  # the fake kernel sleeps for an hour
        t0 = time.monotonic()
        hung = result_of(w)
        assert hung.outcome == "timeout" and "killed" in hung.message
        assert time.monotonic() - t0 < 30
        w.submit(task("evaluate", 64, 2))
        ok = result_of(w)
        assert ok.outcome == "ok" and ok.accuracy["passed"] and ok.timing["repeats"] >= 10
        # The double's own clock (fake_family.time_launch): its modelled cost, exactly, however
        # busy the machine, not the wall time of its sleep.
        assert ok.timing["clock"] == "cpu-family-clock"
        assert ok.timing["median_ms"] == fake_family.cost_ms(fake_family.Config(64, 2))
        assert ok.timing["iqr_ms"] == 0.0
        assert ok.timing["prepare_ms"] == fake_family.PREPARE_MS
    finally:
        w.close()


def test_a_cpu_family_without_a_clock_of_its_own_is_timed_with_perf_counter():
    import torch

    from tuner.measure import time_kernel
    from tuner.problem import Problem

    torch.set_num_threads(1)
    cfg = fake_family.Config(64, 3)
    problem = Problem(**PROBLEM)
    kernel = fake_family.compile(cfg, problem, "sm_90a")
    timing = time_kernel(kernel, problem, torch.device("cpu"), seed=1, l2_bytes=0, repeats=10,
                         warmup=1)
    assert timing.clock == "cpu-perf-counter"
    assert timing.median_ms >= fake_family.cost_ms(cfg)  # the sleep, and the reference on top
    # A CPU family's clock never times a GPU launch: refused before anything runs.
    with pytest.raises(ValueError, match="CUDA launches are timed with events"):
        time_kernel(kernel, problem, torch.device("cuda"), seed=1, l2_bytes=0,
                    cpu_clock=lambda launch: 1.0)


def test_prepare_is_timed_as_the_runtime_calls_it_without_the_input_checks():
    """The checks' finiteness scan syncs the device: timed per call it measured a host round
    trip, 10x the GPU work at B=4 S=1024 on the H200, and picked a slower kernel there. And as
    a repeated call that drops the LSE prepares (want_lse=False: no K smoothing q . m), since
    the timed runs drop it too."""
    import torch

    from tuner.measure import time_kernel
    from tuner.problem import Problem

    problem = Problem(**PROBLEM)
    inner = fake_family.compile(fake_family.Config(64, 3), problem, "sm_90a")
    calls, lse_kept = [], []

    class Recording:
        def prepare(self, q, k, v, softmax_scale=None, *, validate=True, want_lse=True):
            calls.append(validate)
            lse_kept.append(want_lse)
            return inner.prepare(q, k, v, softmax_scale)

        def run(self, prepared, out=None, lse=None, want_lse=True):
            return inner.run(prepared, out=out, lse=lse, want_lse=want_lse)

    timing = time_kernel(Recording(), problem, torch.device("cpu"), seed=1, l2_bytes=0,
                         repeats=10, warmup=1)
    assert timing.prepare_ms > 0
    # The input set is made once with the checks; every timed call skips them.
    assert calls[0] is True and calls[1:] == [False] * 10
    assert not any(lse_kept)


def test_guarded_types_candidate_errors():
    def boom():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(CandidateFailure) as info:
        guarded("run", boom)
    assert info.value.outcome == "crash" and "illegal memory access" in info.value.message
    with pytest.raises(CandidateFailure) as info:
        guarded("compile", boom)
    assert info.value.outcome == "compile_error"
    assert classify_launch_error(RuntimeError("too many resources requested")) == "launch_error"


def test_summary_statistics_and_rotation():
    med, q1, q3, low = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (med, q1, q3, low) == (3.0, 2.0, 4.0, 1.0)
    assert rotation_sets(set_bytes=200, l2_bytes=1000) == 11  # 11 * 200 > 2 * 1000
    assert rotation_sets(set_bytes=3000, l2_bytes=1000) == 1


def test_a_stopping_search_lets_the_gpu_sandbox_finish_its_evaluation_within_a_bound():
    """Pipeline.drop(settle_s): the GPU sandbox's evaluation in flight finishes (its result
    dropped) and the sandbox lives on for the next problem; one still running at the bound is
    killed as drop() without it kills it at once."""
    from tuner.search.pool import Pipeline

    pipeline = Pipeline(compile_jobs=1)
    try:
        pipeline.gpu.submit(task("evaluate", 64, 2))  # the sandbox's start, then its evaluation
        pipeline.drop(settle_s=60.0)
        assert not pipeline.gpu.busy and pipeline.gpu.starts == 1 and not pipeline.ready
        assert pipeline.gpu._proc.is_alive()  # kept for what comes next
        pipeline.gpu.submit(task("evaluate", 16, 4, timeout_s=600.0))  # sleeps for an hour
        t0 = time.monotonic()
        pipeline.drop(settle_s=1.0)
        assert not pipeline.gpu.busy and time.monotonic() - t0 < 10
        pipeline.gpu.submit(task("evaluate", 64, 2))
        assert result_of(pipeline.gpu).outcome == "ok" and pipeline.gpu.starts == 2
    finally:
        pipeline.close()


def test_a_pipeline_started_now_has_its_sandboxes_up_before_their_first_task():
    """Pipeline(start_now=True): every sandbox starts at once, and again after drop() kills
    it, so that a search's first candidate and the next problem's do not wait for a start-up;
    the first task on such a sandbox runs on that start, not another."""
    from tuner.search.pool import Pipeline

    pipeline = Pipeline(compile_jobs=2, start_now=True)
    try:
        sandboxes = [*pipeline.compilers, pipeline.gpu]
        assert all(s._proc is not None and s._proc.is_alive() and not s.busy for s in sandboxes)
        time.sleep(1.0)  # "ready" sits in the pipe until the first task
        pipeline.gpu.submit(task("evaluate", 64, 2))
        assert result_of(pipeline.gpu).outcome == "ok" and pipeline.gpu.starts == 1
        pipeline.compilers[0].submit(task("evaluate", 16, 4, timeout_s=600.0))  # an hour
        pipeline.drop()
        first = pipeline.compilers[0]
        assert first.starts == 2 and first._proc.is_alive() and not first.busy
        assert pipeline.compilers[1].starts == 1 and pipeline.gpu.starts == 1
    finally:
        pipeline.close()
    assert Pipeline(compile_jobs=1).gpu._proc is None  # started on first use otherwise


def test_a_ctrl_c_while_a_sandbox_starts_leaves_it_closable_and_restartable():
    """A KeyboardInterrupt inside Process.start() (Ctrl-C reaches the search while it spawns a
    sandbox) propagates as itself; the search's cleanup then closes the sandbox without error,
    and the next submit starts a working child."""
    sandbox = Sandbox("interrupted")
    real = sandbox._ctx

    class InterruptedContext:
        Pipe = staticmethod(real.Pipe)

        @staticmethod
        def Process(**kwargs):  # noqa: N802 - stands in for the context's Process
            class Interrupted(real.Process):
                def start(self):
                    raise KeyboardInterrupt

            return Interrupted(**kwargs)

    sandbox._ctx = InterruptedContext()
    with pytest.raises(KeyboardInterrupt):
        sandbox.submit(task("evaluate", 64, 2))
    sandbox.close()  # the cleanup path of an interrupted search
    assert not sandbox.busy
    sandbox._ctx = real
    try:
        sandbox.submit(task("evaluate", 64, 2))
        assert result_of(sandbox).outcome == "ok"
    finally:
        sandbox.close()
