"""How the suite runs itself (tests/conftest.py): what collection imported is left out of garbage
collection, the files it runs first exist, and no two test files share a name."""

import gc
import os


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
