"""Plain-text tables of profile reports and tuning results (terminal, summary.txt, tune.txt).

Every function accepts the result object (``ProfileReport`` / ``TuneResult``) or its ``to_dict()``
form, so a saved ``report.json`` renders the same way as a live result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline_opt._core.grid import grid
from pipeline_opt.tune.ab import noise_text
from pipeline_opt.tune.exactness import DECODE_MAX_ERROR, DECODE_MEAN_ERROR, PixelChange
from pipeline_opt.tune.result import trial_spread

_MS = 1e3
_MB = 1 / (1024 * 1024)


def as_dict(obj: Any) -> dict[str, Any]:
    """The dict form of a result: ``obj.to_dict()`` for result objects, ``obj`` for mappings."""
    if isinstance(obj, Mapping):
        return dict(obj)
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"expected a ProfileReport/TuneResult or its to_dict() form, got {type(obj).__name__}")


def _pct(frac: float | None) -> str:
    return "n/a" if frac is None else f"{100 * frac:.0f}%"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * _MS:.1f} ms"


def limit_unreliable(d: Mapping[str, Any]) -> bool:
    """Whether the loader measured faster than the device-resident limit: a limit is an upper bound,
    so that limit run was disturbed (or too short) and an efficiency above 1.0x would be a wrong claim."""
    eff = d.get("efficiency")
    return eff is not None and eff > 1.0


def efficiency_short(d: Mapping[str, Any]) -> str:
    """``0.25x`` of the limit; ``n/a`` when it was not measured or not measured reliably."""
    if limit_unreliable(d):
        return "n/a (limit unreliable)"
    return "n/a" if d.get("efficiency") is None else f"{d['efficiency']:.2f}x"


def _efficiency(d: Mapping[str, Any]) -> str:
    eff, limit = d.get("efficiency"), d.get("limit_throughput")
    if eff is None:
        return "n/a (limit not measured)"
    if limit_unreliable(d):
        return (f"n/a: the limit could not be measured reliably (the loader measured {d['throughput']:,.1f} "
                f"samples/s, above the {limit:,.1f} samples/s the step reached on a device-resident batch)")
    return f"{eff:.2f}x of the limit ({limit:,.1f} samples/s on a device-resident batch)" if limit else f"{eff:.2f}x"


def format_config(config: Mapping[str, Any] | None) -> str:
    """``num_workers=4 pin_memory=True ... gpu_transforms=[Normalize]`` on one line."""
    if not config:
        return "-"
    parts = []
    for k, v in config.items():
        if isinstance(v, (list, tuple)):
            v = "[" + ",".join(map(str, v)) + "]"
        parts.append(f"{k}={v}")
    return " ".join(parts)


def config_change(config: Mapping[str, Any], original: Mapping[str, Any]) -> str:
    """Only the settings of ``config`` that differ from ``original`` (``as given`` when none do)."""
    changed = {k: v for k, v in config.items() if k not in original or original[k] != v}
    return format_config(changed) if changed else "as given"


def profile_table(report: Any) -> str:
    """The full text summary of one profile: headline numbers, diagnosis, workers, top ops."""
    d = as_dict(report)
    n_steps = len(d.get("steps") or ())
    lines = [
        f"pipeline_opt profile  device={d.get('device', '?')}  batch={d.get('batch_size', '?')}  "
        f"measured steps={n_steps}" + (f" (torch.profiler traced the last {d['traced_steps']})"
                                       if d.get("traced_steps") and d["traced_steps"] < n_steps else ""),
        f"  loader      {format_config(d.get('loader_config'))}",
        f"  throughput  {d['throughput']:,.1f} samples/s",
        f"  step time   {_ms(d['step_time_s'])} median   (compute {_ms(d.get('compute_time_s'))})",
        f"  data wait   {_pct(d['data_wait_frac'])} of step time",
        f"  GPU idle    {_pct(d.get('gpu_idle_frac'))}" + ("  (CPU run)" if d.get("gpu_idle_frac") is None else ""),
        f"  efficiency  {_efficiency(d)}",
        *([f"  sync        {_pct(d['sync_frac'])} of the window in host-device syncs / collectives"]
          if d.get("sync_frac") else []),
        f"  batch CPU   {_ms(d.get('batch_cpu_s'))} of worker time per batch (collate {_ms(d.get('collate_s'))})",
        "",
        f"bottleneck: {str(d['bottleneck']).upper()}",
    ]
    lines += [f"  - {e}" for e in d.get("evidence") or ()]
    recs = d.get("recommendations") or ()
    if recs:
        lines += ["", "recommendations:"] + [f"  {i}. {r}" for i, r in enumerate(recs, 1)]
    workers = group_workers(d.get("workers") or ())
    if workers:
        lines += ["", workers_title(workers) + ":", _workers_grid(workers)]
    for key, title in (("top_cpu_ops", "top CPU ops (self time)"), ("top_cuda_ops", "top CUDA ops (self time)")):
        ops = d.get(key) or ()
        if ops:
            lines += ["", f"{title}:", _ops_grid(ops)]
    return "\n".join(lines)


def transform_names(workers: Sequence[Mapping[str, Any]]) -> list[str]:
    """Transform names across workers, costliest first (by mean seconds per sample)."""
    totals: dict[str, float] = {}
    for w in workers:
        for name, s in (w.get("transform_s") or {}).items():
            totals[name] = totals.get(name, 0.0) + float(s)
    return sorted(totals, key=lambda k: -totals[k])


_MAX_TRANSFORM_COLUMNS = 6


def group_workers(workers: Sequence[Any]) -> list[dict[str, Any]]:
    """One entry per worker id (the main process first), however many processes played it.

    Without ``persistent_workers`` the DataLoader starts new worker processes every epoch, so a
    profile holds several processes with the same worker id; listing each as its own "worker 0"
    reads like duplicated workers. Each group sums samples, batches and collate seconds, weights
    the per-sample means (and CPU%) by samples, keeps the largest RSS, and counts the processes:
    ``processes`` (1 + respawns) and ``pids``. ``collate_ms_per_batch`` is collate seconds per batch.
    """
    groups: dict[int, list[Mapping[str, Any]]] = {}
    for w in workers:
        if dataclasses.is_dataclass(w) and not isinstance(w, type):
            w = dataclasses.asdict(w)
        groups.setdefault(int(w.get("worker_id", 0)), []).append(w)
    out = []
    for wid in sorted(groups):
        procs = groups[wid]
        samples = sum(int(p.get("samples") or 0) for p in procs)
        batches = sum(int(p.get("batches") or 0) for p in procs)

        def weighted(key: str, procs: list[Mapping[str, Any]] = procs, samples: int = samples) -> float:
            if samples > 0:
                return sum(float(p.get(key) or 0.0) * int(p.get("samples") or 0) for p in procs) / samples
            return sum(float(p.get(key) or 0.0) for p in procs) / len(procs)

        names = {n for p in procs for n in (p.get("transform_s") or {})}
        transform_s = {}
        for n in names:
            have = [p for p in procs if n in (p.get("transform_s") or {})]
            n_samples = sum(int(p.get("samples") or 0) for p in have)
            transform_s[n] = (sum(p["transform_s"][n] * int(p.get("samples") or 0) for p in have) / n_samples
                              if n_samples else sum(p["transform_s"][n] for p in have) / len(have))
        collate = sum(float(p.get("collate_s") or 0.0) for p in procs)
        out.append({
            "worker_id": wid, "pid": procs[0].get("pid"), "pids": [p.get("pid") for p in procs],
            "processes": len(procs), "samples": samples, "batches": batches,
            "mean_sample_s": weighted("mean_sample_s"), "cpu_percent": weighted("cpu_percent"),
            "rss_bytes": max(int(p.get("rss_bytes") or 0) for p in procs), "collate_s": collate,
            "collate_ms_per_batch": collate / batches * _MS if batches else None,
            "busy_s": sum(float(p.get("busy_s") or 0.0) for p in procs), "transform_s": transform_s,
        })
    return out


def workers_title(groups: Sequence[Mapping[str, Any]]) -> str:
    """``workers (2)``, or ``workers (2; 6 processes: respawned each epoch, ...)`` when they were."""
    n = sum(1 for g in groups if g["worker_id"] >= 0)
    title = f"workers ({n})" if n else "loader work in the main process"
    processes = sum(g["processes"] for g in groups if g["worker_id"] >= 0)
    if processes > n:
        title = (f"workers ({n}; {processes} processes: the DataLoader started new ones each epoch, "
                 "persistent_workers=True keeps them)")
    return title


def _workers_grid(workers: Sequence[Mapping[str, Any]]) -> str:
    names = transform_names(workers)
    shown, rest = names[:_MAX_TRANSFORM_COLUMNS], names[_MAX_TRANSFORM_COLUMNS:]
    respawned = any(w.get("processes", 1) > 1 for w in workers)
    headers = (["worker", "pid"] + (["processes"] if respawned else [])
               + ["samples", "ms/sample", "cpu%", "rss MB", "collate ms/batch"] + [f"{n} ms/sample" for n in shown])
    if rest:
        headers.append(f"{len(rest)} others ms/sample")
    rows = []
    for w in workers:
        wid = "main" if w.get("worker_id", 0) < 0 else w.get("worker_id")
        ts = w.get("transform_s") or {}
        per_batch = w.get("collate_ms_per_batch")
        row = ([wid, w.get("pid")] + ([w.get("processes", 1)] if respawned else [])
               + [w.get("samples"), f"{w.get('mean_sample_s', 0.0) * _MS:.2f}",
                  f"{w.get('cpu_percent', 0.0):.0f}", f"{w.get('rss_bytes', 0) * _MB:.0f}",
                  "-" if per_batch is None else f"{per_batch:.2f}"]
               + [f"{ts[n] * _MS:.2f}" if n in ts else "-" for n in shown])
        if rest:
            row.append(f"{sum(ts.get(n, 0.0) for n in rest) * _MS:.2f}")
        rows.append(row)
    return grid(headers, rows)


def _ops_grid(ops: Sequence[Mapping[str, Any]]) -> str:
    rows = [[o["name"][:60], o.get("calls", 0), f"{o.get('self_cpu_s', 0.0) * _MS:.2f}",
             f"{o.get('self_cuda_s', 0.0) * _MS:.2f}"] for o in ops]
    return grid(["op", "calls", "self CPU ms", "self CUDA ms"], rows)


# The tuner's own knobs as a loader runs before any tuning (what its loader_config does not list):
# a config holding these values changed nothing.
_AS_GIVEN: dict[str, Any] = {"gpu_transforms": [], "decode": "pil", "draft_decode": False, "shared_slots": False,
                              "decode_thread": False}


def before_after_table(before: Any, after: Any, config: Mapping[str, Any] | None = None,
                       original_config: Mapping[str, Any] | None = None, *, speedup: float | None = None,
                       trial_throughput: tuple[float, float] | None = None) -> str:
    """Two profiles side by side (throughput, step time, data wait, GPU idle, efficiency) and the settings.

    With ``speedup`` (a tuning result's), the first row is the tuning trials' pooled throughput
    (``trial_throughput``: before, after) with that speedup as the only ratio in the table; the
    profiles' own throughputs follow without one (two short runs, for the breakdown: their ratio is
    a second, noisier figure that would contradict the first). Without it, the profiles' ratios.
    """
    b, a = as_dict(before), as_dict(after)

    def ratio(x: float | None, y: float | None) -> str:
        return f"{y / x:.2f}x" if x and y is not None else "-"

    if speedup is None:
        head = [["throughput (samples/s)", f"{b['throughput']:,.1f}", f"{a['throughput']:,.1f}",
                 ratio(b["throughput"], a["throughput"])],
                ["step time", _ms(b["step_time_s"]), _ms(a["step_time_s"]), ratio(b["step_time_s"], a["step_time_s"])]]
    else:
        tb, ta = trial_throughput if trial_throughput and all(trial_throughput) else (None, None)
        head = [["throughput, tuning trials (samples/s)", "-" if tb is None else f"{tb:,.1f}",
                 "-" if ta is None else f"{ta:,.1f}", f"{speedup:.2f}x"],
                ["throughput, one short profile each", f"{b['throughput']:,.1f}", f"{a['throughput']:,.1f}", ""],
                ["step time (profile median)", _ms(b["step_time_s"]), _ms(a["step_time_s"]), ""]]
    rows = head + [
        ["data wait", _pct(b["data_wait_frac"]), _pct(a["data_wait_frac"]), ""],
        ["GPU idle", _pct(b.get("gpu_idle_frac")), _pct(a.get("gpu_idle_frac")), ""],
        ["efficiency vs limit", efficiency_short(b), efficiency_short(a), ""],
        ["bottleneck", b["bottleneck"], a["bottleneck"], ""],
    ]
    if speedup is not None and unchanged(config, original_config or b.get("loader_config")):
        rows = [[label, before_cell, "(same loader)", "-" if i == 0 else ""]
                for i, (label, before_cell, _, _) in enumerate(rows)]  # one profile, not two that agree
    out = [grid(["", "before", "after", "change"], rows)]
    original = dict(original_config or b.get("loader_config") or {})
    if config:
        out.append("")
        out.append("  settings:")
        kw = max(len(str(k)) for k in config)
        ow = max(len(_short(original.get(k, _AS_GIVEN.get(k, "-")))) for k in config)
        for k, v in config.items():
            old = original.get(k, _AS_GIVEN.get(k, "-"))
            mark = "" if old == v else "   (changed)"
            out.append(f"    {k:<{kw}}  {_short(old):<{ow}} -> {_short(v)}{mark}")
    return "\n".join(out)


def unchanged(config: Mapping[str, Any] | None, original: Mapping[str, Any] | None) -> bool:
    """Whether a tuned ``config`` is the loader as given (``original``, the tuner's own knobs at their defaults)."""
    if not config:
        return False
    original = dict(original or {})
    return all(original.get(k, _AS_GIVEN.get(k, "-")) == v for k, v in config.items())


def _short(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(str, v)) + "]" if v else "[]"
    return str(v)


def pixel_change_lines(d: Mapping[str, Any]) -> list[str]:
    """What the tuned loader does to the samples (a ``TuneResult`` or its dict): the first line says
    whether they are bit-for-bit the original ones, then one line per change that is not, with its
    measured mean and max error in 1/255 units. Empty for results that predate the field."""

    exactness = d.get("exactness")
    if exactness is None:
        return []
    if exactness == "bitwise":
        how = "only bit-identical changes were allowed (exact=True)" if d.get("exact") else \
            "no change the tuner made alters a pixel"
        return [f"samples: bit-for-bit identical to the loader as given ({how})"]
    changes = [c if isinstance(c, PixelChange) else PixelChange(**c) for c in d.get("pixel_changes") or ()]
    if changes and all(c.identical_where_measured for c in changes):
        lines = [f"samples: identical on every image checked, but not guaranteed bit-for-bit ({exactness} changes):"]
    else:
        lines = [f"samples: NOT bit-for-bit identical to the loader as given ({exactness} changes):"]
    lines += [f"  - {c.describe()}" for c in changes] or [f"  - {exactness} changes (no measurement recorded)"]
    if any(c.kind == "decode" for c in changes):
        lines.append(f"  decoders are offered only within mean {DECODE_MEAN_ERROR:g}/255 and max "
                     f"{DECODE_MAX_ERROR:g}/255 on your images")
    lines.append("  for bit-identical samples: autotune(..., exact=True) or pipeline-opt tune --exact")
    return lines


def tune_table(result: Any) -> str:
    """The autotune summary: before/after with speedup and noise, what the changes do to the samples,
    every trial, and what was not tried."""
    d = as_dict(result)
    trials = d.get("trials") or ()
    noise = float(d.get("noise") or 0.0)
    speedup = float(d["speedup"])
    verdict = "beyond noise" if speedup - 1.0 > noise else "within noise"
    samples = pixel_change_lines(d)
    headline = (f"  speedup {speedup:.2f}x ({f'{verdict}; measured {noise_text(noise, 0)}' if noise > 0 else noise_text(0.0)})"
                if not unchanged(d.get("config"), d.get("original_config") or d["baseline"].get("loader_config"))
                else f"  no change: nothing beat the loader as given beyond the noise "
                     f"({'measured ' if noise > 0 else ''}{noise_text(noise, 0)}); its own settings are returned")
    lines = [
        f"pipeline_opt autotune  {len(trials)} trials in {float(d.get('tuning_time_s') or 0.0):.1f} s",
        headline,
        *(f"  caution: {c}" for c in d.get("cautions") or ()),
        *(["  " + line for line in samples]),
        "",
        before_after_table(d["baseline"], d["best"], d.get("config"), d.get("original_config"), speedup=speedup,
                           trial_throughput=(float(d.get("baseline_throughput") or 0.0),
                                             float(d.get("best_throughput") or 0.0))),
        "",
        "trials:",
    ]
    original = d.get("original_config") or d["baseline"].get("loader_config") or {}
    rows = []
    for i, t in enumerate(trials, 1):
        status = t.get("status", "ok")
        tput = f"{t['throughput']:,.1f}" if status == "ok" else status
        rows.append([i, tput, trial_spread(t), "yes" if t.get("accepted") else "no",
                     config_change(t.get("config") or {}, original), t.get("reason", "")])
    lines.append(grid(["#", "samples/s", "spread", "accepted", "change vs given", "reason"], rows)
                 if rows else "  (none)")
    not_tried = d.get("not_tried") or ()
    if not_tried:
        lines += ["", "not tried:"] + [f"  - {x}" for x in not_tried]
    return "\n".join(lines)
