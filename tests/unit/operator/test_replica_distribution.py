"""Total replicas are spread over pools by node count, largest remainder, deterministic ties."""

from __future__ import annotations

import pytest

from mmprep_operator.logic.replicas import distribute


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        (4, {"a": 1, "b": 1, "c": 2}, {"a": 1, "b": 1, "c": 2}),
        (3, {"a": 1, "b": 1, "c": 2}, {"a": 1, "b": 1, "c": 1}),  # remainders .75 .75 .5 beat c's larger weight
        (1, {"gb300": 2, "h200": 2}, {"gb300": 1, "h200": 0}),  # equal: name order
        (2, {"a": 1, "b": 2, "c": 1}, {"a": 1, "b": 1, "c": 0}),  # shares .5 1 .5: a and c tie, name order
        (5, {"x": 3, "y": 1}, {"x": 4, "y": 1}),  # 3.75/1.25: x takes the left-over
        (0, {"a": 5}, {"a": 0}),
        (3, {"a": 0, "b": 0}, {"a": 2, "b": 1}),  # no information: equal shares
        (7, {}, {}),
    ],
)
def test_distribution(total, weights, expected) -> None:
    assert distribute(total, weights) == expected


def test_sum_is_the_total_and_order_of_input_does_not_matter() -> None:
    weights = {"p1": 3, "p2": 5, "p3": 1, "p4": 2}
    for total in range(40):
        out = distribute(total, weights)
        assert sum(out.values()) == total
        assert out == distribute(total, dict(reversed(list(weights.items()))))


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="total replicas"):
        distribute(-1, {"a": 1})
    with pytest.raises(ValueError, match="weights"):
        distribute(1, {"a": -1})
