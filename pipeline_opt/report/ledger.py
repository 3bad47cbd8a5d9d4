"""The performance baseline ledger: one row per measured configuration of every benchmark run.

``pipeline-opt bench --ledger FILE`` appends the rows of a benchmark's JSON result to a ``.jsonl`` (or
``.csv``) ledger — each committed run folder keeps its own, ``benchmarks/results/<run>/ledger.jsonl`` —
keyed by commit, so a regression points at the
commit that caused it. :func:`compare` matches rows of two commits (or two files) by benchmark and
configuration and flags those whose throughput fell by more than the larger of their two spreads.

A benchmark result is a JSON object; the fields read are (all optional except a throughput)::

    {"benchmark": "bench_classification", "git_commit": "abc123", "date": "...",
     "model": "resnet50", "batch": 128, "resolution": 224, "ddp": false, "amp": "bf16",
     "rows": [{"name": "autotune", "throughput": 2500.0, "spread": 0.06, "gpu_util": 0.9,
               "step_time_s": 0.051, "top_cpu_op": "...", "top_cuda_op": "...", "efficiency": 0.6}, ...]}

``rows`` may also be called ``results`` or ``configs``; a row's fields override the top level's,
and a result without rows is one row itself.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import json
import math
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline_opt._core.grid import grid
from pipeline_opt._core.log import get_logger

log = get_logger("ledger")


_ALIASES = {
    "commit": ("commit", "git_commit", "git_sha"),
    "date": ("date", "timestamp", "time"),
    "benchmark": ("benchmark", "bench"),
    "config": ("config_name", "name", "label", "config"),
    "throughput": ("throughput", "img_per_s", "samples_per_s", "median"),
    "gpu_util": ("gpu_util", "gpu_utilisation", "gpu_utilization"),
    "step_time_s": ("step_time_s", "step_s"),
    "top_cpu_op": ("top_cpu_op", "top_cpu_hotspot"),
    "top_cuda_op": ("top_cuda_op", "top_gpu_op", "top_gpu_hotspot"),
    "resolution": ("resolution", "imgsz", "image_size"),
    "batch": ("batch", "batch_size"),
}
_ROW_LISTS = ("rows", "results", "configs")


@dataclass(frozen=True)
class LedgerRow:
    """One measured configuration of one benchmark run at one commit."""

    commit: str
    date: str
    benchmark: str
    config: str
    model: str = ""
    batch: int | None = None
    resolution: int | None = None
    ddp: bool = False
    amp: str = ""
    throughput: float = 0.0
    spread: float = 0.0  # relative (max - min) / median over the repeats
    gpu_util: float | None = None
    step_time_s: float | None = None
    top_cpu_op: str = ""
    top_cuda_op: str = ""
    efficiency: float | None = None

    @property
    def key(self) -> tuple:
        """What must match for two rows to be comparable (everything but the measurements)."""
        return (self.benchmark, self.config, self.model, self.batch, self.resolution, self.ddp, self.amp)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LedgerRow:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in names and v not in ("", None)}
        for k in ("batch", "resolution"):
            if k in values:
                values[k] = int(float(values[k]))
        for k in ("throughput", "spread", "gpu_util", "step_time_s", "efficiency"):
            if k in values:
                values[k] = float(values[k])
        if "ddp" in values:
            values["ddp"] = str(values["ddp"]).lower() in ("1", "true", "yes")
        for k in ("commit", "date", "benchmark", "config", "model", "amp", "top_cpu_op", "top_cuda_op"):
            values[k] = str(values.get(k, ""))
        return cls(**values)


COLUMNS = tuple(f.name for f in dataclasses.fields(LedgerRow))


def _pick(d: Mapping[str, Any], field: str) -> Any:
    for name in _ALIASES.get(field, (field,)):
        if name in d and d[name] is not None and not isinstance(d[name], (dict, list)):
            return d[name]
    return None


def git_commit(cwd: str | Path | None = None) -> str:
    """The short commit of the working tree (``unknown`` outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=10, check=True)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def rows_from_result(result: Mapping[str, Any], benchmark: str | None = None,
                     commit: str | None = None) -> list[LedgerRow]:
    """Ledger rows of one benchmark JSON result (see the module docstring for the fields read)."""
    if not isinstance(result, Mapping):
        raise TypeError(f"a benchmark result must be a JSON object, got {type(result).__name__}")
    rows = next((result[k] for k in _ROW_LISTS if isinstance(result.get(k), list)), None)
    entries = rows if rows is not None else [result]
    top = {f: _pick(result, f) for f in COLUMNS if f != "config"}
    top["benchmark"] = benchmark or top.get("benchmark") or "benchmark"
    top["commit"] = commit or top.get("commit") or git_commit()
    top["date"] = top.get("date") or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise TypeError(f"row {i} of the benchmark result is a {type(entry).__name__}, not an object")
        merged = {k: v for k, v in top.items() if v is not None}
        merged.update({f: v for f in COLUMNS if (v := _pick(entry, f)) is not None})
        merged.setdefault("config", str(i) if rows is not None else "default")
        if merged.get("throughput") is None:
            raise ValueError(f"row {merged['config']!r} of benchmark {merged['benchmark']!r} has no throughput; "
                             f"give it one of the fields {_ALIASES['throughput']}")
        out.append(LedgerRow.from_dict(merged))
    return out


