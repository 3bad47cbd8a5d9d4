"""Write ``benchmarks/RESULTS.md`` from every committed result JSON under ``benchmarks/results/``.

    python -m benchmarks.summarize                  # (re)write benchmarks/RESULTS.md
    python -m benchmarks.summarize --check          # exit 1 when the committed file is out of date
    python -m benchmarks.summarize --headline       # the README's headline table (links from the repo root)

One section per benchmark; in it one table per run folder
(``benchmarks/results/<date>-<commit7>-<bench>-<gpu>[-suffix]/``, :func:`benchmarks.harness.run_folder_name`),
oldest first, with the run's date, GPU, usable cores and commit, every row's median img/s, min..max,
spread and number of windows, and the ratio to the limit (or to the plain loop) that the JSON holds.
The ratios, targets and caveats of the JSON's ``summary`` follow each table. Keys that an older JSON
lacks show as ``-``. The table lines come from :func:`benchmarks.harness.markdown_table`, the same code
that writes each folder's ``results.md``.

:func:`headline` picks, for each workload of :data:`HEADLINES`, the latest run that measured its
baseline, tuned and limit rows; the README's headline table is :func:`headline_table` of it (a test
checks that the README holds it verbatim).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/summarize.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness as H  # noqa: E402

RESULTS_DIR = H.RESULTS_DIR
DEFAULT_OUT = H.REPO_ROOT / "benchmarks" / "RESULTS.md"
COMMIT_NOTE = "COMMIT_NOTE.md"  # a run folder's note, quoted in RESULTS.md under its table
README_LINK_PREFIX = "benchmarks/results/"  # the headline table's links, as seen from the repository root

# What each benchmark measures, one line (benchmarks/README.md has the details).
DESCRIPTIONS = {
    "bench_classification": "ResNet-50, 224 px, batch 128, bf16, channels_last, on 2048 JPEGs of 1280x960: "
                            "loader configurations and `po.autotune` against the same step on a "
                            "device-resident batch (the limit).",
    "bench_yolo": "YOLO11n, 640 px, batch 64, bf16, trainer-free ultralytics pipeline: the default loader "
                  "and the integration (tuned, GPU augmentation where it wins) against a replayed batch, "
                  "at all cores and at 8 cores.",
    "bench_yolo_trainer": "ultralytics' own `YOLO(...).train` with `attach(...)`, YOLO11n 640 px batch 64 "
                          "bf16, 8 workers: CPU augmentation, GPU augmentation and shared slots against the "
                          "trainer on one replayed batch.",
    "bench_yolo_gap": "Diagnosis rows that separate the causes of the gap between ultralytics' loader and "
                      "the replayed-batch limit.",
    "bench_yolo_decide": "The GPU-augmentation decision (A B A B) repeated on the trainer-free YOLO pipeline.",
    "bench_transforms": "GPU batch transforms against the CPU work they replace; rows in images per second.",
    "bench_overhead": "The profiler's cost: the training loop with and without profiling.",
    "bench_batch_size": "`po.max_batch_size` and ultralytics' AutoBatch against the true largest batch a real "
                        "training step runs at (ResNet-50 224 px and YOLO11n 640 px, bf16).",
    "yolo_worker_stages": "CPU only: milliseconds per sample of each stage of an ultralytics training sample, "
                          "and the images per second a DataLoader of it delivers.",
}
ORDER = ("bench_classification", "bench_yolo_trainer", "bench_yolo", "bench_yolo_gap", "bench_yolo_decide",
         "bench_transforms", "bench_overhead", "bench_batch_size", "yolo_worker_stages")

# Summary keys that hold per-row ratios to the limit (shown in the tables' ratio column).
_VS_LIMIT_KEYS = ("vs limit", "vs_limit")
# Summary parts that are logs, traces or per-row dicts of something other than ratios.
_SKIP = frozenset({"parts", "autotune_info", "torch_profile", "timecourse", "decisions", "settle", "orders",
                   "busy cores", "train thread CPU s/step", "targets", "caveats", "rows_run", "kept",
                   *_VS_LIMIT_KEYS})
_STAGE_COLUMNS = (("getitem", "dataset[i] ms"), ("load_image", "load_image ms"), ("pre:Mosaic", "Mosaic ms"),
                  ("pre:RandomPerspective", "warp ms"), ("Format", "Format ms"),
                  ("loader_img_s", "DataLoader img/s"))


# ---------------------------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class Run:
    """One result JSON of one run folder."""

    folder: Path
    result: dict[str, Any]

    @property
    def benchmark(self) -> str:
        return str(self.result.get("benchmark") or "unknown")

    @property
    def env(self) -> dict[str, Any]:
        env = self.result.get("env")
        return env if isinstance(env, dict) else {}

    @property
    def date(self) -> str:
        """ISO date and time of the run; the folder's ``YYYYMMDD`` prefix when the JSON has none."""
        date = self.result.get("date") or self.env.get("date")
        if date:
            return str(date)
        prefix = self.folder.name[:8]
        return f"{prefix[:4]}-{prefix[4:6]}-{prefix[6:8]}" if prefix.isdigit() else "-"

    @property
    def commit(self) -> str:
        return str(self.result.get("commit") or self.env.get("commit") or "-")[:10]

    @property
    def gpu(self) -> str:
        gpu = self.env.get("hardware", {}).get("gpu", {})
        if gpu.get("name"):
            return str(gpu["name"])
        return "no GPU" if gpu.get("available") is False else "-"

    @property
    def cores(self) -> int | None:
        cores = self.env.get("hardware", {}).get("usable_cores")
        return cores if isinstance(cores, int) else None

    def row(self, name: str) -> dict[str, Any] | None:
        """The measured row called ``name`` (names compared without surrounding spaces)."""
        for r in self.result.get("rows", []):
            if str(r.get("name", "")).strip() == name:
                return r
        return None

    def sort_key(self) -> tuple[str, str]:
        return self.date, self.folder.name


