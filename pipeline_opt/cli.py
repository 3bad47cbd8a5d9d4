"""The ``pipeline-opt`` command: demo | profile | tune | yolo | bench | doctor.

``profile`` and ``tune`` run on the user's own code through a factory ``module:function`` (or
``path/to/file.py:function``) that returns ``(loader, model)`` or ``(loader, model, step_fn)``.
Results go to stdout, logs and progress to stderr; bad input exits with status 2 and a message
that names the fix.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline_opt._core.log import enable_console_logging, get_logger
from pipeline_opt._version import __version__

log = get_logger("cli")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141


class CLIError(Exception):
    """A user-facing error: printed as ``pipeline-opt: error: <message>`` with exit status 2."""


def _out(text: str) -> None:
    sys.stdout.write(text.rstrip("\n") + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------------------------- factories


def load_factory(spec: str) -> Callable[..., Any]:
    """Import ``module:function`` or ``path/to/file.py:function`` and return the function."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise CLIError(f"factory {spec!r} must look like 'package.module:function' or 'path/to/file.py:function'")
    if target.endswith(".py") or os.sep in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise CLIError(f"factory file {target!r} does not exist (looked at {path})")
        sys.path.insert(0, str(path.parent))  # so the file's own imports of its siblings work
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[path.stem] = module  # workers started with spawn re-import it by this name
        mod_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise CLIError(f"cannot import {target!r} ({exc}); run from the folder that holds it or give a "
                           "path/to/file.py:function") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise CLIError(f"{target!r} has no function {name!r}")
    return fn


def parse_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """``["n=3", "name=x", "flag=True"]`` -> ``{"n": 3, "name": "x", "flag": True}`` (Python literals or strings)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise CLIError(f"--arg {item!r} must be KEY=VALUE with KEY a Python identifier")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def call_factory(spec: str, kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Call the factory and check it returned ``(loader, model[, step_fn])``."""
    built = load_factory(spec)(**kwargs)
    if not isinstance(built, (tuple, list)) or len(built) not in (2, 3):
        raise CLIError(f"factory {spec!r} returned {type(built).__name__}; it must return (loader, model) or "
                       "(loader, model, step_fn)")
    loader, model, step_fn = (*built, None) if len(built) == 2 else built
    if step_fn is not None and not callable(step_fn):
        raise CLIError(f"factory {spec!r} returned a step_fn of type {type(step_fn).__name__}, not a callable")
    return loader, model, step_fn


# ----------------------------------------------------------------------------------------------- commands


def _size(text: str) -> tuple[int, int]:
    w, sep, h = text.lower().partition("x")
    if not sep or not w.isdigit() or not h.isdigit():
        raise argparse.ArgumentTypeError(f"size {text!r} must be WIDTHxHEIGHT, e.g. 640x480")
    return int(w), int(h)


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeline_opt.demo import DemoConfig, run_demo

    cfg = DemoConfig(device=args.device, out=args.out, images=args.images, size=args.size, budget_s=args.budget,
                     batch_size=args.batch_size, steps=args.steps)
    result = run_demo(cfg)
    _out(result.table)
    _out(f"\nreport: {result.out / 'report.html'} (open it in a browser)\n"
         f"timeline: {result.out / 'trace.json'} (open in https://ui.perfetto.dev or chrome://tracing)\n"
         f"profiles: {result.out / 'baseline'} (before) and {result.out / 'best'} (after)")
    return EXIT_OK


def cmd_profile(args: argparse.Namespace) -> int:
    import pipeline_opt as po

    loader, model, step_fn = call_factory(args.factory, parse_kwargs(args.arg))
    report = po.profile(loader, model, step_fn=step_fn, steps=args.steps, warmup=args.warmup, device=args.device,
                        progress=True, trace_steps=args.trace_steps)
    _out(report.table())
    report.save(args.out)
    _out(f"\nreport: {args.out / 'report.html'}; timeline: {args.out / 'trace.json'} (open in https://ui.perfetto.dev)")
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    import pipeline_opt as po

    loader, model, step_fn = call_factory(args.factory, parse_kwargs(args.arg))
    result = po.autotune(loader, model, step_fn=step_fn, device=args.device, time_budget_s=args.budget,
                         gpu_transforms=not args.no_gpu_transforms, exact=args.exact)
    _out(result.table())
    result.save(args.out)
    _out(f"\nreport: {args.out / 'tune.html'}")
    _out(how_to_apply(result))
    return EXIT_OK


