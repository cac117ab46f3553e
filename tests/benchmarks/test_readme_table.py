"""The README's performance table: generated from the results files (benchmarks/readme_table.py), and every
figure in it found in the results file its row links to, read here without the generator's code."""

import json
import os
import re

from benchmarks.readme_table import BEGIN, END, table

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_rows():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = text.split(BEGIN)[1].split(END)[0].strip()
    return block, [line for line in block.splitlines()[2:]]


def leaves(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from leaves(v)
    elif isinstance(node, list):
        for v in node:
            yield from leaves(v)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield float(node)


def shown(cell):
    """The first number of a cell and its decimals: '97.3 s per step' -> (97.3, 1)."""
    m = re.match(r"\s*(\d+(?:\.(\d+))?)", cell)
    assert m, cell
    return float(m.group(1)), len(m.group(2) or "")


def test_the_readme_table_is_the_generated_one():
    block, rows = readme_rows()
    assert block == table(), "run: python -m benchmarks.readme_table --write"
    assert len(rows) >= 5


def test_every_figure_of_the_readme_table_is_in_its_results_file():
    _, rows = readme_rows()
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        (name,) = re.findall(r"\(benchmarks/results/([\w.]+)\.md\)", cells[1])
        with open(os.path.join(REPO, "benchmarks", "results", name + ".json"), encoding="utf-8") as f:
            values = list(leaves(json.load(f)))
        figures = []
        for cell in cells[2:4]:
            x, digits = shown(cell)
            assert any(round(v, digits) == x for v in values), (name, cell)
            figures.append(x)
        ratio, digits = shown(cells[4])
        assert cells[4].endswith(("x as fast", "x the peer's")), cells[4]
        # the ratio of the two figures as shown, one way or the other
        assert ratio in (round(figures[0] / figures[1], digits), round(figures[1] / figures[0], digits)), line