def load_runs(results_dir: Path = RESULTS_DIR) -> list[Run]:
    """Every result JSON of every run folder under ``results_dir``: the harness's ``bench_*.json``
    (:func:`benchmarks.harness.load_results`) and the other JSON files (``yolo_worker_stages.json``)."""
    runs = []
    for folder in sorted(p for p in Path(results_dir).iterdir() if p.is_dir()):
        runs += [Run(folder, res) for res in H.load_results(folder)]
        for path in sorted(folder.glob("*.json")):
            if not path.name.startswith("bench_"):
                data = json.loads(path.read_text())
                if isinstance(data, dict):
                    runs.append(Run(folder, {"benchmark": path.stem, **data}))
    return runs


# ---------------------------------------------------------------------------------------------- folder names

_FOLDER_RE = re.compile(r"(?P<date>\d{8})-(?P<commit>[0-9a-f]{7}|unknown)-(?P<rest>[a-z0-9][a-z0-9+-]*)")


def naming_problems(results_dir: Path = RESULTS_DIR) -> list[str]:
    """What in ``results_dir`` breaks the scheme of :func:`benchmarks.harness.run_folder_name`: entries
    that are not folders, code in a folder (it belongs in ``benchmarks/probes/``), and names that are not
    ``<YYYYMMDD>-<commit7>-<bench>[-<n>cores]-<gpu>[-suffix]`` with the bench, usable cores, GPU and date
    that the folder's JSON records (a folder without JSON only needs the pattern)."""
    problems = []
    by_folder: dict[str, list[Run]] = {}
    for run in load_runs(results_dir):
        by_folder.setdefault(run.folder.name, []).append(run)
    for path in sorted(Path(results_dir).iterdir()):
        name = path.name
        if not path.is_dir():
            problems.append(f"{name}: not a run folder (results/ holds one folder per run)")
            continue
        problems += [f"{name}: code in a results folder, move {p.relative_to(path)} to benchmarks/probes/"
                     for p in sorted(path.rglob("*.py"))]
        match = _FOLDER_RE.fullmatch(name)
        if not match:
            problems.append(f"{name}: not <YYYYMMDD>-<commit7>-<bench>-<gpu>[-suffix]")
            continue
        runs = by_folder.get(name, [])
        if not runs:
            continue
        expected = f"{match['date']}-{match['commit']}-{H.bench_tag(r.benchmark for r in runs)}"
        gpus = {H.gpu_tag(r.env) for r in runs if (r.env.get("hardware") or {}).get("gpu")}
        gpu = gpus.pop() if len(gpus) == 1 else None
        pattern = re.escape(expected) + r"(?:-(?P<cores>\d+)cores)?-" \
            + (re.escape(gpu) if gpu else "[a-z0-9]+") + r"(?:-[a-z0-9]+)?"
        found = re.fullmatch(pattern, name)
        hardware = runs[0].env.get("hardware") or {}
        usable, total = hardware.get("usable_cores"), hardware.get("cpu_count")
        dates = {r.date[:10].replace("-", "") for r in runs if r.date != "-"}
        if not found:
            problems.append(f"{name}: its JSON says {expected}[-<n>cores]-{gpu or '<gpu>'}[-suffix]")
        elif found["cores"] and int(found["cores"]) != usable:
            problems.append(f"{name}: the JSON ran on {usable} usable cores")
        elif not found["cores"] and isinstance(usable, int) and isinstance(total, int) and usable < total:
            problems.append(f"{name}: {usable} of {total} cores usable, so {expected}-{usable}cores-...")
        elif dates and dates != {match["date"]}:
            problems.append(f"{name}: the JSON's date is {', '.join(sorted(dates))}")
    return problems


