"""The cores a training process keeps for itself, from what it measured (shared by the profile's
advice and the tuner's budget, so both name the same worker count)."""

from __future__ import annotations


def reserved_cpus(per_rank: float, pin_thread: bool, main_cpu_s: float | None,
                  worker_cpu_s: float | None, pin_cpu_s: float = 0.0) -> tuple[float, str]:
    """Cores (per rank) the training process keeps for itself, and the sentence why.

    Measured: ``per_rank * c / (c + b)`` with ``c`` the training process's CPU seconds per step
    (``main_cpu_s``, plus ``pin_cpu_s`` for a pin-memory thread it does not run yet) and ``b`` a
    worker's CPU seconds per batch: its share when every core is busy. Never more than the fixed
    rule (one core for the main thread, one for the pin-memory thread), which is the answer when
    either number is missing."""
    fixed = 1.0 + (1.0 if pin_thread else 0.0)
    threads = "main and pin-memory threads" if pin_thread else "main thread"
    if main_cpu_s is None or main_cpu_s < 0 or not worker_cpu_s or worker_cpu_s <= 0:
        return fixed, f"{fixed:g} for the {threads} (not measured)"
    c = main_cpu_s + (max(0.0, pin_cpu_s) if pin_thread else 0.0)
    busy = per_rank * c / (c + worker_cpu_s)
    reserved = min(fixed, busy)
    pin = f" (pinning {pin_cpu_s * 1e3:.1f} ms included)" if pin_thread and pin_cpu_s > 0 else ""
    why = (f"{reserved:.2f} for the {threads}: the training process measured {c * 1e3:.1f} ms of CPU per step"
           f"{pin} against {worker_cpu_s * 1e3:.1f} ms per batch in a worker, so with every core busy it keeps "
           f"{busy:.2f} busy" + (f" (at most {fixed:g}, the fixed rule)" if busy > fixed else ""))
    return reserved, why
