"""The training thread's scheduler statistics (/proc/thread-self/schedstat)."""

import pytest

from pipeline_opt._core.sched import thread_sched


def test_run_and_wait_seconds_are_read_from_the_file(tmp_path):
    path = tmp_path / "schedstat"
    path.write_text("123000000 45000000 7\n")
    assert thread_sched(str(path)) == pytest.approx((0.123, 0.045))


@pytest.mark.parametrize("text", ["0 0 1\n", "12 x 3\n", "12 34\n", ""])
def test_zeros_or_garbage_mean_not_measurable(tmp_path, text):
    # a kernel without scheduler statistics reports zeros: never ran, never waited, not a measurement
    path = tmp_path / "schedstat"
    path.write_text(text)
    assert thread_sched(str(path)) is None


def test_a_missing_file_means_not_measurable(tmp_path):
    assert thread_sched(str(tmp_path / "absent")) is None
