import gc
import os

import pytest

from mindgrpo.utils.malloc import with_allocator

# The test files that take longest, run first: with `-n 2 --dist loadfile` a file runs whole on one
# worker, so a long file started late leaves the other worker idle at the end. Longest first keeps both
# busy. Files not named here follow in collection order (tests/test_suite.py checks that these exist).
# xdist hands a worker its next file as soon as fewer than three of its tests are pending: the worker
# that takes test_learning.py (two tests) takes test_pipeline.py with it at the start, so the two msrun
# jobs (2 and 4 ranks) run at the same time only if the learning test ends before the 2-rank job.
# Seconds: the fresh-clone CI of e99273b (2026-11-26, -n 2, 2 cores), else of 2026-11-25.
HEAVY_FIRST = (
    "tests/parallel/test_nodes.py",  # 780 at load 13-17: two launchers, three 4-rank jobs and one process
    "tests/parallel/test_msrun.py",  # 760: the 2-rank job
    "tests/grpo/test_learning.py",  # 1230 (450 alone) before the shared warm start; + the 2-rank async run
    "tests/grpo/test_tool_learning.py",  # the tiny tool recipe: 505 (about 1,060 at load 6-12)
    "tests/parallel/test_pipeline.py",  # 500: the 4-rank job
    "tests/grpo/test_chaos.py",  # 205
    # 309 (fresh-clone CI of 6ebf90e, Zen 4): a 2-rank and a 3-rank job, one process; sep0g (two training ranks)
    # since added about 55 s of wall to the 3-rank job (566 s in all here at load 5-6)
    "tests/parallel/test_separate.py",
    "tests/grpo/test_off_policy.py",  # 190 at load 5: a 3-step run, a replay engine, transformers
    "tests/parallel/test_lora_msrun.py",  # 191 at load 5 (87 before its pp2 case): the 2-rank LoRA job
    "tests/grpo/test_trainer_run.py",  # over 170
    "tests/grpo/test_tool_run.py",  # ~120 at load 12
    "tests/grpo/test_env_run.py",  # 81 at load 1-2 (40 s of CPU): a build, a step with an environment, a validation
    "tests/parallel/test_launch.py",  # 64 alone, mostly waiting (the stalled job's 20 s watchdog)
    "tests/inference/test_engine.py",  # over 170
    "tests/benchmarks/test_rollout_smoke.py",  # 174
    "tests/models/test_qwen2_parity.py",  # ~130
    "tests/models/test_qwen3_parity.py",  # ~60 (135 under load)
    "tests/grpo/test_packing.py",  # over 90
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