def append(rows: Iterable[LedgerRow], path: str | Path) -> Path:
    """Append ``rows`` to the ledger at ``path`` (``.jsonl`` or ``.csv``, created if missing)."""
    path = Path(path)
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        new = not path.exists() or path.stat().st_size == 0
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                writer.writeheader()
            for r in rows:
                writer.writerow({k: ("" if v is None else v) for k, v in r.to_dict().items()})
    elif path.suffix == ".jsonl":
        with path.open("a") as f:
            for r in rows:
                f.write(json.dumps(r.to_dict()) + "\n")
    else:
        raise ValueError(f"ledger path {str(path)!r} must end in .jsonl or .csv")
    log.info("appended %d row(s) to %s", len(rows), path)
    return path


def read(path: str | Path) -> list[LedgerRow]:
    """All rows of a ledger file (``.jsonl`` or ``.csv``) in the order they were appended."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no ledger at {path}; run `pipeline-opt bench --record RESULT.json` first")
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            return [LedgerRow.from_dict(r) for r in csv.DictReader(f)]
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(LedgerRow.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{n} is not a ledger row ({exc})") from exc
    return rows


def select(rows: Sequence[LedgerRow], commit: str) -> list[LedgerRow]:
    """The latest row per configuration among ``rows`` whose commit starts with ``commit``."""
    latest: dict[tuple, LedgerRow] = {}
    for r in rows:
        if commit and r.commit and (r.commit.startswith(commit) or commit.startswith(r.commit)):
            latest[r.key] = r
    return list(latest.values())


@dataclass(frozen=True)
class Comparison:
    """One configuration measured in both A and B."""

    key: tuple
    before: float  # throughput in A
    after: float  # throughput in B
    change: float  # after / before - 1
    noise: float  # the larger of the two rows' relative spreads
    regressed: bool  # after is lower than before by more than the noise

    @property
    def label(self) -> str:
        benchmark, config, model, batch, resolution, ddp, amp = self.key
        extra = " ".join(str(x) for x in (model, batch and f"b{batch}", resolution and f"{resolution}px",
                                           ddp and "ddp", amp) if x)
        return f"{benchmark}/{config}" + (f" ({extra})" if extra else "")


def compare(a: Sequence[LedgerRow], b: Sequence[LedgerRow]) -> list[Comparison]:
    """Match A's and B's rows by configuration; flag a row when B lost more than the noise."""
    b_by_key = {r.key: r for r in b}
    out = []
    for ra in a:
        rb = b_by_key.get(ra.key)
        if rb is None or ra.throughput <= 0:
            continue
        noise = max(ra.spread, rb.spread)
        change = rb.throughput / ra.throughput - 1.0
        out.append(Comparison(ra.key, ra.throughput, rb.throughput, change, noise,
                              regressed=change < -noise and math.isfinite(change)))
    return out


def comparison_table(comparisons: Sequence[Comparison], a_name: str = "A", b_name: str = "B") -> str:
    """Text table of :func:`compare`'s output; regressions are marked ``REGRESSED``."""

    if not comparisons:
        return "no configuration was measured in both"
    rows = [[c.label, f"{c.before:,.1f}", f"{c.after:,.1f}", f"{100 * c.change:+.1f}%", f"±{100 * c.noise:.1f}%",
             "REGRESSED" if c.regressed else "ok"] for c in comparisons]
    return grid(["configuration", a_name, b_name, "change", "noise", "verdict"], rows)