def how_to_apply(result: Any) -> str:
    """What to change in the user's code: the DataLoader arguments the tuner changed, then the other
    changes (not DataLoader arguments) with how to apply each, or ``result.loader`` in Python."""
    changed = result.dataloader_kwargs(changed_only=True)
    lines = [""]
    if changed:
        lines.append("set these DataLoader arguments: DataLoader(..., "
                     + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")")
        lines.append("  (the tuned DataLoader arguments in full: "
                     + ", ".join(f"{k}={v!r}" for k, v in result.dataloader_kwargs().items()) + ")")
    else:
        lines.append("no DataLoader argument changed")
    other = result.other_changes()
    if other:
        lines.append("other changes, not DataLoader arguments (in Python, po.autotune(loader, model).loader "
                     "applies them all):")
        lines += [f"  - {key}: {how}" for key, how in other.items()]
    return "\n".join(lines)


def cmd_yolo(args: argparse.Namespace) -> int:
    try:
        from pipeline_opt.integrations.ultralytics import cli_main
    except ImportError as exc:
        raise CLIError(f"the yolo command needs ultralytics ({exc}); install it with pip install "
                       "'pipeline-opt[yolo]'") from exc
    return int(cli_main(list(args.yolo_args)))


def cmd_doctor(args: argparse.Namespace) -> int:
    from pipeline_opt.doctor import run_doctor

    report = run_doctor()
    _out(json.dumps(report.to_dict(), indent=2) if args.json else report.table())
    return EXIT_OK


# Each committed run folder keeps its own ledger (benchmarks/results/<run>/ledger.jsonl, written by
# run_gpu.sh); there is no shared one to default to, so the ledger is named wherever one is read or written.
LEDGER_HINT = ("pass --ledger FILE: a run folder's benchmarks/results/<run>/ledger.jsonl, "
               "or a new .jsonl / .csv file to start one")


def _ledger_path(args: argparse.Namespace, what: str) -> Path:
    """``--ledger`` as a path; a :class:`CLIError` naming the fix when it was not given."""
    if args.ledger is None:
        raise CLIError(f"{what} needs a ledger: {LEDGER_HINT}")
    return Path(args.ledger)


def _existing_ledger(args: argparse.Namespace, what: str) -> Path:
    path = _ledger_path(args, what)
    if not path.is_file():
        raise CLIError(f"no ledger at {path}; record into it first "
                       f"(pipeline-opt bench --record RESULT.json --ledger {path})")
    return path


def _rows_of(source: str, args: argparse.Namespace) -> tuple[list, str]:
    """Rows named by a commit prefix in the ledger, or by a ledger / benchmark-result file."""
    from pipeline_opt.report import ledger

    path = Path(source)
    if path.is_file():
        if path.suffix in (".jsonl", ".csv"):
            rows = ledger.read(path)
            commits = list(dict.fromkeys(r.commit for r in rows))
            return (ledger.select(rows, commits[-1]) if commits else []), path.name
        return ledger.rows_from_result(json.loads(path.read_text())), path.name
    ledger_path = _existing_ledger(args, f"--compare {source!r} (no such file, so a commit)")
    rows = ledger.select(ledger.read(ledger_path), source)
    if not rows:
        raise CLIError(f"no rows for commit {source!r} in {ledger_path}; give a commit recorded there or a file")
    return rows, source


