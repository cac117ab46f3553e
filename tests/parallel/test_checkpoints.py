"""Crash-safe training checkpoints (mindgrpo/parallel/checkpoint_folders.py, checkpoints.py and, with ranks as
threads, mindgrpo/parallel/sharded_checkpoints.py): the manifest, resuming from the newest complete checkpoint,
damaged ones skipped or refused, leftovers removed, abandoned steps set aside."""

import hashlib
import json
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import mindspore as ms

from mindgrpo.parallel import checkpoint_folders as folders
from mindgrpo.parallel import checkpoints as ck
from mindgrpo.parallel.sharded_checkpoints import ShardedCheckpoints
from mindgrpo.parallel.comm import Group

MODEL = {"hidden_size": 8, "vocab_size": 16}


def params(seed, prefix=""):
    rng = np.random.default_rng(seed)
    return {"policy": [ms.Parameter(ms.Tensor(rng.standard_normal((4, 3)).astype(np.float32)), name=prefix + "w"),
                       ms.Parameter(ms.Tensor(rng.standard_normal(5).astype(np.float32)), name=prefix + "b")],
            "optimizer": [ms.Parameter(ms.Tensor(rng.standard_normal((4, 3)).astype(np.float32)),
                                       name=prefix + "adam_m.w")]}


def state(step):
    return {"step": step, "optimizer_steps": 2 * step, "train_prompts": {"epoch": 0, "index": 3 * step},
            "val_history": [0.5], "bad_steps": {"total": 0, "in_a_row": 0}, "config": {"x": 1}}


def values(groups):
    return {g: [p.asnumpy().copy() for p in ps] for g, ps in groups.items()}


def same(a, b):
    return all(np.array_equal(x, y) for g in a for x, y in zip(a[g], b[g]))


@pytest.fixture()
def run(tmp_path):
    """Checkpoints of steps 1, 2, 3 (each of other weights) under tmp_path/ckpt."""
    root = str(tmp_path / "ckpt")
    saved = {}
    for step in (1, 2, 3):
        groups = params(step)
        ck.save(root, step, groups, state(step), MODEL, keep_last=5)
        saved[step] = values(groups)
    return root, saved


def step_dir(root, step):
    return os.path.join(root, f"step_{step:08d}")