# ---------------------------------------------------------------------------------------------- tables


def _ratio_cell(summary_vs_limit: dict[str, Any]):
    """The ratio column: the summary's per-row ratio to the limit, else the row's ``efficiency``
    (throughput / limit), else a ``vs_<reference>`` value of the row."""

    def cell(row: dict[str, Any]) -> str:
        name = str(row.get("name", "")).strip()
        value = summary_vs_limit.get(name)
        if _is_number(value):
            return f"{value:.2f}x limit"
        if _is_number(row.get("efficiency")):
            return f"{row['efficiency']:.2f}x limit"
        for key, value in row.items():
            if key.startswith("vs_") and _is_number(value):
                return f"{value:.2f}x {key[3:]}"
        return "-"

    return cell


def summary_ratios(summary: dict[str, Any], prefix: str = "") -> list[str]:
    """``name value`` for every ratio in ``summary`` (keys with ``vs``, `` / `` or ``speedup``), nested
    parts included; logs, traces, targets and the per-row ratios of the table are left out."""
    found = []
    for key, value in summary.items():
        if key in _SKIP or key.startswith("target"):
            continue
        if isinstance(value, dict):
            found += summary_ratios(value, f"{prefix}{key}: ")
        elif _is_number(value) and _is_ratio_name(key):
            found.append(f"{prefix}{key} {_ratio(value)}")
    return found


def _ratio(value: float) -> str:
    """Two decimals; two significant digits for ratios below 0.1 (overheads of a fraction of a percent)."""
    return f"{value:.2f}" if value == 0 or abs(value) >= 0.1 else f"{value:.2g}"


def _is_ratio_name(key: str) -> bool:
    k = key.lower()
    return "_vs_" in k or " vs " in k or " / " in k or "speedup" in k or k.endswith("_vs_stock")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_block(run: Run, link: str) -> list[str]:
    """The Markdown of one run: heading with date and folder link, machine line, table, ratios, notes."""
    out = [f"### {run.date[:10]} · [{run.folder.name}]({link})", ""]
    cores = "-" if run.cores is None else str(run.cores)
    versions = run.env.get("versions", {})
    torch_version = versions.get("torch") if isinstance(versions, dict) else None
    out.append(f"{run.gpu} · {cores} usable cores · commit `{run.commit}` · {run.date}"
               + (f" · torch {torch_version}" if torch_version else ""))
    out.append("")
    if run.benchmark == "yolo_worker_stages":
        out += _stages_table(run.result)
        out.append("")
        return out
    summary = run.result.get("summary")
    summary = summary if isinstance(summary, dict) else {}
    vs_limit = next((summary[k] for k in _VS_LIMIT_KEYS if isinstance(summary.get(k), dict)), {})
    out += H.markdown_table(run.result, extra=("ratio", _ratio_cell(vs_limit)))
    ratios = summary_ratios(summary)
    if ratios:
        out += ["", "Ratios in the summary: " + " · ".join(ratios)]
    notes = H.markdown_notes(summary)
    if notes:
        out += ["", *notes]
    out += _commit_note(run.folder)
    out.append("")
    return out


def _commit_note(folder: Path) -> list[str]:
    """The run folder's ``COMMIT_NOTE.md`` (what a missed target's trace showed, what a run's
    numbers do not say by themselves), quoted under its table; nothing when there is none."""
    path = folder / COMMIT_NOTE
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8").strip()
    return ["", *(f"> {line}".rstrip() for line in text.splitlines())] if text else []


