"""utils/compiles counts what MindSpore compiles: a Cell's first call per input shape is one new graph, a call
that finds its graph compiled counts nothing."""

import numpy as np
from mindspore import Tensor, nn, ops

from mindgrpo.utils import compiles


class Twice(nn.Cell):
    def construct(self, x):
        return ops.sin(x) * 2


def test_a_cells_first_call_per_shape_counts_one_graph_and_its_seconds():
    assert compiles.install() and compiles.install()  # idempotent: one wrapper, one count
    cell = Twice()
    before = compiles.totals()
    cell(Tensor(np.ones(3, np.float32)))
    first = compiles.totals() - before
    assert first.graphs == 1 and first.seconds > 0 and first.cpu_seconds > 0
    cell(Tensor(np.zeros(3, np.float32)))  # the same shape: its graph is compiled
    assert (compiles.totals() - before).graphs == 1
    cell(Tensor(np.ones((2, 3), np.float32)))  # another shape: another graph
    assert (compiles.totals() - before).graphs == 2
    Twice()(Tensor(np.ones(3, np.float32)))  # another instance compiles its own
    assert (compiles.totals() - before).graphs == 3


def test_totals_subtract_field_by_field():
    assert compiles.Totals(5, 2.5, 3.0) - compiles.Totals(2, 0.5, 1.0) == compiles.Totals(3, 2.0, 2.0)
    assert compiles.Totals() == compiles.Totals(0, 0.0, 0.0)
