"""Self-contained HTML reports: inline CSS and inline SVG plots, no scripts, no network.

``render_profile_html(report_dict)`` shows the step-time breakdown (stacked data wait / H2D /
compute per step), per-worker utilisation, per-transform cost, the bottleneck with its evidence and
the recommendations, top ops, and how to open ``trace.json`` in Perfetto. ``render_tune_html``
adds the throughput of every autotune trial (spread whiskers, accepted trials highlighted) and the
before/after comparison. All user-provided strings are escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from pipeline_opt.report.svg import Series, horizontal_bars, stacked_bars, whisker_bars
from pipeline_opt.report.text import (
    as_dict,
    config_change,
    format_config,
    group_workers,
    limit_unreliable,
    transform_names,
    unchanged,
    workers_title,
)
from pipeline_opt.tune.ab import noise_text
from pipeline_opt.tune.exactness import PixelChange
from pipeline_opt.tune.result import trial_spread

DATA_WAIT_COLOR = "#e4572e"
H2D_COLOR = "#f2b705"
COMPUTE_COLOR = "#2e86ab"
WORKER_COLOR = "#7b5ea7"
ACCEPTED_COLOR = "#3aa655"
REJECTED_COLOR = "#aab4c3"
FAILED_COLOR = "#e8a0a0"
MEMORY_COLOR = "#59a14f"
OUTSIDE_COLOR = "#9d9d9d"
RESERVED_COLOR = "#b6d7a8"
TRANSFORM_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac", "#72b7b2")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:960px;color:#222}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:13px}.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:130px}
.card b{display:block;font-size:18px}.card span{color:#666;font-size:12px}
.bottleneck{padding:10px 14px;border-radius:6px;background:#fff4e5;border:1px solid #f0c27b}
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:left}
th{background:#f5f5f5}code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
.ok{color:#2a7a3b;font-weight:600}.no{color:#888}
"""


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_CSS}</style></head><body>{body}</body></html>\n")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _pct(frac: float | None) -> str:
    return "n/a" if frac is None else f"{100 * frac:.0f}%"


def _cards(d: Mapping[str, Any]) -> str:
    eff = d.get("efficiency")
    items = [
        (f"{d['throughput']:,.1f}", "samples/s"),
        (f"{d['step_time_s'] * 1e3:.1f} ms", "median step time"),
        (_pct(d["data_wait_frac"]), "data wait"),
        (_pct(d.get("gpu_idle_frac")), "GPU idle"),
        ("n/a", "efficiency: the limit could not be measured reliably (the loader measured above it)")
        if limit_unreliable(d) else ("n/a" if eff is None else f"{eff:.2f}x", "efficiency vs limit"),
    ]
    return '<div class="cards">' + "".join(
        f'<div class="card"><b>{_e(v)}</b><span>{_e(k)}</span></div>' for v, k in items) + "</div>"


def _diagnosis(d: Mapping[str, Any]) -> str:
    evidence = "".join(f"<li>{_e(x)}</li>" for x in d.get("evidence") or ())
    recs = "".join(f"<li>{_e(x)}</li>" for x in d.get("recommendations") or ())
    out = (f'<div class="bottleneck"><b>Bottleneck: {_e(str(d["bottleneck"]).upper())}</b>'
           f"<ul>{evidence}</ul></div>")
    if recs:
        out += f"<h2>Recommendations</h2><ol>{recs}</ol>"
    return out


def step_chart(d: Mapping[str, Any]) -> str:
    """Stacked bars per measured step: data wait, host-to-device (left out of a CPU run that copied
    nothing), compute (milliseconds)."""
    steps = d.get("steps") or ()
    if not steps:
        return "<p>No per-step records in this report.</p>"
    h2d = tuple(1e3 * float(s["h2d_s"]) for s in steps)
    copies = not str(d.get("device", "cpu")).startswith("cpu") or any(v > 0 for v in h2d)
    series = [
        Series("data wait", DATA_WAIT_COLOR, tuple(1e3 * float(s["data_wait_s"]) for s in steps)),
        *((Series("H2D", H2D_COLOR, h2d),) if copies else ()),
        Series("compute", COMPUTE_COLOR, tuple(1e3 * float(s["compute_s"]) for s in steps)),
    ]
    labels = [str(s.get("index", i)) for i, s in enumerate(steps)]
    # a new epoch restarts non-persistent workers: its first step is marked on the axis, "e<N>|"
    labels = [f"e{s.get('epoch', 0)}|{lab}" if i and s.get("epoch", 0) != steps[i - 1].get("epoch", 0) else lab
              for i, (s, lab) in enumerate(zip(steps, labels))]
    chart = stacked_bars(series, labels, "time per step", "ms")
    epochs = sum(1 for i in range(1, len(steps)) if steps[i].get("epoch", 0) != steps[i - 1].get("epoch", 0))
    note = (f"<p>Measured steps (x) against milliseconds (y); {epochs} epoch boundar{'y' if epochs == 1 else 'ies'} "
            "in the window, marked e&lt;N&gt;| on the first step of each new epoch.</p>" if epochs else
            "<p>Measured steps (x) against milliseconds (y), all in one epoch.</p>")
    return chart + note


