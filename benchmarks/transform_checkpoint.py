"""Time scripts/transform_checkpoint.py slicing a ~1.1 GB fp32 Qwen2 checkpoint for 8 ranks.

    python -m benchmarks.transform_checkpoint [--repeats 3] [--workdir /tmp] [--skip_mindspore]

The checkpoint (random weights, written by mindspore.save_checkpoint) and every output live in a
temporary directory that is removed at the end. Peers: a plain `shutil.copyfile` of the same
checkpoint (the bar: the transform should reach at least half of its MB/s), and MindSpore's own
`transform_checkpoints` (the script's `--engine mindspore`), timed once. Every run starts with the
source in the page cache, as the copy does, and with no dirty pages left from the run before
(`os.sync()` between runs, untimed). Seconds are the wall time of the whole transform (read,
check, slice, write, rename: `mindgrpo.parallel.transform`, which the script runs), in-process
after a warm-up; MB/s is given both for the checkpoint's bytes and for the bytes written (twice the
checkpoint with two dp replicas), and the last column compares the latter with the copy's MB/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.harness import machine, time_calls

# 3 layers of a 1.5B-like shape and a 32k vocabulary, untied: 1.09 GB in fp32; tp 8 divides
# the heads (16 / 8 kv), the vocabulary and the MLP.
CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=3,
              num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=False)
LAYOUTS = {"tp8": (1, 8), "dp2 x tp4": (2, 4)}


def make_checkpoint(path: str) -> int:
    import mindspore as ms

    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.convert import expected_shapes

    rng = np.random.default_rng(0)
    items = [{"name": name, "data": ms.Tensor(rng.standard_normal(shape, dtype=np.float32))}
             for name, shape in expected_shapes(Qwen2Config(**CONFIG)).items()]
    ms.save_checkpoint(items, path)
    return os.path.getsize(path)


def seconds(fn, cleanup, repeats: int):
    times = time_calls(fn, repeats, before=cleanup)
    cleanup()
    return statistics.median(times), times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="where the temporary directory goes (default: the system's)")
    ap.add_argument("--skip_mindspore", action="store_true", help="do not time MindSpore's transform_checkpoints")
    args = ap.parse_args()

    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.convert import expected_shapes
    from mindgrpo.parallel.layout import ParallelLayout
    from mindgrpo.parallel.strategy import write_strategy_file

    from mindgrpo.parallel.transform import TransformRequest, transform

    work = tempfile.mkdtemp(prefix="transform_bench.", dir=args.workdir)
    try:
        src = os.path.join(work, "full.ckpt")
        size = make_checkpoint(src)
        shapes = expected_shapes(Qwen2Config(**CONFIG))
        out = os.path.join(work, "out")
        copy = os.path.join(work, "copy.ckpt")

        def rm_out():  # and flush dirty pages, so no run pays for the previous run's writeback
            shutil.rmtree(out, ignore_errors=True)
            if os.path.exists(copy):
                os.remove(copy)
            os.sync()

        shutil.copyfile(src, copy)  # warm the page cache
        rows = []
        med, times = seconds(lambda: shutil.copyfile(src, copy), rm_out, args.repeats)
        copy_mbs = size / 1e6 / med
        rows.append(("shutil.copyfile (peer)", med, times, size))
        for label, (dp, tp) in LAYOUTS.items():
            strategy = write_strategy_file(os.path.join(work, f"{label.replace(' ', '')}.ckpt"),
                                           ParallelLayout(dp, tp), shapes)
            request = TransformRequest(src, out, dst_strategy=strategy)  # what the script runs for these options
            transform(request)  # warm-up
            med, times = seconds(lambda: transform(request), rm_out, args.repeats)
            transform(request)
            written = sum(os.path.getsize(f) for f in Path(out).glob("rank_*/*.ckpt"))
            rows.append((f"transform_checkpoint.py {label} (numpy engine)", med, times, written))
            if label == "tp8" and not args.skip_mindspore:
                mindspore = dataclasses.replace(request, engine="mindspore")
                med, times = seconds(lambda: transform(mindspore), rm_out, 1)
                rows.append((f"transform_checkpoint.py {label} --engine mindspore", med, times, written))
        rm_out()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"checkpoint: {size / 1e6:.1f} MB fp32, {CONFIG}; machine: {machine()}")
    print("| run | median s (all runs) | bytes written | checkpoint MB/s | written MB/s | written MB/s / copy's |")
    print("|-----|---------------------|---------------|-----------------|--------------|-----------------------|")
    for name, med, times, written in rows:
        print(f"| {name} | {med:.2f} ({', '.join(f'{t:.2f}' for t in times)}) | {written / 1e6:.1f} MB | "
              f"{size / 1e6 / med:.0f} | {written / 1e6 / med:.0f} | {written / 1e6 / med / copy_mbs:.2f} |")

if __name__ == "__main__":
    main()
