"""Every MindSpore primitive a GRPO step's graphs use, read from the compiled graphs' IR (not from our sources), with
the platforms MindSpore's own docstrings state for it: none stated without Ascend.

A one-step micro run (one process) dumps its graphs (MS_DEV_SAVE_GRAPHS): the engine's refresh, prefill, copy and
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


@pytest.mark.slow
def test_every_primitive_of_a_grpo_step_is_documented_for_ascend(tmp_path):
    graphs = tmp_path / "graphs"
    run = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir",
                          str(tmp_path / "out"), "rl_config.max_steps=1", "sft_config={steps: 0}",
                          "rl_config.val_interval=0", "rl_config.completions_interval=0", f"actor_config.model={MICRO}",
                          "rl_config.batch_size=2", "rl_config.num_generations=2", "generate_config.max_tokens=8",
                          "actor_config.micro_batch_size=4"],
                         cwd=REPO, capture_output=True, text=True, timeout=1200,
                         env=dict(os.environ, PYTHONPATH=REPO, MS_DEV_SAVE_GRAPHS="1",
                                  MS_DEV_SAVE_GRAPHS_PATH=str(graphs)))
    assert run.returncode == 0, run.stderr[-3000:]
    irs = sorted(glob.glob(str(graphs / "*validate*.ir")))
    names = {}
    for path in irs:
        with open(path) as f:
            text = f.read()
        graph = re.search(r"mindgrpo_\w+?_(\w+)_construct", text)
        for prim in set(re.findall(r"PrimFunc_(\w+)", text)):
            names.setdefault(prim, set()).add(graph.group(1) if graph else os.path.basename(path))
    assert len(irs) >= 7 and {"MatMul", "Softmax", "AdamWeightDecay"} <= set(names), (len(irs), sorted(names))
    table = {name: platforms(name) for name in sorted(names)}
    print("\n".join(f"{n:<24} {' '.join(p) if p else '(none stated)':<18} {', '.join(sorted(names[n]))}"
                    for n, p in table.items()))
    without_ascend = {n: p for n, p in table.items() if p is not None and "Ascend" not in p}
    assert not without_ascend, without_ascend
    undocumented = {n for n, p in table.items() if p is None}
    assert undocumented <= UNDOCUMENTED, undocumented
