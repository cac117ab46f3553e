"""A device's first contact: about a minute of checks on a small random model (mindgrpo/parallel/device_check.py).

    python scripts/check_device.py [--device_target Ascend] [--dtype bfloat16]
    msrun --worker_num 2 --local_worker_num 2 scripts/check_device.py --device_target Ascend

One line per check (pass/fail and its figure; rank 0 prints them under msrun); exits 1 when any check failed.
Run it first on a new machine, before a recipe.
"""

from __future__ import annotations

import argparse
import sys

from mindgrpo.models.config import COMPUTE_DTYPES


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device_target", default="CPU", choices=["CPU", "Ascend", "GPU"])
    ap.add_argument("--dtype", default=None, choices=COMPUTE_DTYPES,
                    help="the compute dtype (default: bfloat16 on Ascend, float32 elsewhere)")
    ap.add_argument("--checks", default=None, help="comma-separated names (default: all)")
    args = ap.parse_args(argv)

    import mindspore as ms

    from mindgrpo.parallel.comm import world_size_from_env
    from mindgrpo.parallel.device_check import CHECKS, run_checks, world_comm

    names = args.checks.split(",") if args.checks else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        ap.error(f"unknown check {unknown[0]!r}; valid: {', '.join(CHECKS)}")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(args.device_target)
    dtype = args.dtype or ("bfloat16" if args.device_target == "Ascend" else "float32")
    comm = world_comm(world_size_from_env() or 1)
    results = run_checks(comm, dtype, names)
    if comm.rank == 0:
        print(f"check_device: {args.device_target}, {dtype}, {comm.world} process(es)")
        for r in results:
            print(f"{'pass' if r.ok else 'FAIL'}  {r.name:<12} {r.figure}", flush=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