def _workers_section(d: Mapping[str, Any]) -> str:
    workers = group_workers(d.get("workers") or ())
    if not workers:
        return ""
    labels = [("main process" if w["worker_id"] < 0 else f"worker {w['worker_id']}")
              + (f" ({w['processes']} processes)" if w["processes"] > 1 else "") for w in workers]
    out = [f"<h2>Workers</h2><p>{_e(workers_title(workers))}. CPU utilisation of each loader worker "
           "(100% = one core; a respawned worker's processes weighted by their samples).</p>",
           horizontal_bars(labels, [float(w.get("cpu_percent", 0.0)) for w in workers], "CPU per worker", "%",
                           WORKER_COLOR, max_value=100.0)]
    names = transform_names(workers)
    if names:
        mean = [sum(float((w.get("transform_s") or {}).get(n, 0.0)) for w in workers) / len(workers) * 1e3
                for n in names]
        colors = [TRANSFORM_PALETTE[i % len(TRANSFORM_PALETTE)] for i in range(len(names))]
        outside = sum(max(float(w.get("mean_sample_s", 0.0)) - sum(float(v) for v in (w.get("transform_s") or {})
                                                                    .values()), 0.0) for w in workers) / len(workers)
        if outside > 0:  # reading the file and decoding it, the dataset's own code: often the largest part
            names, mean = [*names, "outside the transforms (reading, decoding)"], [*mean, outside * 1e3]
            colors = [*colors, OUTSIDE_COLOR]
        out += ["<p>Mean cost of each transform per sample, across workers.</p>",
                horizontal_bars(names, mean, "per-transform cost", "ms/sample", colors)]
    rows = [[lab, ", ".join(str(p) for p in w["pids"]), w["processes"], w["samples"],
             f"{1e3 * float(w['mean_sample_s']):.2f}", f"{float(w['cpu_percent']):.0f}",
             f"{int(w['rss_bytes']) / 2**20:.0f}",
             "-" if w["collate_ms_per_batch"] is None else f"{w['collate_ms_per_batch']:.2f}"]
            for lab, w in zip(labels, workers)]
    out.append(_table(["worker", "pids", "processes", "samples", "ms/sample", "cpu %", "rss MB", "collate ms/batch"],
                      rows))
    return "".join(out)


def _memory_section(d: Mapping[str, Any]) -> str:
    """Peak CUDA memory per measured step (allocated, and reserved on top), the headroom and the
    validation passes' effect, or why nothing was measured."""
    mem = d.get("memory") or {}
    out = []
    if mem:
        if not mem.get("measured"):
            out.append(f"<h2>Memory</h2><p>{_e(mem.get('note') or 'not measured')}.</p>")
        else:
            gib = float(1 << 30)
            allocated = [int(v) / gib for v in mem.get("peak_allocated_bytes") or ()]
            reserved = [max(int(r) / gib - a, 0.0) for r, a in zip(mem.get("peak_reserved_bytes") or (), allocated)]
            total = int(mem.get("device_total_bytes") or 0) / gib
            head = int(mem.get("headroom_bytes") or 0) / gib
            out.append(f"<h2>Memory</h2><p>Peak CUDA memory of each measured step: {_e(f'{head:.2f}')} GiB of "
                       f"{_e(f'{total:.1f}')} GiB stay free at the largest reserved peak.</p>")
            if allocated:
                out.append(stacked_bars([Series("peak allocated", MEMORY_COLOR, tuple(allocated)),
                                         Series("reserved, not allocated", RESERVED_COLOR, tuple(reserved))],
                                        [str(i) for i in range(len(allocated))], "peak memory per step", "GiB"))
            if mem.get("spikes"):
                out.append(f"<p>Spikes (steps above the steady peak): {_e(', '.join(map(str, mem['spikes'])))}.</p>")
            ops = mem.get("top_alloc_ops") or ()
            if ops:
                out.append(_table(["op", "allocated (GiB)"], [[name, f"{int(b) / gib:.2f}"] for name, b in ops]))
    val = d.get("validation") or {}
    if val:
        recs = "".join(f"<li>{_e(r)}</li>" for r in val.get("recommendations") or ())
        out.append(f"<h2>Validation</h2><p>{_e(val.get('summary', ''))}.</p>" + (f"<ul>{recs}</ul>" if recs else ""))
    return "".join(out)


