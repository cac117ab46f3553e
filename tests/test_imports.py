"""The package's import graph, read from the source with `ast` (imports at module level and inside
functions alike): no cycles, and every module imports only its own unit or the layers below.

The layers, bottom (1) to top (DEVELOPERS.md, "Architecture", explains them); a unit is a package or
a module, and a module belongs to the unit with the longest matching name. Units of one layer are
independent of each other.
"""

import ast
import os
import subprocess
import sys
from typing import Dict, List, Set

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "mindgrpo"

LAYERS = (
    ("utils", "kernels"),  # plain Python: registries, logging, progress, plots; our CPU kernels (OpenBLAS sgemm
    # as MindSpore Custom ops, their build and loader)
    ("data", "rewards", "tools", "models", "memory", "grpo.algos", "eval.metrics"),  # tokens and datasets, reward
    # functions, tools and their sandboxed worker pool, the model and its weight files, the memory ledger
    # (memory.swap), the algorithm's pure numpy math, pass@k / maj@k
    ("grpo.corrections", "data.questions", "envs"),  # the rollout corrections' numpy math (built on grpo.algos);
    # math questions from .jsonl / .json files (their final answers read as rewards.answer reads them); multi-turn
    # environments (run on the tools' worker pool)
    ("config", "inference"),  # the run's frozen config (validated against grpo.algos), the rollout engine
    ("parallel", "eval"),  # placement: devices, collectives, layouts, resharding, checkpoint I/O; evaluation
    ("parallel.one_device", "parallel.colocated"),  # the one-device and the colocated msrun placements
    ("parallel.separate_placement",),  # the separate placement (a one-device placement on each of its ranks)
    ("parallel.placement",),  # what a placement gives the build, and placement_for, which picks one
    ("memory.plan",),  # the memory planner
    ("memory.auto",),  # rl_config.memory: the memory savers chosen from the plan (a MemoryPolicy)
    ("grpo",),  # the trainer and its composition root
)


def unit_of(module: str) -> str:
    """The unit (e.g. "parallel", "grpo.algos") a module of the package belongs to."""
    name = module[len(PACKAGE) + 1:]
    units = [u for layer in LAYERS for u in layer if name == u or name.startswith(u + ".")]
    if not units:
        raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS (and DEVELOPERS.md)")
    return max(units, key=len)


def layer_of(unit: str) -> int:
    """1 for the bottom layer."""
    return next(i for i, layer in enumerate(LAYERS, 1) if unit in layer)


def package_modules(root: str = REPO) -> Dict[str, str]:
    """module name -> source file, for every module of the package (packages by their __init__)."""
    out = {}
    for folder, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        for f in files:
            if f.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, f), root)[:-3].split(os.sep)
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(folder, f)
    return out


def imports_of(module: str, path: str, modules: Dict[str, str], missing: Set[str] = None) -> Set[str]:
    """The package's modules that `module` imports anywhere in its source; names of the package
    that are no module (a stale import inside a function fails only when it runs) go to `missing`."""
    is_package = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package upwards
                anchor = module.split(".")[:len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            # `from P import name` imports P, and P.name when that is a module
            names = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
        else:
            continue
        if missing is not None:
            missing.update(n for n in names if n.startswith(PACKAGE + ".") and n not in modules)
        for name in names:
            while name and name not in modules and "." in name:  # `import a.b.c` of a package a.b
                name = name.rsplit(".", 1)[0]
            if name in modules and name != module and name.startswith(PACKAGE + "."):
                found.add(name)
    return found


def import_graph() -> Dict[str, Set[str]]:
    modules = package_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_violations(graph: Dict[str, Set[str]]) -> List[str]:
    out = []
    for module, targets in sorted(graph.items()):
        if module == PACKAGE:
            continue
        unit = unit_of(module)
        for target in sorted(targets):
            other = unit_of(target)
            if other != unit and layer_of(other) >= layer_of(unit):
                out.append(f"{module} ({unit}, layer {layer_of(unit)}) imports {target} ({other}, layer "
                           f"{layer_of(other)})")
    return out


def test_every_import_of_the_package_exists():
    modules, missing = package_modules(), set()
    for m, p in modules.items():
        imports_of(m, p, modules, missing)
    assert not missing, f"imports of modules that do not exist: {sorted(missing)}"


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_layers_import_downward_only():
    found = layer_violations(import_graph())
    assert not found, "imports against the layers:\n" + "\n".join(found)


# modules that size, check or find things before any model is built: plain Python, no MindSpore
PLAIN_PYTHON = ("mindgrpo.models.config", "mindgrpo.models.presets", "mindgrpo.models.lora_targets", "mindgrpo.parallel.checkpoint_folders",
                "mindgrpo.data.questions")


def test_the_plain_python_modules_load_without_mindspore():
    code = f"import sys, {', '.join(PLAIN_PYTHON)}; print(sorted(m for m in sys.modules if m.startswith('mindspore')))"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", f"importing {PLAIN_PYTHON} loads {r.stdout.strip()[:300]}"


# ---------------------------------------------------------------------------- the checker itself


def _write(root, files: Dict[str, str]) -> str:
    for rel, text in files.items():
        path = os.path.join(root, PACKAGE, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return str(root)


def test_the_checker_sees_function_level_cycles_and_upward_imports(tmp_path):
    root = _write(tmp_path, {
        "__init__.py": "",
        "models/__init__.py": "",
        "models/a.py": "def f():\n    from mindgrpo.parallel import b\n",  # upward, inside a function
        "parallel/__init__.py": "",
        "parallel/b.py": "import mindgrpo.models.a\n",
        "parallel/c.py": "from mindgrpo.parallel import b\nfrom . import d\n\n\ndef f():\n    import mindgrpo.parallel.gone\n",
        "parallel/d.py": "from .c import x\n",  # relative imports: a cycle c <-> d
        "grpo/__init__.py": "",
        "grpo/algos.py": "from mindgrpo.utils import registry\n",
        "utils/__init__.py": "",
        "utils/registry.py": "",
    })
    modules, missing = package_modules(root), set()
    graph = {m: imports_of(m, p, modules, missing) for m, p in modules.items()}
    assert missing == {"mindgrpo.parallel.gone"}
    assert graph["mindgrpo.models.a"] == {"mindgrpo.parallel", "mindgrpo.parallel.b"}
    assert graph["mindgrpo.parallel.c"] == {"mindgrpo.parallel", "mindgrpo.parallel.b", "mindgrpo.parallel.d"}
    assert cycles(graph) == [["mindgrpo.models.a", "mindgrpo.parallel.b"],
                             ["mindgrpo.parallel.c", "mindgrpo.parallel.d"]]
    assert layer_violations(graph) == [
        "mindgrpo.models.a (models, layer 2) imports mindgrpo.parallel (parallel, layer 5)",
        "mindgrpo.models.a (models, layer 2) imports mindgrpo.parallel.b (parallel, layer 5)"]
    assert unit_of("mindgrpo.grpo.algos") == "grpo.algos" and unit_of("mindgrpo.grpo.trainer") == "grpo"
    with pytest.raises(AssertionError, match="belongs to no layer"):
        unit_of("mindgrpo.newpackage.x")
