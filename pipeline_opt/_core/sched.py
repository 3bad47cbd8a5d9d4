"""The calling thread's scheduler statistics from ``/proc/thread-self/schedstat`` (Linux).

The kernel counts, per thread, the nanoseconds it ran on a CPU and the nanoseconds it was runnable
but waited in a run queue for one. The second number is what tells "the training thread was slow
because it had no core" (DataLoader workers or other processes holding every core) apart from "the
training thread had work of its own to do": both look the same in wall time and in CPU time.
"""

from __future__ import annotations

SCHEDSTAT = "/proc/thread-self/schedstat"


def thread_sched(path: str = SCHEDSTAT) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable and waiting for a CPU) of the calling thread, or None where the
    file is missing, unreadable, or reports no run time at all (a kernel built without scheduler
    statistics reports zeros, which would read as "never waited")."""
    try:
        with open(path) as fh:
            run_ns, wait_ns, _ = fh.read().split()
        run, wait = int(run_ns), int(wait_ns)
    except (OSError, ValueError):
        return None
    if run <= 0 or wait < 0:
        return None
    return run / 1e9, wait / 1e9