def test_the_manifest_lists_every_file_with_its_size_and_sha256(run):
    root, _ = run
    assert sorted(os.listdir(root)) == ["step_00000001", "step_00000002", "step_00000003"]
    folder = step_dir(root, 3)
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert manifest["step"] == 3
    listed = set(manifest["files"])
    assert listed == set(os.listdir(folder)) - {"manifest.json"}
    assert listed == {"policy.ckpt", "optimizer.ckpt", "state.json", "config.json"}
    for name, entry in manifest["files"].items():
        data = open(os.path.join(folder, name), "rb").read()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def damage(folder, how):
    if how == "truncated policy.ckpt":
        with open(os.path.join(folder, "policy.ckpt"), "r+b") as f:
            f.truncate(os.path.getsize(os.path.join(folder, "policy.ckpt")) // 2)
    elif how == "flipped byte in optimizer.ckpt":
        path = os.path.join(folder, "optimizer.ckpt")
        data = bytearray(open(path, "rb").read())
        data[-5] ^= 0xFF
        open(path, "wb").write(bytes(data))
    elif how == "missing state.json":
        os.remove(os.path.join(folder, "state.json"))
    elif how == "garbled state.json":
        open(os.path.join(folder, "state.json"), "w").write('{"step": 3, "optimizer_')
    elif how == "missing manifest":
        os.remove(os.path.join(folder, "manifest.json"))
    elif how == "garbled manifest":
        open(os.path.join(folder, "manifest.json"), "w").write("{\"format\": 1, \"step\"")
    else:
        raise ValueError(how)


REASONS = {"truncated policy.ckpt": "policy.ckpt has", "flipped byte in optimizer.ckpt": "optimizer.ckpt does not match",
           "missing state.json": "state.json is missing", "garbled state.json": "state.json has",
           "missing manifest": "no manifest.json", "garbled manifest": "manifest.json is garbled"}


@pytest.mark.parametrize("how", list(REASONS))
def test_resume_skips_a_damaged_checkpoint_naming_the_reason_and_takes_the_next_older(run, how, caplog):
    root, saved = run
    damage(step_dir(root, 3), how)
    checkpoints = ck.LocalCheckpoints(root, keep_last=5)
    with caplog.at_level(logging.WARNING, logger="mindgrpo.parallel.checkpoint_folders"):
        assert checkpoints.find() == step_dir(root, 2)
    assert any(step_dir(root, 3) in r.getMessage() and REASONS[how] in r.getMessage() for r in caplog.records), \
        caplog.text
    groups = params(9)
    assert checkpoints.load(step_dir(root, 2), groups, MODEL)["step"] == 2
    assert same(values(groups), saved[2])
    # the explicit --resume_from of the damaged one fails naming the reason, touching no weight
    groups = params(9)
    with pytest.raises(folders.DamagedCheckpoint, match=REASONS[how]):
        checkpoints.find(step_dir(root, 3))
    with pytest.raises(folders.DamagedCheckpoint, match=REASONS[how]):
        checkpoints.load(step_dir(root, 3), groups, MODEL)
    assert same(values(groups), values(params(9)))


def test_nothing_complete_finds_nothing(tmp_path):
    root = str(tmp_path / "ckpt")
    assert ck.LocalCheckpoints(root, 2).find() is None
    ck.save(root, 1, params(1), state(1), MODEL, keep_last=2)
    os.remove(os.path.join(step_dir(root, 1), "manifest.json"))
    assert ck.LocalCheckpoints(root, 2).find() is None


@pytest.mark.parametrize("bad_state, reason", [
    ({"optimizer_steps": "2"}, "state.json has no int 'optimizer_steps'"),
    ({"train_prompts": {"epoch": 0}}, "state.json has no train_prompts"),
    ({"step": 7}, "state.json is of step 7"),
])
def test_a_state_that_is_complete_but_wrong_is_damaged(tmp_path, bad_state, reason):
    root = str(tmp_path / "ckpt")
    ck.save(root, 1, params(1), {**state(1), **bad_state}, MODEL, keep_last=2)
    groups = params(5)
    with pytest.raises(folders.DamagedCheckpoint, match=reason):
        ck.LocalCheckpoints(root, 2).load(step_dir(root, 1), groups, MODEL)
    assert same(values(groups), values(params(5)))


def test_a_checkpoint_of_another_model_or_without_a_group_touches_no_weight(run):
    root, _ = run
    groups = params(5)
    with pytest.raises(folders.CheckpointError, match="holds another model: hidden_size 8, this run's 16"):
        ck.load(step_dir(root, 2), groups, {**MODEL, "hidden_size": 16})
    with pytest.raises(folders.CheckpointError, match="has no reference.ckpt"):
        ck.load(step_dir(root, 2), {**groups, "reference": groups["policy"]}, MODEL)
    assert same(values(groups), values(params(5)))


def test_leftovers_of_killed_saves_are_removed_but_not_those_of_a_live_process(run):
    root, _ = run
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for name, owner in ((".step_00000004.tmp", int(dead.stdout)), (".step_00000005.tmp", None),
                        (".step_00000001.tmp-del-123", None), (".step_00000006.tmp", os.getpid())):
        os.makedirs(os.path.join(root, name, "policy"))
        if owner is not None:
            folders.write_json(os.path.join(root, name, folders.OWNER), {"host": os.uname().nodename, "pid": owner})
    removed = ck.LocalCheckpoints(root, 2).clean()
    assert sorted(os.path.basename(p) for p in removed) == [".step_00000001.tmp-del-123", ".step_00000004.tmp",
                                                            ".step_00000005.tmp"]
    assert sorted(os.listdir(root)) == [".step_00000006.tmp", "step_00000001", "step_00000002", "step_00000003"]


def test_resuming_an_older_step_sets_the_newer_aside_and_keep_last_k_ignores_them(run, caplog):
    root, saved = run
    checkpoints = ck.LocalCheckpoints(root, keep_last=1)
    with caplog.at_level(logging.WARNING, logger="mindgrpo.parallel.checkpoint_folders"):
        moved = checkpoints.set_aside_after(1, "this run resumed")
    assert len(moved) == 2 and all(os.path.basename(p).startswith(("abandoned_step_00000002.",
                                                                      "abandoned_step_00000003.")) for p in moved)
    assert "beyond step 1, where this run resumed" in caplog.text
    assert checkpoints.find() == step_dir(root, 1)
    checkpoints.save(2, params(22), state(2), MODEL)  # keep_last=1: step 1 goes, the set-aside stay
    assert sorted(d for d in os.listdir(root) if d.startswith("step_")) == ["step_00000002"]
    assert sorted(os.listdir(root)) == sorted(["step_00000002"] + [os.path.basename(p) for p in moved])
    for path in moved:  # whole, never deleted
        assert sorted(os.listdir(path)) == ["config.json", "manifest.json", "optimizer.ckpt", "policy.ckpt",
                                            "state.json"]


CRASH = """
import sys
import numpy as np, mindspore as ms
from mindgrpo.parallel import checkpoints as ck
p = [ms.Parameter(ms.Tensor(np.ones((4, 3), np.float32)), name="w")]
state = {"step": 2, "optimizer_steps": 2, "train_prompts": {"epoch": 0, "index": 0}, "val_history": [],
         "bad_steps": {"total": 0, "in_a_row": 0}, "config": {}}
ck.save(sys.argv[1], 2, {"policy": p, "optimizer": p}, state, {}, keep_last=2)
"""


def test_a_save_killed_between_files_leaves_no_step_and_its_leftover_is_removed(run):
    root, _ = run
    env = dict(os.environ, **{folders.CRASH_ENV: "2:policy.ckpt"})
    os.rename(step_dir(root, 2), os.path.join(root, "elsewhere"))
    r = subprocess.run([sys.executable, "-c", CRASH, root], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]
    assert sorted(os.listdir(root)) == [".step_00000002.tmp", "elsewhere", "step_00000001", "step_00000003"]
    assert sorted(os.listdir(os.path.join(root, ".step_00000002.tmp"))) == ["owner.json", "policy.ckpt"]
    assert ck.LocalCheckpoints(root, 2).clean() == [os.path.join(root, ".step_00000002.tmp")]


BEST_CRASH = CRASH.replace("keep_last=2)", f"keep_last=2, name={folders.BEST!r})")


def test_best_is_kept_beside_the_last_k_replaced_whole_and_a_killed_replacement_keeps_the_old(run):
    root, saved = run
    checkpoints = ck.LocalCheckpoints(root, keep_last=2)
    checkpoints.save(2, params(2), state(2), MODEL, name=folders.BEST)
    assert folders.inspect(os.path.join(root, "best"))["step"] == 2
    checkpoints.save(4, params(4), state(4), MODEL)  # keep_last=2 prunes steps 1 and 2, never best
    assert sorted(os.listdir(root)) == ["best", "step_00000003", "step_00000004"]
    checkpoints.save(3, params(3), state(3), MODEL, name=folders.BEST)  # replaced whole, nothing left aside
    assert sorted(os.listdir(root)) == ["best", "step_00000003", "step_00000004"]
    loaded = params(99)
    assert checkpoints.load(os.path.join(root, "best"), loaded, MODEL)["step"] == 3
    assert same(values(loaded), saved[3])
    # killed after writing the new best's manifest, before renaming it in: the old best is untouched
    env = dict(os.environ, **{folders.CRASH_ENV: "2:manifest.json"})
    r = subprocess.run([sys.executable, "-c", BEST_CRASH, root], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]
    assert ".step_00000002.tmp-best" in os.listdir(root) and folders.inspect(os.path.join(root, "best"))["step"] == 3
    assert checkpoints.clean() == [os.path.join(root, ".step_00000002.tmp-best")]
    # killed between setting the old best aside and renaming the new one in: the old one is put back
    os.rename(os.path.join(root, "best"), os.path.join(root, ".best.old"))
    checkpoints.clean()
    assert sorted(os.listdir(root)) == ["best", "step_00000003", "step_00000004"]
    assert folders.inspect(os.path.join(root, "best"))["step"] == 3
    # a best saved beyond the step a run resumes at belongs to the abandoned run
    moved = checkpoints.set_aside_after(3, "this run resumed")  # best (step 3) stays
    assert [os.path.basename(p).split(".")[0] for p in moved] == ["abandoned_step_00000004"]
    moved = checkpoints.set_aside_after(2, "this run resumed")
    assert sorted(os.path.basename(p).split(".")[0] for p in moved) == ["abandoned_best", "abandoned_step_00000003"]


# ------------------------------------------------------------------------------ msrun's version, ranks as threads


class ThreadComm:
    """What parallel/sharded_checkpoints.py uses of a Comm, for ranks that are threads of one process."""

    def __init__(self, rank, world, shared):
        self.rank, self.world, self.shared = rank, world, shared

    def group(self, ranks):
        return Group(tuple(ranks), self.rank, None)

    def host_sum(self, values, group):
        self.shared["values"][self.rank] = np.asarray(values)
        self.shared["barrier"].wait()
        out = sum(self.shared["values"][r] for r in range(self.world))
        self.shared["barrier"].wait()
        return out

    def barrier(self):
        self.shared["barrier"].wait()


def on_ranks(world, fn):
    """fn(rank, comm) on `world` threads; returns their results (or raised exceptions) in rank order."""
    shared = {"values": {}, "barrier": threading.Barrier(world, timeout=120)}
    results = [None] * world

    def body(rank):
        try:
            results[rank] = fn(rank, ThreadComm(rank, world, shared))
        except Exception as e:  # noqa: BLE001 - handed to the test
            results[rank] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def sharded(root, rank, comm):
    return ShardedCheckpoints(comm, root, keep_last=5, write_strategy=lambda path: open(path, "wb").write(b"strategy"))


def test_sharded_checkpoints_manifest_resume_and_damage(tmp_path):
    root = str(tmp_path / "ckpt")
    groups = {(step, rank): params(10 * step + rank) for step in (1, 2) for rank in (0, 1)}
    for step in (1, 2):
        on_ranks(2, lambda rank, comm: sharded(root, rank, comm).save(step, groups[step, rank], state(step), MODEL))
    folder = step_dir(root, 2)
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert sorted(manifest["files"]) == ["config.json", "optimizer/rank_0/optimizer.ckpt",
                                         "optimizer/rank_1/optimizer.ckpt", "policy/rank_0/policy.ckpt",
                                         "policy/rank_1/policy.ckpt", "state.json", "train_strategy.ckpt"]
    for rel, entry in manifest["files"].items():
        data = open(os.path.join(folder, rel), "rb").read()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def resume(rank, comm):
        part = sharded(root, rank, comm)
        path = part.find()
        mine = params(99)
        return path, part.load(path, mine, MODEL)["step"], values(mine)

    for rank, (path, step, got) in enumerate(on_ranks(2, resume)):
        assert path == folder and step == 2 and same(got, values(groups[2, rank]))
    # rank 1's piece of step 2 truncated: both ranks take step 1, each its own piece
    with open(os.path.join(folder, "policy", "rank_1", "policy.ckpt"), "r+b") as f:
        f.truncate(10)
    for rank, (path, step, got) in enumerate(on_ranks(2, resume)):
        assert path == step_dir(root, 1) and step == 1 and same(got, values(groups[1, rank]))

    def resume_from(rank, comm):
        return sharded(root, rank, comm).find(folder)

    errors = on_ranks(2, resume_from)
    damaged = folders.DamagedCheckpoint
    assert isinstance(errors[1], damaged) and "policy/rank_1/policy.ckpt has 10 bytes" in str(errors[1])
    assert isinstance(errors[0], damaged) and "rank(s) [1] found their files damaged" in str(errors[0])


def test_sharded_best_holds_every_rank_piece_beside_the_steps(tmp_path):
    root = str(tmp_path / "ckpt")
    groups = {(step, rank): params(10 * step + rank) for step in (1, 2) for rank in (0, 1)}
    for step in (1, 2):  # best replaced by step 2's
        on_ranks(2, lambda rank, comm: sharded(root, rank, comm).save(step, groups[step, rank], state(step), MODEL,
                                                                      name=folders.BEST))
    assert sorted(os.listdir(root)) == ["best"]

    def load_best(rank, comm):
        part, mine = sharded(root, rank, comm), params(99)
        return part.load(os.path.join(root, "best"), mine, MODEL)["step"], values(mine)

    for rank, (step, got) in enumerate(on_ranks(2, load_best)):
        assert step == 2 and same(got, values(groups[2, rank]))


def test_sharded_clean_refuses_a_folder_that_a_rank_does_not_share(tmp_path):
    """Ranks on other nodes whose checkpoint folder is their own (not on a shared file system): every rank
    fails at start-up naming them, before anything is saved; a shared folder passes and keeps no token."""
    shared, own = str(tmp_path / "shared"), str(tmp_path / "node1")
    errors = on_ranks(4, lambda rank, comm: sharded(shared if rank < 2 else own, rank, comm).clean())
    for e in errors:
        assert isinstance(e, folders.CheckpointError), e
        assert "rank(s) [2, 3] do not see the file rank 0 wrote there" in str(e)
    assert on_ranks(4, lambda rank, comm: sharded(shared, rank, comm).clean()) == [[]] * 4
    assert os.listdir(shared) == []


def test_sharded_resume_refuses_listings_that_differ_between_ranks(tmp_path):
    """Rank 1's listing lags (it sees step 1 only): no rank goes on to check its own candidates (which
    would leave the ranks waiting on each other), every rank names rank 1."""
    root, lagging = str(tmp_path / "ckpt"), str(tmp_path / "lagging")
    for where, steps in ((root, (1, 2)), (lagging, (1,))):
        for step in steps:
            on_ranks(2, lambda rank, comm: sharded(where, rank, comm).save(step, params(step), state(step), MODEL))
    errors = on_ranks(2, lambda rank, comm: sharded(root if rank == 0 else lagging, rank, comm).find())
    for e in errors:
        assert isinstance(e, folders.CheckpointError), e
        assert "rank(s) [1] see other step folders than rank 0 (steps [1, 2])" in str(e)


def test_load_params_writes_each_parameter_in_place_in_its_dtype_and_refuses_before_writing_any(tmp_path):
    """load_params reads the file memory-mapped and writes into the parameters themselves (ops.assign; bf16 by
    set_data, which the CPU's Assign lacks): the values and dtypes back exactly, and a name or shape that does not
    match leaves every parameter as it was."""
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((4, 3)).astype(np.float32), "h": rng.standard_normal(6).astype(np.float16),
              "s": np.array([7, -3], np.int32), "b": rng.standard_normal((2, 5)).astype(np.float32)}
    saved = [ms.Parameter(ms.Tensor(a), name=n) for n, a in arrays.items()]
    saved[-1] = ms.Parameter(ms.Tensor(arrays["b"]).astype(ms.bfloat16), name="b")
    path = str(tmp_path / "g.ckpt")
    ck.save_params(saved, path)

    def fresh():
        return [ms.Parameter(ms.Tensor(np.zeros(p.shape, np.float32)).astype(p.dtype), name=p.name) for p in saved]

    targets = fresh()
    ids, view = [id(p) for p in targets], targets[0].asnumpy()  # a view of the fp32 parameter's memory
    ck.load_params(path, targets)
    assert [id(p) for p in targets] == ids
    assert np.array_equal(view, arrays["w"])  # written in place, not a new tensor
    for p, q in zip(targets, saved):
        assert p.dtype == q.dtype
        assert np.array_equal(p.float().asnumpy() if p.dtype == ms.bfloat16 else p.asnumpy(),
                              q.float().asnumpy() if q.dtype == ms.bfloat16 else q.asnumpy())
    assert np.array_equal(targets[0].asnumpy(), arrays["w"])  # against the arrays written, not the loader's reading

    for bad, match in ((ms.Parameter(ms.Tensor(np.zeros(5, np.float32)), name="x"), "missing parameter 'x'"),
                       (ms.Parameter(ms.Tensor(np.zeros((3, 4), np.float32)), name="w"), r"'w' has shape \(4, 3\)")):
        targets = fresh()
        with pytest.raises(folders.CheckpointError, match=match):
            ck.load_params(path, targets[1:] + [bad])
        assert all(not np.any(p.float().asnumpy()) for p in targets)
