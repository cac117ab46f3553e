"""mindgrpo/utils/malloc.py: which allocator is preloaded, and a script that runs itself again with it."""

import os
import subprocess
import sys

import pytest

from mindgrpo.utils.malloc import ENV, allocator, with_allocator

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_environment_variable_chooses(tmp_path):
    assert allocator({ENV: "system"}) is None
    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"")
    assert allocator({ENV: str(lib)}) == str(lib)
    with pytest.raises(ValueError, match=f"{ENV}={tmp_path}/missing.so: no such file"):
        allocator({ENV: str(tmp_path / "missing.so")})


def test_with_allocator_puts_it_first_once_and_keeps_the_others(tmp_path):
    lib = str(tmp_path / "liba.so")
    open(lib, "wb").close()
    env = with_allocator({ENV: lib, "LD_PRELOAD": "/x/libb.so:/x/libc.so", "HOME": "/h"})
    assert env["LD_PRELOAD"] == f"{lib} /x/libb.so /x/libc.so" and env["HOME"] == "/h"
    assert with_allocator(env)["LD_PRELOAD"] == env["LD_PRELOAD"]
    assert "LD_PRELOAD" not in with_allocator({ENV: "system"})


SCRIPT = """
import os, sys
from mindgrpo.utils.malloc import reexec_with_allocator
print("pid", os.getpid(), "argv", sys.argv[1:], flush=True)
reexec_with_allocator()
mapped = any(line.rstrip().endswith("{name}") for line in open("/proc/self/maps"))
print("pid", os.getpid(), "mapped", mapped, "optimize", sys.flags.optimize)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux's")
def test_a_script_runs_again_in_the_same_process_with_the_library_mapped(tmp_path):
    lib = allocator()
    if lib is None:
        pytest.skip("no jemalloc here (scripts/setup_env.sh unpacks one into the venv where apt-get can fetch it)")
    script = tmp_path / "s.py"
    script.write_text(SCRIPT.format(name=os.path.basename(lib)))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = REPO
    out = subprocess.run([sys.executable, "-O", str(script), "a", "b"], env=env, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    first, again, last = out[0].split(), out[1], out[2].split()
    assert first[3:] == ["['a',", "'b']"] and again == out[0]  # ran twice: the same pid and arguments
    assert last[:2] == first[:2]
    assert last[2:] == ["mapped", "True", "optimize", "1"]  # the interpreter's own option (-O) kept


def test_the_test_processes_have_it_preloaded():
    lib = allocator()
    if lib is None:
        pytest.skip("no jemalloc here")
    assert lib in os.environ["LD_PRELOAD"].split()  # tests/conftest.py, for every process the tests start
