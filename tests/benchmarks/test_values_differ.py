"""benchmarks.harness.values_differ: what the engine benchmarks report of two sides' log-probs."""

from benchmarks.harness import values_differ


def test_counts_the_values_that_differ_and_the_largest_gap():
    assert values_differ([[1.0, 2.0], [3.0]], [[1.0, 2.5], [3.0]]) == {"values": 3, "differ": 1, "max_abs": 0.5}
    assert values_differ([[-1.5]], [[-1.5]]) == {"values": 1, "differ": 0, "max_abs": 0.0}
    # samples of other lengths: nothing to compare value by value
    assert values_differ([[1.0]], [[1.0, 2.0]]) == {"values": 1, "differ": None, "max_abs": None}