def _stages_table(result: dict[str, Any]) -> list[str]:
    """``yolo_worker_stages.json``: one row per variant, the medians of its runs."""
    medians = result.get("medians_ms")
    if not isinstance(medians, dict) or not medians:
        return ["(no medians in this JSON)"]
    runs = result.get("runs") if isinstance(result.get("runs"), dict) else {}
    lines = ["| variant | " + " | ".join(h for _, h in _STAGE_COLUMNS) + " | runs |",
             "|---|" + "---:|" * (len(_STAGE_COLUMNS) + 1)]
    for variant, values in medians.items():
        values = values if isinstance(values, dict) else {}
        cells = [H.num_cell(values.get(key), ".0f" if key == "loader_img_s" else ".2f") for key, _ in _STAGE_COLUMNS]
        n = len(runs.get(variant, [])) if isinstance(runs.get(variant), list) else None
        lines.append(f"| {variant} | " + " | ".join(cells) + f" | {H.num_cell(n, 'd')} |")
    return lines


# ---------------------------------------------------------------------------------------------- headline


@dataclass(frozen=True)
class HeadlineSpec:
    """One row of the README's headline table: which benchmark, which rows, which core setting."""

    workload: str
    benchmark: str
    baseline: str
    tuned: str
    limit: str
    cores: int | None = None


HEADLINES = (
    HeadlineSpec("ResNet-50, JPEG folder (Resize, ToTensor, Normalize): `po.autotune` vs `num_workers=4`",
                 "bench_classification", "default (nw=4, CPU transforms)", "autotune",
                 "limit (device-resident replay)"),
    HeadlineSpec("ResNet-50, JPEG folder, random training Compose (RandomResizedCrop, flip, ToTensor, Normalize): "
                 "`po.autotune` vs `num_workers=4`",
                 "bench_classification_train", "default (nw=4, CPU transforms)", "autotune",
                 "limit (device-resident replay)"),
    HeadlineSpec("YOLO11n `model.train`: `attach` GPU HSV/flip vs CPU augmentation",
                 "bench_yolo_trainer", "trainer, CPU augmentation", "trainer, GPU HSV/flip",
                 "limit: trainer on one replayed batch", cores=16),
    HeadlineSpec("YOLO11n `model.train`: `attach` GPU HSV/flip + shared slots vs CPU augmentation",
                 "bench_yolo_trainer", "trainer, CPU augmentation", "trainer, GPU HSV/flip + shared slots",
                 "limit: trainer on one replayed batch", cores=16),
    HeadlineSpec("YOLO11n `model.train`: `attach` GPU HSV/flip vs CPU augmentation",
                 "bench_yolo_trainer", "trainer, CPU augmentation", "trainer, GPU HSV/flip",
                 "limit: trainer on one replayed batch", cores=8),
    HeadlineSpec("YOLO11n `model.train`: `attach` GPU HSV/flip + shared slots vs CPU augmentation",
                 "bench_yolo_trainer", "trainer, CPU augmentation", "trainer, GPU HSV/flip + shared slots",
                 "limit: trainer on one replayed batch", cores=8),
)


@dataclass(frozen=True)
class HeadlineRow:
    spec: HeadlineSpec
    run: Run
    baseline: float
    tuned: float
    limit: float
    windows: int | None  # the fewest windows of the three rows

    @property
    def tuned_vs_baseline(self) -> float:
        return self.tuned / self.baseline

    @property
    def tuned_vs_limit(self) -> float:
        return self.tuned / self.limit


def _median(row: dict[str, Any] | None) -> float | None:
    if row is None:
        return None
    value = (row.get("stats") or {}).get("median", row.get("throughput"))
    return float(value) if _is_number(value) and value > 0 else None


def headline(runs: Sequence[Run], specs: Sequence[HeadlineSpec] = HEADLINES) -> list[HeadlineRow]:
    """For each spec, the latest run of its benchmark (at its core count) that measured all three rows."""
    out = []
    for spec in specs:
        candidates = [r for r in runs if r.benchmark == spec.benchmark
                      and (spec.cores is None or r.cores == spec.cores)]
        for run in sorted(candidates, key=Run.sort_key, reverse=True):
            rows = [run.row(name) for name in (spec.baseline, spec.tuned, spec.limit)]
            medians = [_median(r) for r in rows]
            if all(m is not None for m in medians):
                ns = [(r.get("stats") or {}).get("n") for r in rows]
                windows = min(ns) if all(_is_number(n) for n in ns) else None
                out.append(HeadlineRow(spec, run, *medians, windows=windows))
                break
    return out