def _ops_section(d: Mapping[str, Any]) -> str:
    out = []
    cuda = str(d.get("device") or "").startswith("cuda")  # a CPU run has no CUDA column to show
    for key, title in (("top_cpu_ops", "Top CPU ops"), ("top_cuda_ops", "Top CUDA ops")):
        ops = d.get(key) or ()
        if ops:
            rows = [[o["name"], o.get("calls", 0), f"{1e3 * float(o.get('self_cpu_s', 0.0)):.2f}"]
                    + ([f"{1e3 * float(o.get('self_cuda_s', 0.0)):.2f}"] if cuda else []) for o in ops]
            out.append(f"<h2>{title}</h2>" + _table(["op", "calls", "self CPU ms"] + (["self CUDA ms"] if cuda else []),
                                                   rows))
    return "".join(out)


_TRACE_HELP = (
    "<h2>Timeline</h2><p>The merged timeline of the main process and every worker is in "
    '<a href="trace.json"><code>trace.json</code></a> next to this file. Open '
    '<a href="https://ui.perfetto.dev">ui.perfetto.dev</a> and choose <i>Open trace file</i>, or type '
    "<code>chrome://tracing</code> in Chrome and press <i>Load</i>. The file is opened locally; "
    "nothing is uploaded and this page loads nothing from the network.</p>"
)


def profile_body(d: Mapping[str, Any], heading: str = "Profile") -> str:
    """The HTML body of one profile (used alone and inside the tuning report)."""
    meta = (f"device {_e(d.get('device'))} · batch {_e(d.get('batch_size'))} · "
            f"loader {_e(format_config(d.get('loader_config')))}")
    env = d.get("environment") or {}
    env_table = _table(["key", "value"], sorted(env.items())) if env else ""
    return (f"<h1>{_e(heading)}</h1><p class=\"meta\">{meta}</p>{_cards(d)}{_diagnosis(d)}"
            f"<h2>Step-time breakdown</h2>{step_chart(d)}{_memory_section(d)}{_workers_section(d)}{_ops_section(d)}"
            f"{_TRACE_HELP}" + (f"<h2>Environment</h2>{env_table}" if env_table else ""))


def render_profile_html(report_dict: Mapping[str, Any]) -> str:
    """One self-contained HTML page for a profile report (``ProfileReport.to_dict()``)."""
    d = as_dict(report_dict)
    return _page("pipeline_opt profile", profile_body(d, "pipeline_opt profile"))


def trial_chart(d: Mapping[str, Any]) -> str:
    """Throughput per trial with min..max whiskers; accepted trials green, baseline dashed."""
    trials = d.get("trials") or ()
    if not trials:
        return "<p>No trials were run.</p>"
    values, lows, highs, colors = [], [], [], []
    for t in trials:
        v = float(t.get("throughput") or 0.0)
        windows = [float(w) for w in t.get("windows") or ()]
        half = v * float(t.get("spread") or 0.0) / 2
        lows.append(min(windows) if windows else max(0.0, v - half))
        highs.append(max(windows) if windows else v + half)
        values.append(v)
        status = t.get("status", "ok")
        colors.append(ACCEPTED_COLOR if t.get("accepted") else FAILED_COLOR if status != "ok" else REJECTED_COLOR)
    labels = [f"#{i}" if t.get("status", "ok") == "ok" else f"#{i} {t.get('status')}"
              for i, t in enumerate(trials, 1)]
    # the speedup's own denominator (the baseline's pooled tuning trials), not the baseline's short profile
    base = float(d.get("baseline_throughput") or 0.0) or float(d["baseline"]["throughput"])
    return whisker_bars(labels, values, lows, highs, colors, "throughput per trial", "samples/s",
                        reference=("baseline", base))


