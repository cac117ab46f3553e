"""Loops over many parameters in one graph.

A Python loop in a graph unrolls into nested calls, and MindSpore refuses them past 1,000 deep
("Exceed function call depth limit"): one loop over a few hundred parameters (the LoRA adapters of a
24-layer model, a 7B model's weights on one rank) does not compile, and its compile time grows faster
than the loop. So graphs that loop over parameters loop over spans of at most SPAN of them, each span a
cell of its own called in turn: the same operations in the same order (AdamW's step over 1,000
parameters compiles in 66 s this way, and not at all as one loop). Plain Python: the memory plan and the
reshard plan use SPAN without MindSpore.
"""

from __future__ import annotations

SPAN = 96


def spans(n: int, size: int = SPAN) -> tuple:
    """((start, stop), ...): consecutive spans of at most `size` of n items."""
    return tuple((a, min(a + size, n)) for a in range(0, n, size))
