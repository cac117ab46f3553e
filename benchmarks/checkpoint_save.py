"""What the crash-safe checkpoint costs: saving ~1 GB of fp32 weights the old way against
`mindgrpo.parallel.checkpoints.save` (each file flushed to disk, hashed with SHA-256 on a worker
thread while the next file is written, a manifest, a durable rename), side by side in rounds.

    python -m benchmarks.checkpoint_save [--gb 1.0] [--rounds 3] [--dir /tmp] [--output FILE.json]

Also times the hashes alone on the written policy file (in the page cache): SHA-256 (what the
manifest uses; SHA-NI makes it the fastest of hashlib's here) and BLAKE2b, and fsync alone.
Writes benchmarks/results/checkpoint_save.{json,md} unless --output names another file.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile

import numpy as np

from benchmarks.harness import RESULTS, median, run_stamp, time_calls, write_results


def groups(gb: float):
    """A policy of `gb` GB and an optimizer of two moments (2 * gb): the files a checkpoint writes."""
    import mindspore as ms

    n = int(gb * 2**30 / 4 / 4)  # four fp32 tensors per group
    rng = np.random.default_rng(0)
    make = lambda prefix, k: [ms.Parameter(ms.Tensor(rng.standard_normal(n, dtype=np.float32)),  # noqa: E731
                                           name=f"{prefix}{i}") for i in range(k)]
    return {"policy": make("w", 4), "optimizer": make("adam_", 8)}


def old_save(root: str, step: int, parts: dict) -> None:
    """The save before manifests: each group file, state and config, one rename; nothing flushed."""
    import json

    from mindgrpo.parallel.checkpoints import save_params

    tmp = tempfile.mkdtemp(prefix=f".step_{step:08d}.", dir=root)
    for name, params in parts.items():
        save_params(params, os.path.join(tmp, f"{name}.ckpt"))
    for name in ("state.json", "config.json"):
        with open(os.path.join(tmp, name), "w") as f:
            json.dump({"step": step}, f)
    os.replace(tmp, os.path.join(root, f"step_{step:08d}"))


def hash_file(path: str, name: str) -> None:
    h = hashlib.new(name)
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of the policy file; the optimizer file is twice it")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to write (the disk under test)")
    ap.add_argument("--output", default=os.path.join(RESULTS, "checkpoint_save.json"))
    args = ap.parse_args(argv)
    from mindgrpo.parallel import checkpoints
    from mindgrpo.parallel.checkpoint_folders import fsync_path

    parts = groups(args.gb)
    state = {"step": 0, "optimizer_steps": 0, "train_prompts": {"epoch": 0, "index": 0}, "val_history": [],
             "bad_steps": {"total": 0, "in_a_row": 0}, "config": {}}
    work = tempfile.mkdtemp(prefix="ckpt_bench_", dir=args.dir)
    times = {k: [] for k in ("old save", "new save", "sha256", "blake2b", "fsync")}
    try:
        for r in range(args.rounds):
            for kind, save in (("old save", lambda root: old_save(root, r + 1, parts)),
                               ("new save", lambda root: checkpoints.save(root, r + 1, parts, dict(state, step=r + 1),
                                                                          {}, keep_last=1))):
                root = os.path.join(work, kind.replace(" ", "_"))
                os.makedirs(root, exist_ok=True)
                times[kind] += time_calls(lambda: save(root), 1)
                shutil.rmtree(os.path.join(root, f"step_{r + 1:08d}"))
            policy = os.path.join(work, "policy.ckpt")
            checkpoints.save_params(parts["policy"], policy)
            times["fsync"] += time_calls(lambda: fsync_path(policy), 1)
            for name in ("sha256", "blake2b"):
                times[name] += time_calls(lambda: hash_file(policy, name), 1)
            os.remove(policy)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: median(v) for k, v in times.items()}
    total_gb = 3 * args.gb
    res = {**run_stamp("benchmarks.checkpoint_save", argv), "gb_policy": args.gb, "gb_written": total_gb, "rounds": times,
           "median_s": med, "new_over_old": med["new save"] / med["old save"],
           "sha256_gb_per_s": args.gb / med["sha256"], "blake2b_gb_per_s": args.gb / med["blake2b"]}
    md = (f"# Checkpoint save: manifest, fsync and SHA-256 against the old save\n\n`{res['command']}` (from the repo root), "
          f"{res['date']}, {res['machine']}, load average {res['load_average']}\n\n"
          f"A checkpoint of {total_gb:.1f} GB ({args.gb:.1f} GB policy, {2 * args.gb:.1f} GB optimizer), median of "
          f"{args.rounds} rounds, the two saves alternating in each round:\n\n"
          "| | seconds | |\n|---|---|---|\n"
          f"| old save (no fsync, no manifest) | {med['old save']:.2f} | 1.00x |\n"
          f"| new save (fsync, SHA-256 on a worker thread, manifest, durable rename) | {med['new save']:.2f} | "
          f"{res['new_over_old']:.2f}x |\n\n"
          f"On the {args.gb:.1f} GB policy file alone (in the page cache): SHA-256 {med['sha256']:.2f} s "
          f"({res['sha256_gb_per_s']:.2f} GB/s), BLAKE2b {med['blake2b']:.2f} s ({res['blake2b_gb_per_s']:.2f} GB/s), "
          f"fsync {med['fsync']:.2f} s.\n")
    write_results(args.output, res, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
