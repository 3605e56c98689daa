"""`tuner search`: find the fastest correct kernel config within the accuracy budget per sequence
length on this GPU."""

from __future__ import annotations

import argparse
import json
import os
import sys

from tuner.commands._args import (
    add_problem_arguments,
    add_shape_arguments,
    at_least,
    duration,
    name_list,
    problems_from_args,
)
from tuner.errors import TunerError
from tuner.outcomes import Outcome

NAME = "search"
HELP = "tune kernel configs for this GPU and store the winner per sequence length"


class DEFAULTS:
    trials = 64
    patience = 32
    confirm_patience = 6
    timeout_s = 600.0
    repeats = 20


def max_error(text: str) -> float:
    """An argparse type: a positive, finite relative RMS (budget.check_max_error)."""
    from tuner.budget import check_max_error

    try:
        return check_max_error(float(text), "--max-error")
    except ValueError as exc:  # float()'s, or the check's TunerError
        raise argparse.ArgumentTypeError(
            f"must be a positive relative RMS (e.g. 0.1), got {text!r}") from exc


def _default_compile_jobs() -> int:
    # One core stays with the main process and the GPU sandbox; compiles are CPU-bound.
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Defaults are spelled out here so that `tuner --help` and the other subcommands work where
    # optuna (imported by tuner.search) is not installed; test_search checks they agree.
    d = DEFAULTS
    parser.add_argument(
        "--gpu", default="auto", help="target profile; must be the local GPU (default: auto)"
    )
    add_problem_arguments(parser, seq_lens_example="4096,8192,30272", heads_default=None)
    add_shape_arguments(parser)
    parser.add_argument(
        "--families",
        type=name_list("mma_sync,wgmma"),
        default="auto",
        help="comma-separated families, or 'auto': every family that targets the GPU's arch "
        "(a dotted module path loads a test double)",
    )
    parser.add_argument(
        "--trials",
        type=at_least(1),
        default=d.trials,
        help="candidates that reach a compiler per sequence length, over all runs "
        f"of the study (default {d.trials})",
    )
    parser.add_argument(
        "--time-budget",
        type=duration,
        default=None,
        help="wall time per sequence length, e.g. 600, 10m, 1h (default: none)",
    )
    parser.add_argument(
        "--patience",
        type=at_least(0),
        default=d.patience,
        help="stop after this many measured candidates without improvement on the best valid "
        "one, once the default and the known configs are measured "
        f"(0: never; default {d.patience}; at most {d.confirm_patience} where the GPU's shipped "
        "table holds this problem's row, measured by this code within the budget)",
    )
    parser.add_argument(
        "--db",
        default=None,
        help="results database URL (default: $TUNER_DB_URL, else "
        "$TUNER_HOME/tuner.sqlite, else "
        "~/.local/share/fp8-attn-tuner/tuner.sqlite)",
    )
    parser.add_argument(
        "--storage", default=None,
        help="Optuna storage URL (default: the results database); given alone, it is the "
        "results database too"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="sampler seed (default: the study's recorded seed, else random)",
    )
    parser.add_argument(
        "--compile-jobs",
        type=at_least(1),
        default=_default_compile_jobs(),
        help="compile processes ahead of the GPU (default: CPU count - 1, max 8)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=d.timeout_s,
        help=f"seconds per candidate and stage before it is killed (default {d.timeout_s:g})",
    )
    parser.add_argument(
        "--repeats",
        type=at_least(10),
        default=d.repeats,
        help=f"timed launches per candidate, at least 10 (default {d.repeats})",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue interrupted studies; error if one does not exist (a plain "
        "re-run also continues a study with the same arguments)",
    )
    parser.add_argument(
        "--no-warm-start",
        dest="warm_start",
        action="store_false",
        help="measure only the default, its accurate twin and the sampler's proposals, not the "
        "configs known near each problem (the GPU's shipped table, this database's nearest "
        "winners), for a cold comparison",
    )
    parser.add_argument(
        "--workers",
        type=at_least(1),
        default=1,
        help="search processes on this host, one per visible GPU, sharing one study; the "
        "winner is decided once, after all of them (default 1)",
    )
    from tuner.budget import DEFAULT_MAX_ERROR

    parser.add_argument(
        "--calibration",
        metavar="FILE",
        default=None,
        help="hold candidates to the accuracy budget on your own attention inputs, a file "
        "written by tuner.capture (default: the realistic synthetic activations)",
    )
    parser.add_argument(
        "--max-error",
        type=max_error,
        default=DEFAULT_MAX_ERROR,
        help="the accuracy budget: the largest end-to-end relative RMS against fp32 attention a "
        "winner may have on the accuracy data (the worst call of a calibration file; default "
        f"{DEFAULT_MAX_ERROR:g})",
    )
    # Set by --workers on the processes it starts: the parent decides once, they do not.
    parser.add_argument("--no-decide", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print results as JSON on stdout")


def run(args: argparse.Namespace) -> int:
    try:
        from tuner.search import (
            Pipeline,
            ProblemSearch,
            SearchSettings,
            make_target,
            open_storage,
            runs_on_cpu,
        )
    except ModuleNotFoundError as exc:
        raise TunerError(
            f"tuner search needs the Python package {exc.name!r}, which is not installed here; "
            "install the project's dependencies (pip install -e .)"
        ) from exc
    from tuner.multi_gpu import visible_devices
    from tuner.store import Store
    from variants import load_family

    problems = problems_from_args(args)  # before looking for a GPU: a bad combination first
    budget = _budget(args, problems)  # before anything is created: a bad file changes nothing
    if args.families.strip() == "auto":
        from tuner.gpus import resolve_gpu
        from variants import families_for_arch

        args.families = ",".join(families_for_arch(resolve_gpu(args.gpu).arch))
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if not families:
        raise TunerError("--families is empty; name at least one, e.g. --families mma_sync")
    modules = {}
    for name in families:
        try:
            modules[name] = load_family(name)
        except ModuleNotFoundError as exc:
            raise TunerError(
                f"family {name!r} cannot be imported ({exc}); check --families") from exc

    # Families that run on the CPU (test doubles) take --workers without GPUs, as make_target
    # takes them without a local GPU.
    devices = visible_devices(args.workers, runs_on_cpu(modules)) if args.workers != 1 else []
    target = make_target(args.gpu, modules)
    settings = SearchSettings(
        trials=args.trials,
        time_budget_s=args.time_budget,
        patience=args.patience or None,
        seed=args.seed,
        compile_jobs=args.compile_jobs,
        timeout_s=args.timeout,
        repeats=args.repeats,
        resume=args.resume,
        warm_start=args.warm_start,
        budget=budget,
    )
    store = Store(_results_url(args))
    storage = open_storage(args.storage or store.url)
    store.record_device(target.device_id, target.fingerprint)

    if devices:
        results = _search_on_workers(args, devices, problems, families, target, store, storage,
                                     settings)
    else:
        view = SearchView(enabled=not args.json)
        results = []
        # One set of sandboxes for every problem: a GPU sandbox of its own per problem cost its
        # process start, imports and CUDA context (10-15 s a problem on an H100 host).
        with view, Pipeline(settings.compile_jobs, start_now=True) as pipeline:
            for problem in problems:
                search = ProblemSearch(
                    problem, families, target, store, storage, settings, on_progress=view.update
                )
                view.start(search.progress())
                results.append(search.run(decide=not args.no_decide, pipeline=pipeline))
                view.done(results[-1])
    if args.json:
        json.dump(
            {
                "device": target.device_id,
                "gpu": target.gpu.name,
                "families": families,
                "accuracy": {"data": budget.data, "max_error": budget.max_error},
                "results": [summary(r) for r in results],
            },
            sys.stdout,
            indent=2,
            default=str,
        )
        print()
    else:
        SearchView.table(results)
    return 0


def summary(result) -> dict:
    """JSON-ready view of a tuner.search.ProblemResult (the --json output, one per problem)."""
    from tuner.search.cost import record_cost

    def trial(rec) -> dict | None:
        if rec is None:
            return None
        # median_ms is the kernel alone; caller_ms adds prepare, what the search ranks by.
        return {"family": rec.family, "config": rec.config, "median_ms": rec.median_ms,
                "iqr_ms": rec.iqr_ms, "prepare_ms": rec.prepare_ms,
                "caller_ms": record_cost(rec), "tflops": rec.tflops, "rel_rms": rec.rel_rms,
                "e2e_error": rec.e2e_error, "e2e_data": rec.e2e_data, "trial_id": rec.id}

    return {
        "problem": result.problem.key(), "seq_len": result.problem.seq_len,
        "study": result.study_name, "seed": result.seed, "mode": result.mode,
        "feasible": result.feasible, "stopped": result.stopped,
        "measured_here": result.measured_here,
        # Outcome keys are StrEnum members: JSON writes their plain values ("ok", ...).
        "outcomes": dict(result.outcomes),
        # Accuracy classes a measured member ruled out, and the proposals of them skipped.
        "ruled_out_classes": result.ruled_out, "ruled_out_proposals": result.ruled_out_proposals,
        "winner": trial(result.winner), "default": trial(result.default),
        "speedup_over_default": result.speedup, "default_kept": result.default_kept,
        # One line when candidates ran but none qualified (all over the accuracy budget).
        "no_winner": result.no_winner or None,
    }


def _budget(args, problems):
    """The accuracy budget of --max-error on --calibration's file (checked whole, and holding
    every problem searched), else on the realistic activations."""
    from tuner import calibration
    from tuner.budget import Budget

    if args.calibration is None:
        return Budget(args.max_error)
    found = calibration.read(args.calibration)
    found.require(problems)
    return Budget(args.max_error, found.data, str(found.path.resolve()))


def _results_url(args) -> str | None:
    """--db, else $TUNER_DB_URL, else the --storage database: hosts that share a study through
    `--storage postgresql://...` alone must also share one results store (one winner, all
    trials), not keep them in a local SQLite file each. None: the default SQLite file."""
    return args.db or os.environ.get("TUNER_DB_URL") or args.storage


def _search_on_workers(args, devices, problems, families, target, store, storage, settings):
    """--workers N: N child searches (tuner.multi_gpu), then one decision per problem here, on
    the first of their GPUs."""
    from tuner.dburl import display_url
    from tuner.multi_gpu import merged, pinned, run_children
    from tuner.search import ProblemSearch, decision_pipeline

    if not args.json:
        print(f"tuner search: {len(devices)} workers (CUDA_VISIBLE_DEVICES "
              f"{', '.join(repr(d) for d in devices)}) on the study storage "
              f"{display_url(storage.url)}", file=sys.stderr)
    docs = run_children(args.argv, devices, args.seed)
    results = []
    with pinned(devices[0]), decision_pipeline() as pipeline:
        for i, problem in enumerate(problems):
            search = ProblemSearch(problem, families, target, store, storage, settings)
            stopped, outcomes, measured_here = merged(docs, i)
            results.append(search.decide(stopped, pipeline, outcomes, measured_here))
    return results


class SearchView:
    """Live progress (stderr) per sequence length, the final table (stdout); silent for --json."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.enabled = enabled
        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]s={task.fields[seq_len]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"),
            TextColumn("[red]{task.fields[fails]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not enabled,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def start(self, p) -> None:
        """`p`: the search's tuner.search.Progress."""
        self.tasks[p.study_name] = self.progress.add_task(
            "", total=p.trials, seq_len=p.problem.seq_len, best="", fails=""
        )
        if self.enabled:
            self.console.log(f"s={p.problem.seq_len}: {p.mode} over {p.feasible} feasible "
                             f"configs, seed {p.seed}, study {p.study_name}")
        self.update(p)

    def update(self, p) -> None:
        task = self.tasks.get(p.study_name)
        if task is None:
            return
        best = ""
        if p.best_ms is not None:
            best = f"best {p.best_ms:.3f} ms {p.problem.tflops(p.best_ms):.0f} TFLOP/s"
        fails = [f"{k}:{n}" for k, n in sorted(p.outcomes.items()) if k != Outcome.OK]
        ruled_out = [f"ruled_out:{p.ruled_out_proposals}"] if p.ruled_out_proposals else []
        fails = " ".join([*fails, *ruled_out])
        self.progress.update(task, completed=min(p.measured, p.trials), best=best, fails=fails)

    def done(self, result) -> None:
        task = self.tasks.get(result.study_name)
        if task is not None:
            self.progress.update(task, description="done")
        if self.enabled:
            self.console.log(f"s={result.problem.seq_len}: stopped ({result.stopped})")
            for line in result.ruled_out:
                self.console.log(f"s={result.problem.seq_len}: over the accuracy budget, not "
                                 f"measured further: {line}")

    @staticmethod
    def short_label(winner, default) -> str:
        """The winner as its family and the knobs where it differs from the family default
        (all knobs when it is another family than the default's, or there is no default)."""
        family = winner.family.rsplit(".", 1)[-1]
        if default is None or default.family != winner.family:
            return f"{family}: " + " ".join(f"{k}={v}" for k, v in winner.config.items())
        changed = [f"{k}={v}" for k, v in winner.config.items() if default.config.get(k) != v]
        return f"{family}: " + (" ".join(changed) if changed else "the default")

    @staticmethod
    def table(results) -> None:
        from rich.table import Table

        from tuner.commands._args import wide_console

        table = Table(title="tuner search")
        for col in ("seq_len", "winner", "kernel ms", "prepare ms", "TFLOP/s",
                    "vs default (kernel+prepare)", "gate rel err", "e2e err"):
            table.add_column(col, justify="left" if col == "winner" else "right")
        for r in results:
            w = r.winner
            if w is None:
                why = (f"decided by {r.deferred_to} (still searching)" if r.deferred_to
                       else "[red]none within the accuracy budget (below)" if r.no_winner
                       else "[red]no valid candidate")
                table.add_row(str(r.problem.seq_len), why, "", "", "", "", "", "")
                continue
            label = SearchView.short_label(w, r.default)
            if r.default_kept:
                label += " (default kept)"
            speedup = f"{r.speedup:.2f}x" if r.speedup else "-"
            table.add_row(
                str(r.problem.seq_len),
                label,
                f"{w.median_ms:.3f}",
                f"{w.prepare_ms:.3f}" if w.prepare_ms is not None else "-",
                f"{w.tflops:.1f}",
                speedup,
                f"{w.rel_rms:.2e}",
                f"{w.e2e_error:.4f} {w.e2e_data[:20]}" if w.e2e_error is not None else "-",
            )
        wide_console().print(table)
        for r in results:
            if r.no_winner:  # one unwrapped line each, for a reader and for grep
                print(f"s={r.problem.seq_len}: {r.no_winner}")
