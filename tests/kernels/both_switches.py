"""Running a test module's `run(out_path, ir_folder)` twice side by side, in two processes, with our CPU matmul on
(MINDGRPO_CPU_KERNELS=1) and off (0): each process compiles its graphs alone, so the two sides' numbers differ by the
kernels only, and each saves its compiled graphs' last form for `nodes` to count."""

import glob
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run_both(tmp_path, module: str):
    """(ours, MindSpore's): the npz files `module.run` wrote with the switch on and off; the compiled graphs in
    tmp_path / "ir1" and "ir0". Skips where the kernel cannot build."""
    from mindgrpo.kernels import build as kbuild

    if kbuild.library_path() is None:
        pytest.skip("scipy-openblas32 is not installed")
    kbuild.build()
    procs = {}
    for switch in ("1", "0"):
        env = dict(os.environ, MINDGRPO_CPU_KERNELS=switch, PYTHONPATH=ROOT)
        code = f"import sys; sys.path.insert(0, {HERE!r}); import {module} as t; " \
               f"t.run({str(tmp_path / switch) + '.npz'!r}, {str(tmp_path / ('ir' + switch))!r})"
        procs[switch] = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for switch, proc in procs.items():
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"MINDGRPO_CPU_KERNELS={switch}: {out[-3000:]}"
    return np.load(tmp_path / "1.npz"), np.load(tmp_path / "0.npz")


def nodes(folder, name: str) -> int:
    """`name(` nodes in the last form of the compiled graphs MindSpore saved into folder."""
    count = 0
    for final in glob.glob(os.path.join(str(folder), "hwopt_common_final_graph_*.ir")):
        with open(final) as f:
            count += f.read().count(name + "(")
    return count
