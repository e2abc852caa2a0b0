"""The run's metrics: acceptance per real draft (a -1 placeholder is no draft, issue 35)."""

from __future__ import annotations

from flashspec_export.runtime.metrics import Metrics


def test_placeholders_are_not_counted_as_drafts():
    """Golden step, γ 3: sequence 0 drafted 3 and emitted 3 (two accepted, then a rejection);
    sequence 1 drafted 1, accepted, then emitted its sample at the first placeholder (2);
    sequence 2 drafted nothing, all -1 (1). Per real draft, position 0 was drafted twice and
    accepted twice, positions 1 and 2 once each (accepted, rejected). Counting every position as
    drafted (the placeholders inflating the denominator) would give 2/3, 1/3 and 0/3."""
    metrics = Metrics(gamma=3, sequences=3)
    metrics.add_step([3, 2, 1], [3, 1, 0])
    assert metrics.drafted_at == [2, 1, 1]
    assert metrics.accepted_at == [2, 1, 0]
    assert metrics.acceptance == [1.0, 1.0, 0.0]
    assert metrics.tokens_per_step == 2.0  # 6 tokens over 3 sequence steps: placeholders or not
    metrics.add_step([4, 1, 1])  # no count: every sequence drafted γ (the device loop's steps)
    assert metrics.drafted_at == [5, 4, 4]
    assert metrics.accepted_at == [3, 2, 1]
