"""How the suite runs itself (tests/conftest.py): what collection imported is left out of garbage
collection, the files it runs first exist, and no two test files share a name. And what the suite may not
hold: a benchmark test whose assertions could not fail (only `x >= 0`-style facts), or one that re-derives a
figure with the benchmark's own arithmetic (`c["speedup"] == c["trl_step_s"] / c["mindgrpo_step_s"]`)."""

import ast
import gc
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def test_what_collection_imported_is_out_of_every_garbage_collection():
    # MindSpore's own import alone leaves ~160k objects; the whole suite's collection ~575k. Unfrozen, every
    # graph compile (MindSpore collects before each) walks them all: ~0.6 s per graph in a -n 2 worker
    assert gc.get_freeze_count() > 100_000


def test_the_files_run_first_exist(pytestconfig):
    # a name that no longer exists is ignored by the ordering: a renamed slow file would silently start last
    # (several conftest.py files import as `conftest`: the root one is found among the registered plugins)
    (root,) = [p for p in pytestconfig.pluginmanager.get_plugins() if hasattr(p, "HEAVY_FIRST")]
    missing = [name for name in root.HEAVY_FIRST if not os.path.isfile(os.path.join(root.REPO, name))]
    assert not missing, missing


def test_no_two_test_files_share_a_name():
    # the test folders are not packages (rootdir-relative imports): pytest imports each test file as a module
    # named after the file, so a second tests/*/test_x.py fails collection ("import file mismatch")
    here = os.path.dirname(os.path.abspath(__file__))
    seen = {}
    for folder, _, files in os.walk(here):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                seen.setdefault(name, []).append(os.path.relpath(os.path.join(folder, name), here))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def _is_number(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def _figures_only(node) -> bool:
    """Arithmetic on values read from somewhere (names, subscripts, attributes), with no number of the test's own."""
    if isinstance(node, ast.BinOp):
        return _figures_only(node.left) and _figures_only(node.right)
    if isinstance(node, ast.UnaryOp):
        return _figures_only(node.operand)
    return isinstance(node, (ast.Name, ast.Subscript, ast.Attribute))


def _rederived(side) -> bool:
    """`a / b`, `a + b - c` or `abs(a + b - c)`, `pytest.approx(a / b)`: the figures combined as the code does."""
    if isinstance(side, ast.Call) and side.args and (getattr(side.func, "id", None) == "abs"
                                                     or getattr(side.func, "attr", None) == "approx"):
        side = side.args[0]
    return isinstance(side, ast.BinOp) and _figures_only(side)


def assertion_kind(test: ast.expr) -> str:
    """"trivial" (x >= 0, x > 0, and of those), "rederived" (a figure compared with arithmetic on other figures
    of the same output), else "fact"."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        kinds = {assertion_kind(v) for v in test.values}
        return "rederived" if "rederived" in kinds else "fact" if "fact" in kinds else "trivial"
    if isinstance(test, ast.Call) and getattr(test.func, "id", None) == "all" and test.args and \
            isinstance(test.args[0], ast.GeneratorExp):
        return assertion_kind(test.args[0].elt)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, (op,), (right,) = test.left, test.ops, test.comparators
        if isinstance(op, (ast.Gt, ast.GtE)) and _is_number(right) and right.value == 0:
            return "trivial"
        if isinstance(op, (ast.Eq, ast.Lt, ast.LtE)) and (_rederived(left) or _rederived(right)) and \
                not (_is_number(right) and right.value != 0 and isinstance(op, ast.Eq)):
            return "rederived"
    return "fact"


def benchmark_test_verdicts(source: str) -> dict:
    """test function -> what is wrong with its assertions (None when nothing)."""
    verdicts = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            kinds = [assertion_kind(a.test) for a in ast.walk(node) if isinstance(a, ast.Assert)]
            verdicts[node.name] = ("re-derives a figure with the benchmark's arithmetic" if "rederived" in kinds
                                   else "asserts only >= 0-style facts" if kinds and set(kinds) == {"trivial"}
                                   else None)
    return verdicts


@pytest.mark.parametrize("source, verdict", [
    ("def test_a(c):\n    assert c['speedup'] == c['trl_step_s'] / c['mindgrpo_step_s']", "re-derives"),
    ("def test_a(r):\n    assert abs(r['graphs'] + r['adamw'] + r['host'] - r['update']) < 1e-9", "re-derives"),
    ("def test_a(r, s):\n    assert r['tokens'] / r['seconds'] == pytest.approx(s['tps'])", "re-derives"),
    ("def test_a(c):\n    for k in c:\n        assert c[k] >= 0.0\n    assert c['a'] > 0 and c['b'] > 0", "only >= 0"),
    ("def test_a(c):\n    assert c['a'] >= 0\n    assert c['tokens'] == 4 * 4 * 8", None),
    ("def test_a(c, steps):\n    assert c['step_s'] == steps[1]['step']", None),
    ("def test_a(x):\n    assert x.sum() / x.size == 0.5", None),
])
def test_the_benchmark_test_check_tells_facts_from_tautologies(source, verdict):
    got = benchmark_test_verdicts(source)["test_a"]
    assert (got is None) if verdict is None else (verdict in got), got


def test_no_benchmark_test_asserts_only_what_cannot_fail():
    folder = os.path.join(HERE, "benchmarks")
    bad = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                for test, verdict in benchmark_test_verdicts(f.read()).items():
                    if verdict:
                        bad[f"{name}::{test}"] = verdict
    assert not bad, bad


def test_the_ci_runs_the_readmes_test_command():
    repo = os.path.dirname(HERE)
    with open(os.path.join(repo, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(repo, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    (command,) = [line.split("#")[0].strip() for line in readme.splitlines()
                  if line.startswith("bash scripts/setup_env.sh dev")]
    assert command in ci.splitlines(), command
