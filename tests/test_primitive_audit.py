"""Every MindSpore primitive a GRPO step's graphs use, read from the compiled graphs' IR (not from our sources), with
the platforms MindSpore's own docstrings state for it: none stated without Ascend.

A one-step micro run (one process, float16 compute: the CPU's stand-in for Ascend's bfloat16) dumps its graphs
(MS_DEV_SAVE_GRAPHS): the engine's refresh, prefill, copy and
decode graphs, the training step, the gradient norm and AdamW. Each graph's `validate` IR (the last before the
backend) names its primitives as `PrimFunc_<Name>`. A primitive's platforms are its class docstring's
"Supported Platforms", or those of the function its docstring refers to (`Refer to :func:`mindspore.ops.abs``);
nine state none (the gradient primitives RsqrtGrad, SiLUGrad, SoftmaxBackward and the generated Divs,
LessScalar, MatMulExt, Max, Muls, SplitWithSize): they are listed as such, and a new one fails the test until
it is looked at. The collectives
(AllReduce, AllGather) appear only under msrun and are not covered here."""

import glob
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICRO = os.path.join(REPO, "tests", "grpo", "micro_qwen2.yaml")
PLATFORMS = re.compile(r"Supported Platforms:\s*((?:``\w+``\s*)+)")
# stated nowhere in MindSpore 2.10's docstrings (the primitive's, nor its function's)
UNDOCUMENTED = {"RsqrtGrad", "SiLUGrad", "SoftmaxBackward", "Divs", "LessScalar", "MatMulExt", "Max", "Muls",
                "SplitWithSize"}
REFERS = re.compile(r"Refer to :func:`mindspore\.ops\.(\w+)`")


def platforms(name: str):
    """The platforms MindSpore's docstrings state for primitive `name`, or None when they state none."""
    import mindspore.ops as ops
    from mindspore.ops import auto_generate, operations
    from mindspore.ops.operations import _grad_ops, _inner_ops

    for module in (operations, auto_generate, _grad_ops, _inner_ops):
        prim = getattr(module, name, None)
        if prim is not None:
            break
    else:
        return None
    doc = prim.__doc__ or ""
    found = PLATFORMS.search(doc)
    refers = REFERS.search(doc)
    if found is None and refers is not None:  # the function, public (ops) or generated beside the primitive
        function = getattr(ops, refers.group(1), None) or getattr(auto_generate, refers.group(1), None)
        found = PLATFORMS.search((function.__doc__ or "") if function is not None else "")
    return None if found is None else tuple(re.findall(r"``(\w+)``", found.group(1)))


def test_platforms_are_read_from_the_docstrings():
    assert platforms("MatMul") == ("Ascend", "GPU", "CPU")  # its class docstring
    assert "Ascend" in platforms("Abs")  # through mindspore.ops.abs
    assert platforms("ClampScalar") == ("Ascend", "GPU", "CPU")  # through the generated clamp_scalar
    assert platforms("ZerosLikeExt") == ("Ascend",)
    assert platforms("SoftmaxBackward") is None


NODE = re.compile(r"= PrimFunc_(\w+)\(.*\n\s*: \((.*)\) -> .*\n\s*# Fullname with scope: \((.*)\)")


@pytest.fixture(scope="module")
def step_graphs(tmp_path_factory):
    """The `validate` IR of every graph of a one-step micro run in float16 compute (the CPU's stand-in for
    Ascend's bfloat16: the graphs an Ascend run compiles, with half-precision matmuls): {path: text}."""
    tmp = tmp_path_factory.mktemp("audit")
    graphs = tmp / "graphs"
    run = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir",
                          str(tmp / "out"), "rl_config.max_steps=1", "sft_config={steps: 0}",
                          "rl_config.val_interval=0", "rl_config.completions_interval=0", f"actor_config.model={MICRO}",
                          "rl_config.batch_size=2", "rl_config.num_generations=2", "generate_config.max_tokens=8",
                          "actor_config.micro_batch_size=4", "actor_config.dtype=float16"],
                         cwd=REPO, capture_output=True, text=True, timeout=1200,
                         env=dict(os.environ, PYTHONPATH=REPO, MS_DEV_SAVE_GRAPHS="1",
                                  MS_DEV_SAVE_GRAPHS_PATH=str(graphs)))
    assert run.returncode == 0, run.stderr[-3000:]
    out = {}
    for path in sorted(glob.glob(str(graphs / "*validate*.ir"))):
        with open(path) as f:
            out[path] = f.read()
    return out


def graph_name(path, text):
    found = re.search(r"mindgrpo_\w+?_(\w+)_construct", text)
    return found.group(1) if found else os.path.basename(path)


@pytest.mark.slow
def test_every_primitive_of_a_grpo_step_is_documented_for_ascend(step_graphs):
    names = {}
    for path, text in step_graphs.items():
        for prim in set(re.findall(r"PrimFunc_(\w+)", text)):
            names.setdefault(prim, set()).add(graph_name(path, text))
    assert len(step_graphs) >= 7 and {"MatMul", "Softmax", "AdamWeightDecay"} <= set(names), sorted(names)
    table = {name: platforms(name) for name in sorted(names)}
    print("\n".join(f"{n:<24} {' '.join(p) if p else '(none stated)':<18} {', '.join(sorted(names[n]))}"
                    for n, p in table.items()))
    without_ascend = {n: p for n, p in table.items() if p is not None and "Ascend" not in p}
    assert not without_ascend, without_ascend
    undocumented = {n for n, p in table.items() if p is None}
    assert undocumented <= UNDOCUMENTED, undocumented


@pytest.mark.slow
def test_the_fp32_islands_hold_in_a_half_precision_step(step_graphs):
    """models/precision.py's declaration against the compiled float16 graphs: each island's primitives take fp32
    inputs only, the model's matmuls take float16, the loss (outside the model) and the optimiser's graphs hold no
    float16 tensor; each declared primitive occurs (a declaration of nothing is stale)."""
    from mindgrpo.models.precision import FP32_GRAPHS, FP32_PRIMITIVES, HALF_PRIMITIVES, LOSS_SCOPE

    island_of = {prim: island for island, prims in FP32_PRIMITIVES.items() for prim in prims}
    seen, wrong = set(), []
    for path, text in step_graphs.items():
        graph = graph_name(path, text)
        for prim, inputs, scope in NODE.findall(text):
            floats = set(re.findall(r"Tensor\[(Float\d+|BFloat16)\]", inputs))
            if prim in island_of:
                seen.add(prim)
                if floats - {"Float32"}:
                    wrong.append((island_of[prim], prim, graph, scope, floats))
            elif prim in HALF_PRIMITIVES and floats != {"Float16"}:
                wrong.append(("compute dtype", prim, graph, scope, floats))
            elif (graph.endswith(FP32_GRAPHS) or (f"Default/{LOSS_SCOPE}/" in scope and "/scorer" not in scope and
                                                  not scope.startswith("Gradients"))) and "Float16" in floats:
                wrong.append(("fp32 graph or loss", prim, graph, scope, floats))
    assert not wrong, wrong[:10]
    assert seen == set(island_of), set(island_of) - seen
