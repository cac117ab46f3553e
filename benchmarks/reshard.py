"""Online resharding (mindgrpo.parallel.reshard.Reshard) against the disk path, under msrun on CPU.

    python -m benchmarks.reshard [--case tp2-to-dp2] [--repeats 3] [--layers 4] [--workdir /tmp]

launches itself on msrun workers for one case of CASES (source and destination layouts; pipeline
stages on the source side as the 7B config trains), and times, for the same model and weights:
  online     Reshard(policy -> inference) after its warm-up call (which compiles the bucket
             graphs): collectives, bucket by bucket, no host copy
  transport  the online path's collectives alone, on the contributions it sends (its floor)
  disk, ms   every rank saves its policy piece; rank 0 runs mindspore.parallel.transform_checkpoints
             (training strategy -> inference strategy); every rank loads its new piece
  disk, ours the same with scripts/transform_checkpoint.py (numpy engine) for the middle step
Barriers (a one-number all-reduce) separate the steps; seconds are the slowest rank's wall time.
Bytes: what each rank receives online, and the minimum the two layouts require (the pieces of
its destination shard it does not hold). The temporary directory is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import REPO, machine, time_calls

# vocab 32000, hidden 1024, 16 heads / 8 kv heads, untied: 113 M parameters, 453 MB fp32 with 4 layers
CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
              num_key_value_heads=8, tie_word_embeddings=False, max_position_embeddings=512)
# case -> (train (dp, tp, pp), inference (dp, tp, pp)); workers = their world size
CASES = {"tp2-to-dp2": ((1, 2, 1), (2, 1, 1)), "pp2-to-dp2": ((1, 1, 2), (2, 1, 1)),
         "dp2tp2-to-tp4": ((2, 2, 1), (1, 4, 1)), "tp2pp2-to-dp2tp2": ((1, 2, 2), (2, 2, 1))}


def worker(args) -> None:
    import numpy as np
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    from mindspore.parallel import transform_checkpoints

    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.convert import expected_shapes
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM
    from mindgrpo.parallel.comm import init_comm
    from mindgrpo.parallel.layout import ParallelLayout
    from mindgrpo.parallel.pipeline import stage_spec
    from mindgrpo.parallel.reshard import Reshard, named_parameters
    from mindgrpo.parallel.strategy import write_strategy_file
    from mindgrpo.parallel.tp_layers import TensorParallelLayers

    train, infer = (ParallelLayout(*t) for t in CASES[args.case])
    comm = init_comm(train, infer)
    rank, work = comm.rank, Path(args.workdir)
    cfg = Qwen2Config(num_hidden_layers=args.layers, **CONFIG)
    shapes = expected_shapes(cfg)
    stage = stage_spec(train, train.stage(rank), cfg.num_hidden_layers)
    policy = Qwen2ForCausalLM(cfg, seed=1, max_positions=64, layers=TensorParallelLayers(comm.train_tp), stage=stage)
    inference = Qwen2ForCausalLM(cfg, seed=2, max_positions=64, layers=TensorParallelLayers(comm.infer_tp))
    if rank == 0:
        write_strategy_file(str(work / "train.ckpt"), train, shapes)
        write_strategy_file(str(work / "infer.ckpt"), infer, shapes)

    def timed(fn):  # the slowest rank's wall time: barriers before and after
        return time_calls(lambda: (fn(), comm.barrier()), 1, before=comm.barrier)[0]

    sync = Reshard(policy, inference, train, infer, comm, shapes)
    first = timed(sync)
    online = [timed(sync) for _ in range(args.repeats)]
    expected = {n: p.asnumpy().copy() for n, p in named_parameters(inference).items()}

    dst_params = named_parameters(inference)

    def disk(engine: str):
        src, dst = work / f"src_{engine}", work / f"dst_{engine}"

        def run():
            os.makedirs(src / f"rank_{rank}", exist_ok=True)
            ms.save_checkpoint([{"name": n, "data": p} for n, p in named_parameters(policy).items()],
                               str(src / f"rank_{rank}" / f"ck_{rank}.ckpt"))
            comm.barrier()
            if rank == 0:
                if engine == "mindspore":
                    transform_checkpoints(str(src), str(dst), "ck_", str(work / "train.ckpt"), str(work / "infer.ckpt"))
                else:
                    subprocess.run([sys.executable, "-m", "scripts.transform_checkpoint",
                                    f"--src_checkpoint={src}", f"--src_strategy={work / 'train.ckpt'}",
                                    f"--dst_strategy={work / 'infer.ckpt'}", f"--dst_checkpoint={dst}",
                                    "--prefix=ck_"], check=True, capture_output=True, cwd=REPO)
            comm.barrier()
            loaded = ms.load_checkpoint(str(dst / f"rank_{rank}" / f"ck_{rank}.ckpt"))
            for n, p in dst_params.items():
                p.set_data(loaded[n])

        seconds = timed(run)
        same = all(np.array_equal(p.asnumpy(), expected[n]) for n, p in dst_params.items())
        comm.barrier()
        if rank == 0:
            shutil.rmtree(src)
            shutil.rmtree(dst)
        return seconds, same

    # the transport's floor: the online path's collectives alone, each on the contribution it sends
    sends = [(collective, contribution(ms.mutable(tuple(p.value() for p in src) + graph.none)))
             for graph, src, _ in sync.buckets for contribution, collective in graph.exchanges]

    def transport():
        for collective, x in sends:
            collective(x).asnumpy()

    floor = statistics.median(timed(transport) for _ in range(args.repeats)) if sends else 0.0

    ms_seconds, ms_same = disk("mindspore")
    ours_seconds, ours_same = disk("ours")
    result = dict(rank=rank, train=list(CASES[args.case][0]), infer=list(CASES[args.case][1]), params=cfg.num_params(),
                  model_bytes=4 * cfg.num_params(), first_call_s=first, online_s=online,
                  disk_mindspore_s=ms_seconds, disk_ours_s=ours_seconds, disk_results_equal=ms_same and ours_same,
                  bytes_received=sync.received, bytes_min=sync.minimum, max_bucket_bytes=sync.max_bucket_bytes,
                  transport_s=floor)
    with open(work / f"result_{rank}.json", "w") as f:
        json.dump(result, f)


def launch(args) -> None:
    from mindgrpo.parallel.layout import ParallelLayout

    work = Path(tempfile.mkdtemp(prefix="reshard_bench_", dir=args.workdir))
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        msrun = shutil.which("msrun") or str(Path(sys.executable).parent / "msrun")
        workers = ParallelLayout(*CASES[args.case][0]).world_size
        cmd = [msrun, f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_port",
               str(port), "--log_dir", str(work / "log"), "--join", "True", __file__, "--role", "worker", "--case",
               args.case, "--repeats", str(args.repeats), "--layers", str(args.layers), "--workdir", str(work)]
        # msrun starts its workers with the `python` on PATH: this interpreter's, venv activated or not
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO, PATH=path))
        if proc.returncode:
            logs = "".join("\n".join(ln for ln in p.read_text().splitlines()
                                     if not ln.startswith(("[WARNING]", "[INFO]")))[-3000:]
                           for p in sorted((work / "log").glob("worker_*.log")))
            raise SystemExit(f"msrun failed ({proc.returncode}):\n{logs}")
        results = [json.loads((work / f"result_{r}.json").read_text()) for r in range(workers)]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    r0 = results[0]
    online = max(statistics.median(r["online_s"]) for r in results)
    disk_ms = max(r["disk_mindspore_s"] for r in results)
    disk_ours = max(r["disk_ours_s"] for r in results)
    mb = 2 ** 20
    def name(t):
        return f"dp{t[0]} x tp{t[1]}" + (f" x pp{t[2]}" if t[2] > 1 else "")

    print(f"## Online resharding vs the disk path: train {name(r0['train'])} -> infer {name(r0['infer'])}, "
          f"{workers} msrun workers on CPU\n")
    print(f"Model: {r0['params'] / 1e6:.1f} M parameters ({r0['model_bytes'] / mb:.0f} MB fp32), "
          f"{args.layers} layers; {args.repeats} online repeats. Machine: {machine()}\n")
    print("| path | seconds (slowest rank) | time / online's |")
    print("|------|------------------------|-----------|")
    print(f"| online `Reshard` (warm; median) | {online:.3f} | 1.0x |")
    print(f"| online, first call (compiles {args.layers + 3} bucket graphs) | "
          f"{max(r['first_call_s'] for r in results):.2f} | |")
    floor = max(r["transport_s"] for r in results)
    print(f"| (floor) its collectives alone, on what each rank sends | {floor:.3f} | {floor / online:.2f}x |")
    print(f"| disk: save pieces + `mindspore.parallel.transform_checkpoints` + load | {disk_ms:.2f} | "
          f"{disk_ms / online:.1f}x |")
    print(f"| disk: save pieces + scripts/transform_checkpoint.py (numpy) + load | {disk_ours:.2f} | "
          f"{disk_ours / online:.1f}x |")
    print(f"\nDisk results equal the online ones on every rank: {all(r['disk_results_equal'] for r in results)}\n")
    print("| rank | received online | minimum for the layouts | largest bucket |")
    print("|------|-----------------|-------------------------|----------------|")
    for r in results:
        print(f"| {r['rank']} | {r['bytes_received'] / mb:.1f} MB | {r['bytes_min'] / mb:.1f} MB | "
              f"{r['max_bucket_bytes'] / mb:.1f} MB |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="tp2-to-dp2", choices=sorted(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs) for inspection")
    ap.add_argument("--role", default="launcher", help=argparse.SUPPRESS)  # msrun would take "--worker..."
    args = ap.parse_args(argv)
    worker(args) if args.role == "worker" else launch(args)


if __name__ == "__main__":
    main()
