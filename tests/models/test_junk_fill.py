"""The vocabulary kernels over many launches, with every allocation filled with junk (jemalloc's
`junk:true`): a kernel that reads memory it did not write, or stops writing its output, shows it here
and nowhere else (glibc's malloc happens to hand it usable bytes).

MindSpore 2.10's CPU LogSoftmax kernel does, at times: after about a dozen launches of a graph its
output stays at an earlier launch's values (DEVELOPERS.md, "MindSpore 2.10 on a CPU"). The package
does not call it (first test); what replaced it (LogProbs, the filtered sampler) is held to float64
numpy on fresh inputs at every launch, junk-filled."""

import ast
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mindgrpo.utils.malloc import allocator

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHES = 40

PRELUDE = """
import json, sys
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops
ms.set_context(mode=ms.GRAPH_MODE)
rng = np.random.default_rng(0)

def log_softmax64(z):  # float64
    z = z.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))
"""


def run_junk_filled(tmp_path, body: str) -> list:
    """Run PRELUDE + body (from a file: MindSpore parses the cells' source) in a fresh process with
    jemalloc preloaded and junk-filling; body prints one JSON list (the worst error of each launch) as
    its last line."""
    lib = allocator({})
    if lib is None or "jemalloc" not in os.path.basename(lib):
        pytest.skip("no jemalloc found (scripts/setup_env.sh unpacks one into .venv/lib/jemalloc)")
    env = dict(os.environ, LD_PRELOAD=lib, MALLOC_CONF="junk:true", PYTHONPATH=REPO)
    script = tmp_path / "launches.py"
    script.write_text(PRELUDE + body)
    out = subprocess.run([sys.executable, str(script)], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_no_graph_of_the_package_calls_the_log_softmax_kernel():
    """Whether the kernel goes stale depends on the timings of its thread-count searches, so the tests
    below cannot be made to catch it on demand: the rule is held here, on the code."""
    found = []
    for folder, _, files in os.walk(os.path.join(REPO, "mindgrpo")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    tree = ast.parse(f.read(), path)
                found += [f"{os.path.relpath(path, REPO)}:{node.lineno}" for node in ast.walk(tree)
                          if isinstance(node, ast.Attribute) and node.attr in ("log_softmax", "LogSoftmax")
                          or isinstance(node, ast.Name) and node.id in ("log_softmax", "LogSoftmax")]
    assert not found, f"MindSpore 2.10's CPU LogSoftmax kernel can go stale (DEVELOPERS.md): {found}"


def test_logprobs_and_its_gradient_stay_exact_at_every_launch(tmp_path):
    errors = run_junk_filled(tmp_path, f"""
from mindgrpo.models.qwen2 import LogProbs

class Loss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.head = LogProbs()

    def construct(self, logits, labels, w):
        logp, ent = self.head(logits, labels, True)
        return (logp * w).sum(), ent

grad = ms.value_and_grad(Loss(), 0, has_aux=True)
n, v, errors = 64, 96, []
for _ in range({LAUNCHES}):
    x = (3 * rng.standard_normal((n, v))).astype(np.float32)
    labels = rng.integers(0, v, n).astype(np.int32)
    w = rng.standard_normal(n).astype(np.float32)
    (loss, ent), g = grad(Tensor(x), Tensor(labels), Tensor(w))
    logp = log_softmax64(x)
    p = np.exp(logp)
    want_g = -p * w[:, None]
    want_g[np.arange(n), labels] += w
    errors.append(max(abs(float(loss.asnumpy()) - float((w * logp[np.arange(n), labels]).sum())) / n,
                      float(np.abs(ent.asnumpy() + (p * logp).sum(-1)).max()),
                      float(np.abs(g.asnumpy() - want_g).max())))
print(json.dumps(errors))
""")
    assert len(errors) == LAUNCHES and max(errors) < 1e-5, errors


def test_the_filtered_samplers_scaled_logprobs_stay_exact_at_every_launch(tmp_path):
    errors = run_junk_filled(tmp_path, f"""
from mindgrpo.inference.sampling import Sampler, SamplingParams

sampler = Sampler(SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05), 64)
b, errors = 9, []
for _ in range({LAUNCHES}):
    logits = (3 * rng.standard_normal((b, 64))).astype(np.float32)
    u = rng.random(b).astype(np.float32)
    tok, _, scaled = sampler(Tensor(logits), Tensor(u), Tensor(np.full(b, 0.7, np.float32)))
    want = log_softmax64(logits / np.float32(0.7))[np.arange(b), tok.asnumpy()]
    errors.append(float(np.abs(scaled.asnumpy() - want).max()))
print(json.dumps(errors))
""")
    assert len(errors) == LAUNCHES and max(errors) < 1e-5, errors
