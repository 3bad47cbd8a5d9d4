"""The one A/B primitive: interleaved rounds, early stop, failing arms, and the judge's words."""

from __future__ import annotations

import pytest

from pipeline_opt.tune.ab import interleave, judge, repeat_noise


def test_rounds_alternate_the_order_and_every_arm_gets_one_result_per_round():
    calls = []
    results, order = interleave(["a", "b", "c"], 3, lambda arm: calls.append(arm) or f"{arm}{len(calls)}")
    assert order == tuple(calls) == ("a", "b", "c", "c", "b", "a", "a", "b", "c")
    assert results == {"a": ["a1", "a6", "a7"], "b": ["b2", "b5", "b8"], "c": ["c3", "c4", "c9"]}
    _, same_order = interleave(["a", "b"], 2, lambda arm: None, alternate=False)
    assert same_order == ("a", "b", "a", "b")


def test_stop_is_asked_only_after_the_first_round():
    asked = []

    def stop():
        asked.append(True)
        return True

    results, order = interleave(["a", "b"], 5, lambda arm: 1, stop=stop)
    assert order == ("a", "b") and results == {"a": [1], "b": [1]} and len(asked) == 1


def test_a_failing_arm_is_dropped_or_raised_as_the_caller_says():
    def measure(arm):
        if arm == "b":
            raise RuntimeError("worker died")
        return 1

    seen = []
    results, order = interleave(["a", "b"], 3, measure, on_error=lambda arm, exc: seen.append((arm, str(exc))) or True)
    assert results == {"a": [1, 1, 1], "b": []} and order == ("a", "b", "a", "a")
    assert seen == [("b", "worker died")]
    with pytest.raises(RuntimeError, match="worker died"):
        interleave(["a", "b"], 2, measure)
    with pytest.raises(ValueError, match="rounds=0"):
        interleave(["a"], 0, measure)


def test_the_judge_names_what_set_the_threshold():
    assert judge(130.0, 100.0, 0.05).sentence == "+30% faster (noise ±5.0%): kept"
    assert judge(104.0, 100.0, 0.05).sentence == "+4.0% is inside the measured noise ±5.0%: not kept"
    assert judge(60.0, 100.0, 0.05).sentence == "40% slower (noise ±5.0%): rolled back"
    assert judge(102.0, 100.0, 0.0).decision == "not kept" and "3.0% minimum gain" in judge(102.0, 100.0, 0.0).finding
    assert repeat_noise([100.0, 110.0]) == pytest.approx(10 / 105)


def test_a_noise_nothing_measured_is_said_to_be_unmeasured_not_zero():
    """The first guess was judged against a baseline with one (profiled) trial: "noise ±0.0%" beside a
    window spread of ±14% read as a certainty nothing had measured."""
    from pipeline_opt.tune.ab import judge, noise_text

    won = judge(2.0, 1.0, 0.0, spread=0.14).sentence
    assert won == "+100% faster (noise not measured, window spread ±14%): kept"
    assert "±0" not in judge(1.02, 1.0, 0.0, spread=0.14).sentence
    assert "±0" not in judge(1.01, 1.0, 0.0).sentence
    assert noise_text(0.0) == "noise not measured" and noise_text(0.123, 0) == "noise ±12%"
    assert judge(1.5, 1.0, 0.12).sentence == "+50% faster (noise ±12%): kept"  # a measured noise as before
