"""Probe (not a benchmark): where a whole GRPO step's time goes, by kind of op, under MindSpore's CPU profiler: our side
of `benchmarks.step_memory` (the issue-20 workload at the Qwen2.5-0.5B shape cut to --layers layers, the memory
switches on as `--switches on` sets them) with its `--set` overrides.

    python -m benchmarks.probes.step_profile [--layers 4] [--set KEY=VALUE ...] [--top 25]

Two steps run first (the first compiles; with release_graphs every step compiles again), then a third under
`ms.Profiler`. Printed: each phase's seconds and compile seconds in that step, the ops' total, and the op types by
total time, split as benchmarks.probes.decode_profile splits them (`head`: an input with a vocabulary-sized
dimension, the head's products and its softmax, gradients and accumulation; `layers`: every other op, rollout,
reference and update together). The step's wall less its ops' total is compiling and the host between the graphs.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for our side")
    ap.add_argument("--top", type=int, default=25, help="op types in the table")
    args = ap.parse_args(argv)
    import mindspore as ms

    from benchmarks import step_memory
    from benchmarks.probes.decode_profile import read_ops
    from mindgrpo.utils import compiles

    ms.set_context(mode=ms.GRAPH_MODE)
    compiles.install()
    folder = tempfile.mkdtemp(prefix="step_profile_")
    switches, extra = step_memory.SETTINGS["on"]
    cfg, paths, _, _ = step_memory.setup(folder, args.layers, switches, (*extra, *args.set))
    parts, trainer = step_memory.build_trainer(cfg, paths, folder)
    memory = step_memory._PhaseMemory(trainer.progress)  # each phase's seconds and compile seconds
    for _ in range(2):
        trainer.train_step()
        trainer.step += 1
    memory.records.clear()
    with tempfile.TemporaryDirectory() as profile:
        prof = ms.Profiler(output_path=profile)
        t0 = time.perf_counter()
        trainer.train_step()
        wall = time.perf_counter() - t0
        prof.stop()
        prof.analyse()
        ops = read_ops(profile, parts.policy.config.vocab_size)
    total = sum(ms_ for ms_, _ in ops.values())
    print(f"step 3 under the profiler: {wall:.1f} s, ops {total / 1000:.1f} s; layers {args.layers}, --set "
          f"{' '.join(args.set) or '(none)'}")
    print("phases (s, of it compiling): " + ", ".join(f"{r['phase']} {r['seconds']:.1f} ({r['compile_s']:.1f})"
                                                      for r in memory.records if r["seconds"] >= 0.05))
    print(f"{'part':6s} {'op type':28s} {'s':>8s} {'calls':>8s} {'share':>7s}")
    for (part, op), (ms_, calls) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{part:6s} {op:28s} {ms_ / 1000:8.2f} {calls:8d} {100 * ms_ / total:6.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
