import gc
import os

import pytest

from mindgrpo.utils.malloc import with_allocator

# The test files that take longest, run first: with `-n 2 --dist loadfile` a file runs whole on one
# worker, so a long file started late leaves the other worker idle at the end. Longest first keeps both
# busy. Files not named here follow in collection order (tests/test_suite.py checks that these exist).
# Seconds: the files' tests among the 25 slowest of the fresh-clone CI of 6ebf90e (2026-11-29, 2 cores of an AMD
# EPYC Zen 4, -n 2; set-up included); "-": none of its tests among them.
HEAVY_FIRST = (
    # 420: the tiny recipe's run (warm start + 20 steps), LoRA, the 2-rank async run; + the reward model's (~165 s)
    "tests/grpo/test_learning.py",
    "tests/parallel/test_msrun.py",  # 355: the 2-rank job
    "tests/grpo/test_tool_learning.py",  # 338: the tiny tool recipe
    "tests/parallel/test_separate.py",  # 309: a 2-rank and a 3-rank job, one process (before sep0g and dp0t)
    "tests/grpo/test_chaos.py",  # 251: 9 processes
    "tests/parallel/test_pipeline.py",  # 217: the 4-rank job
    # 211 at the tiny default's full batch: two launchers, three 4-rank jobs, one process
    "tests/parallel/test_nodes.py",
    "tests/inference/test_layerwise_engine.py",  # 129
    "tests/kernels/test_engine_kernels.py",  # -: two processes of ~17 engine graphs each (198 s at load 6, 2026-11-30)
    "tests/parallel/test_lora_msrun.py",  # 86: the 2-rank LoRA job
    "tests/grpo/test_trainer_run.py",  # 84
    "tests/benchmarks/test_async_rollout_smoke.py",  # 70
    "tests/grpo/test_optim.py",  # 68
    "tests/grpo/test_lora_dropout_update.py",  # -: ~170 s of CPU (six updaters' graphs, a trainer), 2026-11-30
    "tests/benchmarks/test_rollout_smoke.py",  # 64
    "tests/grpo/test_recycle.py",  # 50
    "tests/parallel/test_device_check.py",  # 46
    "tests/parallel/test_launch.py",  # 43, mostly waiting (the stalled job's 20 s watchdog)
    "tests/grpo/test_off_policy.py",  # -: a 3-step run, a replay engine, transformers
    "tests/grpo/test_tool_run.py",  # -
    "tests/grpo/test_env_run.py",  # -
    "tests/inference/test_engine.py",  # -
    "tests/models/test_qwen2_parity.py",  # -
    "tests/models/test_qwen3_parity.py",  # -
    "tests/grpo/test_packing.py",  # -
)

# Every process the tests start (pytest-xdist's workers, the scripts, msrun and its ranks) with jemalloc
# preloaded when one is found (mindgrpo/utils/malloc.py): the suite is mostly graph compiles, ~0.8x the CPU
# with it. Set before xdist starts its workers, which inherit it.
os.environ.update(with_allocator(os.environ))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")


def pytest_configure(config):
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")


def pytest_collection_finish(session):
    """Leave what collection made (every test module and what they import: torch, transformers, trl,
    MindSpore; ~575k objects for the whole suite) out of every later garbage collection. MindSpore runs a
    full gc.collect() before it compiles each graph, which then takes ~0.6 s per graph in a test process:
    20 compiles of a one-op cell took 8 s of CPU, 0.7 s after gc.freeze(); tests/models/test_qwen2_parity.py
    (the suite collected, -k) 236 s of user CPU against 262 and 262 without, run alternately at load 5-7.
    Only live objects are frozen (garbage is collected first), and those live for the session anyway."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """HEAVY_FIRST's files first (stable: the order inside a file is kept). pyproject's addopts turn
    off xdist's own reordering (by number of tests per file), which would undo this."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def shared_dir():
    if not os.path.isdir(SHARED):
        pytest.skip(f"{SHARED} is absent (the real GSM8K and Qwen2.5 tokenizer live there)")
    return SHARED