def cmd_bench(args: argparse.Namespace) -> int:
    from pipeline_opt.report import ledger

    if args.compare:
        (a, a_name), (b, b_name) = (_rows_of(s, args) for s in args.compare)
        comparisons = ledger.compare(a, b)
        _out(ledger.comparison_table(comparisons, a_name, b_name))
        regressed = [c for c in comparisons if c.regressed]
        if regressed:
            _out(f"\n{len(regressed)} configuration(s) regressed beyond noise")
            return EXIT_FAILED
        return EXIT_OK
    if args.record:
        ledger_path = _ledger_path(args, "--record")
        rows = []
        for p in args.record:
            if not Path(p).is_file():
                raise CLIError(f"benchmark result {p!r} does not exist")
            rows += ledger.rows_from_result(json.loads(Path(p).read_text()))
        ledger.append(rows, ledger_path)
        _out(f"appended {len(rows)} row(s) to {ledger_path}")
        return EXIT_OK
    if args.run:
        return _run_benchmark(args, _ledger_path(args, "--run"))
    rows = ledger.read(_existing_ledger(args, "listing the ledger"))
    _out(_ledger_tail(rows[-args.last:]))
    return EXIT_OK


def _run_benchmark(args: argparse.Namespace, ledger_path: Path) -> int:
    from pipeline_opt.report import ledger

    name = args.run if args.run.startswith("bench_") else f"bench_{args.run}"
    if not (Path("benchmarks") / f"{name}.py").is_file():
        raise CLIError(f"benchmarks/{name}.py not found; run from the repository root "
                       "(benchmarks: classification, yolo, transforms, overhead)")
    with tempfile.TemporaryDirectory(prefix="pipeline_opt_bench_") as tmp:
        out_dir = Path(args.out) if args.out else Path(tmp)
        cmd = [sys.executable, "-m", f"benchmarks.{name}", "--out", str(out_dir)]
        cmd += (["--quick"] if args.quick else []) + shlex.split(args.bench_args or "")
        log.info("running %s", " ".join(cmd))
        rc = subprocess.call(cmd)
        result = out_dir / f"{name}.json"
        if rc != 0 or not result.is_file():
            log.error("%s exited with status %d%s", name, rc, "" if result.is_file() else " and wrote no result")
            return EXIT_FAILED
        rows = ledger.rows_from_result(json.loads(result.read_text()))
    ledger.append(rows, ledger_path)
    _out(f"appended {len(rows)} row(s) of {name} to {ledger_path}")
    return EXIT_OK


def _ledger_tail(rows: Sequence[Any]) -> str:
    from pipeline_opt._core.grid import grid

    if not rows:
        return "the ledger is empty"
    table = [[r.commit[:10], r.date[:19], f"{r.benchmark}/{r.config}", f"{r.throughput:,.1f}",
              f"±{100 * r.spread:.0f}%", "-" if r.efficiency is None else f"{r.efficiency:.2f}"] for r in rows]
    return grid(["commit", "date", "configuration", "samples/s", "spread", "efficiency"], table)


