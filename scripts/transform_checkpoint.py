"""Slice a full MindSpore checkpoint into per-rank shards by a strategy file, merge shards back, or re-slice.

    # full -> shards: OUT_DIR/rank_k/<prefix>k.ckpt for every rank of the strategy
    python scripts/transform_checkpoint.py --src_checkpoint=FULL.ckpt --dst_checkpoint=OUT_DIR \
        --dst_strategy=STRATEGY_FILE_OR_DIR [--rank_id=K --world_size=N] [--format=safetensors]
    # shards -> full: OUT_DIR/rank_0/<prefix>0.ckpt, or the file itself if OUT ends in .ckpt/.safetensors
    python scripts/transform_checkpoint.py --src_checkpoint=SHARDS_DIR --src_strategy=STRATEGY --dst_checkpoint=OUT
    # shards -> other shards
    python scripts/transform_checkpoint.py --src_checkpoint=SHARDS_DIR --src_strategy=A --dst_strategy=B \
        --dst_checkpoint=OUT_DIR

A sharded source is MindSpore's layout, SHARDS_DIR/rank_k/*.ckpt. A strategy is a file, or a
directory of per-rank files; our layouts' files come from `--only_save_strategy True` of the
trainer, and files MindSpore wrote on Ascend (MindFormers, mindrlhf runs) work too.

Two engines give the same bytes (tests/scripts/test_transform_checkpoint.py checks it): mindspore
(`mindspore.parallel.transform_checkpoints`, every strategy MindSpore supports) and numpy (several
times faster, plain layouts only; benchmarks/transform_checkpoint.py). --engine auto (the default)
takes numpy when every layout is plain. Everything is checked before anything is written, and the
output appears complete or not at all. The work is `mindgrpo.parallel.transform`.
"""

from __future__ import annotations

import argparse
import sys

from mindgrpo.models.convert import WeightError
from mindgrpo.parallel.layout import LayoutError
from mindgrpo.parallel.strategy import StrategyError
from mindgrpo.parallel.transform import ENGINES, FORMATS, TransformError, TransformRequest, transform


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src_checkpoint", required=True, help="full checkpoint file, or a directory of rank_k/ shards")
    ap.add_argument("--dst_checkpoint", required=True, help="output directory (or a .ckpt file when merging)")
    ap.add_argument("--dst_strategy", help="strategy file or directory to slice for; none: merge into one")
    ap.add_argument("--src_strategy", help="strategy of a sharded --src_checkpoint")
    ap.add_argument("--prefix", default="checkpoint_", help="output names: rank_k/<prefix>k.ckpt")
    ap.add_argument("--rank_id", type=int, help="write this rank only (needs --world_size)")
    ap.add_argument("--world_size", type=int, help="the destination world; must match --dst_strategy")
    ap.add_argument("--format", choices=FORMATS, default="ckpt")
    ap.add_argument("--engine", choices=ENGINES, default="auto")
    args = ap.parse_args(argv)

    def progress(k: int, n: int, rank: int, nbytes: int, seconds: float, final: str) -> None:
        print(f"[{k}/{n}] rank {rank}: {nbytes / 1e6:.1f} MB -> {final} ({seconds:.2f}s)", flush=True)

    try:
        s = transform(TransformRequest(**vars(args)), progress)
    except (TransformError, StrategyError, LayoutError, WeightError, OSError) as e:
        print(f"transform_checkpoint: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"transformed {s['parameters']} parameters, {s['bytes_read'] / 1e6:.1f} MB read, "
          f"{s['bytes_written'] / 1e6:.1f} MB written, {s['ranks']} ranks, {s['seconds']:.2f}s "
          f"({s['bytes_read'] / 1e6 / max(s['seconds'], 1e-9):.0f} MB/s read, {s['engine']}) -> {s['output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