def render_tune_html(result_dict: Mapping[str, Any]) -> str:
    """One self-contained HTML page for an autotune result (``TuneResult.to_dict()``)."""
    d = as_dict(result_dict)
    base, best = d["baseline"], d["best"]
    noise = float(d.get("noise") or 0.0)
    trials = d.get("trials") or ()
    original = d.get("original_config") or base.get("loader_config") or {}
    rows = [[f"#{i}", f"{float(t.get('throughput') or 0.0):,.1f}", trial_spread(t),
             "yes" if t.get("accepted") else "no", t.get("status", "ok"), config_change(t.get("config") or {}, original),
             t.get("reason", "")] for i, t in enumerate(trials, 1)]
    settings = [[k, _fmt_val(original.get(k, "-")), _fmt_val(v)] for k, v in (d.get("config") or {}).items()]
    trial_before, trial_after = float(d.get("baseline_throughput") or 0.0), float(d.get("best_throughput") or 0.0)
    measured = trial_before > 0 and trial_after > 0
    same = unchanged(d.get("config"), original)  # nothing won: one measurement, not a before and an after
    compare = [
        ["throughput, one short profile each (samples/s)", f"{base['throughput']:,.1f}", f"{best['throughput']:,.1f}"],
        ["median step time in the profile (ms)", f"{1e3 * base['step_time_s']:.1f}", f"{1e3 * best['step_time_s']:.1f}"],
        ["data wait", _pct(base["data_wait_frac"]), _pct(best["data_wait_frac"])],
        ["GPU idle", _pct(base.get("gpu_idle_frac")), _pct(best.get("gpu_idle_frac"))],
        ["bottleneck", base["bottleneck"], best["bottleneck"]],
    ]
    not_tried = "".join(f"<li>{_e(x)}</li>" for x in d.get("not_tried") or ())
    legend = (f'<p><span style="color:{ACCEPTED_COLOR}">■</span> accepted · '
              f'<span style="color:{REJECTED_COLOR}">■</span> rejected · '
              f'<span style="color:{FAILED_COLOR}">■</span> failed/skipped · whiskers: min..max of the '
              "repeat windows · dashed line: baseline</p>")
    body = (
        f"<h1>pipeline_opt autotune</h1><p class=\"meta\">{len(trials)} trials in "
        f"{float(d.get('tuning_time_s') or 0.0):.1f} s · {'measured ' if noise > 0 else ''}{noise_text(noise, 0)}</p>"
        + ('<div class="cards"><div class="card"><b>no change</b><span>nothing beat the loader as given beyond the '
           'noise</span></div>' + (f'<div class="card"><b>{trial_before:,.1f}</b><span>samples/s, its tuning trials'
                                   '</span></div>' if trial_before > 0 else "") if same else
           f'<div class="cards"><div class="card"><b>{float(d["speedup"]):.2f}x</b><span>speedup</span></div>'
           + (f'<div class="card"><b>{trial_after:,.1f}</b><span>samples/s after (tuning trials)</span></div>'
              f'<div class="card"><b>{trial_before:,.1f}</b><span>samples/s before (tuning trials)</span></div>'
              if measured else ""))
        + "</div>"
        + "".join(f'<p class="caution"><b>Caution:</b> {_e(c)}</p>' for c in d.get("cautions") or ())
        + f"<p>{_e(SPEEDUP_NOTE)}</p>"
        + _samples_section(d)
        + f"<h2>Before and after</h2>{_table(['', 'before', 'after'], compare)}"
        f"<h2>Chosen settings</h2>{_table(['setting', 'before', 'after'], settings)}"
        f"<h2>Throughput per trial</h2>{trial_chart(d)}{legend}"
        f"{_table(['trial', 'samples/s', 'spread', 'accepted', 'status', 'change vs given', 'reason'], rows)}"
        + (f"<h2>Not tried</h2><ul>{not_tried}</ul>" if not_tried else "")
        + f"<h2>Before: step-time breakdown</h2>{step_chart(base)}"
        + f"<hr>{profile_body(best, 'Best configuration')}"
    )
    return _page("pipeline_opt autotune", body)


SPEEDUP_NOTE = ("Speedup: the pooled median throughput of the chosen settings over that of the loader as given, "
                "over every steady-state window of their tuning trials, measured interleaved in this run. The "
                "profiles below are one short run each, for the breakdown; their throughputs are not the speedup.")


def _samples_section(d: Mapping[str, Any]) -> str:
    """Whether the tuned loader's samples are bit-for-bit the original ones; each change that is
    not, with its measured mean and max error (1/255 units)."""

    exactness = d.get("exactness")
    if exactness is None:
        return ""
    if exactness == "bitwise":
        return ('<h2>Samples</h2><p class="ok">Bit-for-bit identical to the loader as given: no change the '
                "tuner made alters a pixel.</p>")
    changes = [c if isinstance(c, PixelChange) else PixelChange(**c) for c in d.get("pixel_changes") or ()]
    rows = [[c.name, c.setting, c.kind, "n/a" if c.mean_error is None else f"{c.mean_error:.3g}/255",
             f"{c.max_error:.3g}/255", c.n_images or "documented bound", c.note] for c in changes]
    return (f'<h2>Samples</h2><div class="bottleneck"><b>Not bit-for-bit identical to the loader as given '
            f"({_e(exactness)} changes)</b>: each change below alters pixels, by the error measured on your "
            "images. For bit-identical samples pass <code>exact=True</code> (CLI: <code>--exact</code>).</div>"
            + _table(["change", "setting", "class", "mean error", "max error", "images", "how measured"], rows))


def _fmt_val(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)