def _short_gpu(name: str) -> str:
    parts = name.replace("NVIDIA ", "").split()
    return parts[0] if parts else name


def headline_table(rows: Sequence[HeadlineRow], link_prefix: str) -> str:
    """The headline rows as a Markdown table; ``link_prefix`` leads to the results folders."""
    lines = ["| workload | GPU, cores | baseline img/s | tuned img/s | limit img/s | tuned / baseline "
             "| tuned / limit | windows | date | results |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for h in rows:
        cores = "-" if h.run.cores is None else str(h.run.cores)
        lines.append(
            f"| {h.spec.workload} | {_short_gpu(h.run.gpu)}, {cores} | {h.baseline:,.0f} | {h.tuned:,.0f} | "
            f"{h.limit:,.0f} | {h.tuned_vs_baseline:.2f}x | {h.tuned_vs_limit:.2f}x | {H.num_cell(h.windows, 'd')} | "
            f"{h.run.date[:10]} | [{h.run.folder.name}]({link_prefix}{h.run.folder.name}/) |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- document


HEADER = """# Benchmark results

Generated by `python -m benchmarks.summarize` from the JSON in `benchmarks/results/`; do not edit it by
hand. After committing a new results folder, run that command again (`--check` tells whether this file
is current; `tests/test_summarize.py` runs it).

Each table is one run folder: the median images per second of each row over its interleaved windows
(`n`), the range of those windows, the spread `(max - min) / median`, and the ratio to the run's limit
(the same step on data already on the device) where the JSON has one. Only numbers of one run compare:
runs differ in machine, GPU, usable cores and day, and the shared GPU machine's run-to-run noise
reached ±20% for one configuration. How each benchmark measures: [README.md](README.md).
"""


def render(runs: Sequence[Run], out_path: Path, results_dir: Path) -> str:
    """The whole document; links are relative to ``out_path``'s folder."""
    rel = Path(os.path.relpath(Path(results_dir).resolve(), Path(out_path).resolve().parent)).as_posix()
    prefix = "" if rel == "." else rel.rstrip("/") + "/"
    by_bench: dict[str, list[Run]] = {}
    for run in runs:
        by_bench.setdefault(run.benchmark, []).append(run)
    names = [b for b in ORDER if b in by_bench] + sorted(b for b in by_bench if b not in ORDER)
    out = [HEADER, "## Headline", "",
           "The latest run of each workload that measured its baseline, tuned and limit rows "
           "(the README's table):", "",
           headline_table(headline(runs), prefix), "", "## Contents", ""]
    out += [f"- [{b}](#{b}) ({len(by_bench[b])} run{'s' if len(by_bench[b]) != 1 else ''})" for b in names]
    for bench in names:
        out += ["", f"## {bench}", ""]
        if bench in DESCRIPTIONS:
            out += [DESCRIPTIONS[bench], ""]
        for run in sorted(by_bench[bench], key=Run.sort_key):
            out += run_block(run, f"{prefix}{run.folder.name}/")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.summarize", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Markdown file (default benchmarks/RESULTS.md)")
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help="the folder of run folders")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs from what "
                   "would be written, or a run folder's name breaks the scheme")
    p.add_argument("--headline", action="store_true", help="print the README's headline table and exit")
    args = p.parse_args(argv)
    runs = load_runs(args.results)
    if args.headline:
        print(headline_table(headline(runs), README_LINK_PREFIX))
        return 0
    text = render(runs, args.out, args.results)
    problems = naming_problems(args.results)
    for problem in problems:
        print(f"results/{problem}", file=sys.stderr)
    if args.check:
        current = args.out.read_text() if args.out.is_file() else None
        if current != text:
            print(f"{args.out} is out of date: run python -m benchmarks.summarize", file=sys.stderr)
            return 1
        if problems:
            print(f"{len(problems)} run folder name problem(s): see benchmarks/README.md, Results", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date ({len(runs)} result files)")
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(runs)} result files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
