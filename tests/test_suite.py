"""How the suite runs itself (tests/conftest.py): what collection imported is left out of garbage
collection, and the files it runs first exist."""

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