# ----------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pipeline-opt`` (also used to render ``--help``)."""
    p = argparse.ArgumentParser(prog="pipeline-opt", description="Find out why a PyTorch training job leaves "
                                "its GPU idle, and fix the data-pipeline side.")
    p.add_argument("--version", action="version", version=f"pipeline-opt {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="profile, autotune and re-profile a synthetic JPEG pipeline on this machine")
    d.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    d.add_argument("--out", type=Path, default=Path("pipeline_opt_demo"), help="report folder (./pipeline_opt_demo)")
    d.add_argument("--images", type=int, default=None, help="dataset size (CPU 256, GPU 2048)")
    d.add_argument("--size", type=_size, default=None, help="image WIDTHxHEIGHT (CPU 640x480, GPU 1280x960)")
    d.add_argument("--budget", type=float, default=None, help="autotune seconds (CPU 40, GPU 90)")
    d.add_argument("--batch-size", type=int, default=None, help="batch size (CPU 8, GPU 128)")
    d.add_argument("--steps", type=int, default=None, help="measured steps per profile (CPU 16, GPU 30)")
    d.set_defaults(func=cmd_demo)

    for name, func, helptext in (("profile", cmd_profile, "profile your loader and model"),
                                 ("tune", cmd_tune, "autotune your loader for your model")):
        s = sub.add_parser(name, help=helptext, description=f"{helptext}. FACTORY is 'module:function' or "
                           "'path/to/file.py:function' returning (loader, model) or (loader, model, step_fn).")
        s.add_argument("factory", metavar="FACTORY")
        s.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                       help="keyword argument for the factory (repeatable; values are Python literals)")
        s.add_argument("--device", default=None, help="device of the model (default: where the model is)")
        s.add_argument("--out", type=Path, default=Path(f"pipeline_opt_{name}"),
                       help=f"folder for the reports (default ./pipeline_opt_{name})")
        if name == "profile":
            s.add_argument("--steps", type=int, default=30, help="measured steps (default 30)")
            s.add_argument("--warmup", type=int, default=5, help="discarded steps first (default 5)")
            s.add_argument("--trace-steps", type=int, default=10,
                           help="steps torch.profiler traces after the measured window (default 10; 0: none)")
        else:
            s.add_argument("--budget", type=float, default=60.0, help="tuning time budget in seconds (default 60)")
            s.add_argument("--no-gpu-transforms", action="store_true", help="never move transforms to the GPU")
            s.add_argument("--exact", action="store_true",
                           help="only changes that keep every sample bit-for-bit identical (no GPU resize, "
                                "no other JPEG decoder)")
        s.set_defaults(func=func)

    y = sub.add_parser("yolo", help="train / profile / tune an ultralytics YOLO model with the integration "
                       "(arguments after 'yolo' go to it; try 'pipeline-opt yolo --help')", add_help=False)
    y.set_defaults(func=cmd_yolo, yolo_args=[])

    b = sub.add_parser("bench", help="run or record benchmarks into the ledger; compare two commits")
    mode = b.add_mutually_exclusive_group()
    mode.add_argument("--run", metavar="NAME", help="run benchmarks/bench_NAME.py and append its rows")
    mode.add_argument("--record", nargs="+", metavar="RESULT.json", help="append benchmark result files")
    mode.add_argument("--compare", nargs=2, metavar=("A", "B"),
                      help="compare two commits (prefixes in the ledger) or files; exit 1 on a regression")
    b.add_argument("--ledger", default=None, metavar="FILE",
                   help="ledger file, .jsonl or .csv: required to list, --record, --run, and --compare a commit "
                        "(e.g. a run folder's benchmarks/results/<run>/ledger.jsonl)")
    b.add_argument("--quick", action="store_true", help="with --run: tiny sizes")
    b.add_argument("--bench-args", default="", help='with --run: extra arguments for the benchmark, e.g. --bench-args="--rounds 3"')
    b.add_argument("--out", default=None, help="with --run: keep the JSON result in this folder")
    b.add_argument("--last", type=int, default=20, help="rows shown when listing the ledger (default 20)")
    b.set_defaults(func=cmd_bench)

    doc = sub.add_parser("doctor", help="check this machine's data-pipeline set-up, with advice")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    doc.set_defaults(func=cmd_doctor)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pipeline-opt``; returns the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command_at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if command_at is not None and argv[command_at] == "yolo":
        # everything after 'yolo' belongs to the integration's own parser, options included
        args = parser.parse_args(argv[:command_at + 1])
        args.yolo_args = argv[command_at + 1:]
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    enable_console_logging(logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO)
    try:
        return int(args.func(args))
    except CLIError as exc:
        sys.stderr.write(f"pipeline-opt: error: {exc}\n")
        return EXIT_USAGE
    except (ValueError, TypeError, FileNotFoundError) as exc:
        if args.verbose:
            log.exception("%s failed", args.command)
        sys.stderr.write(f"pipeline-opt {args.command}: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("pipeline-opt: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly, as Unix tools do
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # the user's code or the run failed: one clear line, traceback with -v
        if args.verbose:
            log.exception("%s failed", args.command)
        sys.stderr.write(f"pipeline-opt {args.command}: failed: {type(exc).__name__}: {exc}"
                         f"{'' if args.verbose else ' (run with -v for the traceback)'}\n")
        return EXIT_FAILED


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit does not raise again on the
    closed pipe. A stdout without a file descriptor (a test's capture) is left as it is."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
