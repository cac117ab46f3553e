"""mindgrpo/utils/staging.py: folders of killed writers removed, running writers' kept, whole-folder swaps."""

import os
import socket
import subprocess
import sys
import time

import pytest

from mindgrpo.utils import staging


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def folder(parent, name, files=("part",)):
    path = parent / name
    path.mkdir()
    for f in files:
        (path / f).write_text("x")
    return path


def age(path, seconds):
    then = time.time() - seconds
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(os.path.join(root, name), (then, then))
    os.utime(path, (then, then))


def test_only_folders_of_gone_writers_are_removed(tmp_path):
    host = socket.gethostname()
    final = tmp_path / "out.mindrecord"
    dead = folder(tmp_path, f".out.mindrecord.tmp-{host}-{dead_pid()}-abcd1234")
    running = folder(tmp_path, f".out.mindrecord.tmp-{host}-{os.getpid()}-abcd1234")
    other_host_new = folder(tmp_path, f".out.mindrecord.tmp-other-host-{dead_pid()}-abcd1234")
    other_host_old = folder(tmp_path, f".out.mindrecord.tmp-other-host-{dead_pid()}-efgh5678")
    unnamed_new = folder(tmp_path, ".out.mindrecord.tmp-k2j4h5g6")  # the naming before owners were recorded
    unnamed_old = folder(tmp_path, ".out.mindrecord.tmp-q9w8e7r6")
    other_output = folder(tmp_path, f".other.mindrecord.tmp-{host}-{dead_pid()}-abcd1234")
    age(other_host_old, staging.STALE_AFTER_S + 60)
    age(unnamed_old, staging.STALE_AFTER_S + 60)

    removed = staging.remove_stale(str(final))
    assert sorted(removed) == sorted(map(str, [dead, other_host_old, unnamed_old]))
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {p.name for p in (running, other_host_new, unnamed_new, other_output)}


def test_staging_dir_names_its_owner_and_cleans_first(tmp_path):
    final = tmp_path / "model"
    dead = folder(tmp_path, f".model.tmp-{socket.gethostname()}-{dead_pid()}-abcd1234")
    stage = staging.staging_dir(str(final))
    assert not dead.exists()
    assert os.path.basename(stage).startswith(f".model.tmp-{socket.gethostname()}-{os.getpid()}-")
    assert os.listdir(stage) == []


def test_replace_dir_swaps_the_whole_folder_and_carries_kept_files(tmp_path):
    final = folder(tmp_path, "hf", ["config.json", "a.safetensors", "b.safetensors", "tokenizer.json"])
    (final / "notes").mkdir()
    (final / "notes" / "README").write_text("mine")
    new = staging.staging_dir(str(final))
    (tmp_path / new / "config.json").write_text("new")
    assert staging.carry_over(str(final), new, lambda n: n in ("tokenizer.json", "notes")) == ["notes", "tokenizer.json"]
    staging.replace_dir(new, str(final))
    assert sorted(os.listdir(final)) == ["config.json", "notes", "tokenizer.json"]
    assert (final / "config.json").read_text() == "new" and (final / "notes" / "README").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_a_writer_killed_between_the_renames_leaves_the_old_folder(tmp_path, monkeypatch):
    final = folder(tmp_path, "hf", ["old.safetensors"])
    new = staging.staging_dir(str(final))
    (tmp_path / new / "new.safetensors").write_text("new")
    real_rename = os.rename

    def die_on_second(src, dst):
        if src == new:
            raise KeyboardInterrupt  # the process dies here
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", die_on_second)
    with pytest.raises(KeyboardInterrupt):
        staging.replace_dir(new, str(final))
    monkeypatch.undo()
    assert not final.exists()
    # the next run, once the writer is gone: the old folder goes back, the new one is removed
    for entry in tmp_path.iterdir():
        owner = f"{socket.gethostname()}-{os.getpid()}-"
        entry.rename(entry.with_name(entry.name.replace(owner, f"{socket.gethostname()}-{dead_pid()}-")))
    staging.remove_stale(str(final))
    assert sorted(os.listdir(tmp_path)) == ["hf"] and os.listdir(final) == ["old.safetensors"]


def test_write_text_replaces_a_file_whole_or_leaves_it(tmp_path, monkeypatch):
    final = tmp_path / "summary.json"
    staging.write_text(str(final), "one")
    staging.write_text(str(final), "two")
    assert final.read_text() == "two" and os.listdir(tmp_path) == ["summary.json"]

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(staging.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        staging.write_text(str(final), "three")
    assert final.read_text() == "two" and os.listdir(tmp_path) == ["summary.json"]  # no half file, no folder left
