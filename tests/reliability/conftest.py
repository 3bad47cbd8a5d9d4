"""Fixtures of the reliability suite: leak checks around every test."""

from __future__ import annotations

import pytest
from rel_fixtures import live_children, shm_entries, wait_for_no_children


@pytest.fixture
def no_orphans():
    """Fail the test if it leaves child processes (DataLoader workers, pin threads' helpers) behind."""
    before = live_children()
    yield before
    extra = wait_for_no_children(before)
    assert not extra, f"orphan processes left behind: {sorted(extra)}"


@pytest.fixture
def no_shm_leak():
    """Fail the test if it leaves new /dev/shm entries behind."""
    before = shm_entries()
    yield
    assert not (shm_entries() - before), f"leaked /dev/shm entries: {sorted(shm_entries() - before)}"
