"""Fixtures of hand-built reports (see report_samples.py)."""

from __future__ import annotations

import pytest
from report_samples import make_profile, make_tune

from pipeline_opt.profile.report import ProfileReport
from pipeline_opt.tune.result import TuneResult


@pytest.fixture
def sample_profile() -> ProfileReport:
    return make_profile()


@pytest.fixture
def sample_tune() -> TuneResult:
    return make_tune()
