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
