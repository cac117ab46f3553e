"""Checkpoints from one parallel layout to another: a full checkpoint sliced into per-rank shards by a
strategy, shards merged back into one, or shards re-sliced for another strategy.

    summary = transform(TransformRequest(src_checkpoint=FULL, dst_checkpoint=OUT_DIR, dst_strategy=STRATEGY))

A sharded source is MindSpore's layout, SRC/rank_k/*.ckpt (the last file in name order when a rank
has several, as `transform_checkpoints` picks). A strategy is a file, or a directory of per-rank
files that is merged first (`mindgrpo.parallel.strategy`). Our layouts' files come from
`mindgrpo.parallel.strategy.write_layout_strategies`; files that MindSpore wrote on Ascend
(MindFormers, mindrlhf runs) are read by the same MindSpore functions, and the layouts the numpy
engine does not handle go to MindSpore's.

Two engines give the same bytes:
  mindspore  `mindspore.parallel.transform_checkpoints` / `transform_checkpoint_by_rank`; every
             strategy MindSpore supports (optimizer sharding, pipeline stages, nested layouts).
  numpy      memory-maps the source (`mindgrpo.models.ckpt_codec`) and writes each rank's slices
             straight to its file; several times faster (benchmarks/transform_checkpoint.py);
             plain layouts only.
engine "auto" takes numpy when every layout is plain, else mindspore.

Everything is checked before anything is written (`plan`): a weight missing from the checkpoint or
from a strategy, a shape a strategy cannot split, a device count that does not match; the error
names the parameter, and the option as scripts/transform_checkpoint.py spells it. Scalars missing
from the strategy (global_step and the like) are copied to every rank, as MindSpore does. Output is
written under a temporary name beside the destination and renamed when complete.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Optional

import numpy as np

from mindgrpo.models.ckpt_codec import State, read_checkpoint, read_ckpt, write_checkpoint
from mindgrpo.parallel.layout import OPTIMIZER_PREFIXES
from mindgrpo.parallel.strategy import TensorLayout, device_num, read_strategy, strategy_file

ENGINES = ("auto", "numpy", "mindspore")
FORMATS = ("ckpt", "safetensors")


class TransformError(ValueError):
    """Bad input to the transform; the message names the file or the parameter."""


@dataclass(frozen=True)
class TransformRequest:
    """What to transform (the options of scripts/transform_checkpoint.py)."""

    src_checkpoint: str  # a full checkpoint file, or a directory of rank_k/ shards
    dst_checkpoint: str  # the output directory (or a .ckpt/.safetensors file when merging into one)
    dst_strategy: Optional[str] = None  # strategy file or directory to slice for; None: merge into one
    src_strategy: Optional[str] = None  # the strategy of a sharded source
    prefix: str = "checkpoint_"  # output names: rank_k/<prefix>k.ckpt
    rank_id: Optional[int] = None  # write this rank only (needs world_size)
    world_size: Optional[int] = None  # the destination world; must match dst_strategy
    format: str = "ckpt"  # one of FORMATS
    engine: str = "auto"  # one of ENGINES

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise TransformError(f"engine {self.engine!r} is not one of {list(ENGINES)}")
        if self.format not in FORMATS:
            raise TransformError(f"format {self.format!r} is not one of {list(FORMATS)}")


# (k-th rank written, of n, the rank, its bytes, seconds since the writing began, its final file)
Progress = Callable[[int, int, int, int, float, str], None]


# ---------------------------------------------------------------------------- sources and checks

def source_files(path: str) -> Dict[int, str]:
    """rank -> checkpoint file: {0: path} for a file, else SHARDS_DIR/rank_k/<last *.ckpt or *.safetensors>."""
    if os.path.isfile(path):
        return {0: path}
    if not os.path.isdir(path):
        raise TransformError(f"{path}: no such checkpoint file or directory")
    files = {}
    for d in glob.glob(os.path.join(path, "rank_*")):
        suffix = os.path.basename(d)[len("rank_"):]
        found = sorted(glob.glob(os.path.join(d, "*.ckpt")) + glob.glob(os.path.join(d, "*.safetensors")))
        if suffix.isdigit() and found:
            files[int(suffix)] = found[-1]
    if not files:
        raise TransformError(f"{path}: no rank_k/*.ckpt checkpoints in the directory")
    return dict(sorted(files.items()))


def _is_scalar(dtype: str, arr: np.ndarray) -> bool:
    """Step counters, loss scales, strings: copied to every rank when no strategy lists them."""
    return dtype == "str" or arr.size <= 1


def check_transform(src: Dict[int, State], src_strategy: Optional[Dict[str, TensorLayout]],
                    dst_strategy: Optional[Dict[str, TensorLayout]], src_name: str) -> Dict[str, tuple]:
    """Everything that can be wrong with the inputs, named; returns name -> full shape. With
    pipeline stages in --src_strategy a rank holds the parameters of its stage only (rank r is on
    stage r // devices per stage)."""
    if src_strategy is not None:
        n = device_num(src_strategy, "--src_strategy")
        if sorted(src) != list(range(n)):
            raise TransformError(f"--src_strategy describes {n} devices, but {src_name} has shards for ranks "
                                 f"{sorted(src)}")
    names = set().union(*src.values())

    def held(rank, name):
        tl = (src_strategy or {}).get(name)
        return tl is None or rank // tl.device_num in tl.stages

    for rank, state in src.items():
        expected = {n for n in names if held(rank, n)}
        if set(state) != expected:
            diff = sorted(set(state) ^ expected)[0]
            raise TransformError(f"{src_name}: parameter {diff!r} is in some rank checkpoints but not in rank {rank}'s"
                                 if diff not in state else
                                 f"{src_name}: rank {rank} holds parameter {diff!r}, which --src_strategy puts on "
                                 "another pipeline stage")
    first = {}  # every parameter from the first rank holding it, in file order (the output keeps it)
    for state in src.values():
        first.update({n: v for n, v in state.items() if n not in first})
    full = {}
    for name, (dtype, arr) in first.items():
        shape, scalar = arr.shape, _is_scalar(dtype, arr)
        if src_strategy is not None and name in src_strategy:
            tl = src_strategy[name]
            shape = tl.full_shape(arr.shape)
            for rank, state in src.items():
                if name in state and tuple(state[name][1].shape) != tl.local_shape(name, shape):
                    raise TransformError(f"{src_name}: parameter {name!r} of rank {rank} has shape "
                                         f"{list(state[name][1].shape)}, but --src_strategy gives "
                                         f"{list(tl.local_shape(name, shape))}")
        elif src_strategy is not None and not scalar:
            raise TransformError(f"parameter {name!r} is in the checkpoint but not in --src_strategy")
        if dst_strategy is not None:
            if name in dst_strategy:
                dst_strategy[name].local_shape(name, shape)
            elif not scalar:
                raise TransformError(f"parameter {name!r} is in the checkpoint but not in --dst_strategy")
        full[name] = tuple(shape)
    for strategy, label in ((src_strategy, "--src_strategy"), (dst_strategy, "--dst_strategy")):
        for name in strategy or ():
            if name not in first and not name.startswith(OPTIMIZER_PREFIXES):
                raise TransformError(f"parameter {name!r} is in {label} but not in the checkpoint {src_name}")
    return full


# ---------------------------------------------------------------------------- engines


def merge_shards(src: Dict[int, State], strategy: Dict[str, TensorLayout], full: Dict[str, tuple]) -> State:
    """Shards of plain layouts -> full arrays."""
    out = {}
    for name, shape in full.items():
        dtype, arr0 = src[0][name]
        if name not in strategy:
            out[name] = (dtype, arr0)
            continue
        merged = np.empty(shape, arr0.dtype)
        for rank, state in src.items():
            merged[strategy[name].rank_slices(shape, rank)] = state[name][1]
        out[name] = (dtype, merged)
    return out


def numpy_engine(state: State, strategy, ranks: List[int], rank_path, fmt: str, log) -> int:
    """Write each rank's slices of a full state; returns bytes written. A rank whose slices equal
    an earlier rank's (a data-parallel replica) gets a copy of that file."""
    def index(name, arr, rank):
        if strategy is None or name not in strategy:
            return tuple(slice(None) for _ in arr.shape)
        return strategy[name].rank_slices(arr.shape, rank)

    total, written = 0, {}
    for rank in ranks:
        t0 = time.perf_counter()
        slices = {name: index(name, arr, rank) for name, (_, arr) in state.items()}
        key = tuple((s.start, s.stop) for idx in slices.values() for s in idx)
        if key in written:
            shutil.copyfile(written[key][0], rank_path(rank))
            n = written[key][1]
        else:
            n = write_checkpoint(rank_path(rank), ((name, dtype, arr[slices[name]])
                                                   for name, (dtype, arr) in state.items()), fmt)
            written[key] = (rank_path(rank), n)
        log(rank, n, time.perf_counter() - t0)
        total += n
    return total


def mindspore_engine(req: TransformRequest, src_files: Dict[int, str], ranks: List[int], rank_path, work: str,
                     log) -> int:
    """MindSpore's own transform into the staging directory; returns bytes written."""
    import mindspore as ms

    src_strategy = strategy_file(req.src_strategy, work) if req.src_strategy else None
    dst_strategy = strategy_file(req.dst_strategy, work) if req.dst_strategy else None
    src_dir = os.path.join(work, "src")
    for rank, file in src_files.items():  # MindSpore wants SRC/rank_k/*.ckpt
        os.makedirs(os.path.join(src_dir, f"rank_{rank}"))
        os.symlink(os.path.abspath(file), os.path.join(src_dir, f"rank_{rank}", os.path.basename(file)))
    out_dir = os.path.join(work, "out")
    t0 = time.perf_counter()
    try:
        if req.rank_id is not None:
            os.makedirs(os.path.join(out_dir, f"rank_{req.rank_id}"))
            need = ms.parallel.rank_list_for_transform(req.rank_id, src_strategy, dst_strategy)
            ms.parallel.transform_checkpoint_by_rank(
                req.rank_id, {r: src_files[r] for r in need},
                os.path.join(out_dir, f"rank_{req.rank_id}", f"{req.prefix}{req.rank_id}.ckpt"),
                src_strategy, dst_strategy)
        else:
            ms.parallel.transform_checkpoints(src_dir, out_dir, req.prefix, src_strategy, dst_strategy)
    except (ValueError, TypeError, RuntimeError, KeyError) as e:
        raise TransformError(f"MindSpore's transform failed: {str(e).splitlines()[0]}") from None
    total = 0
    for rank in ranks:
        produced = os.path.join(out_dir, f"rank_{rank}", f"{req.prefix}{rank}.ckpt")
        if req.format == "ckpt":
            os.replace(produced, rank_path(rank))
            n = sum(a.nbytes for _, a in read_ckpt(rank_path(rank)).values())
        else:
            tensors = ((k, d, a) for k, (d, a) in read_ckpt(produced).items())
            n = write_checkpoint(rank_path(rank), tensors, "safetensors")
        log(rank, n, time.perf_counter() - t0)
        total += n
    return total


# ---------------------------------------------------------------------------- output staging


def publish(stage: str, dst: str, single_file: bool) -> None:
    """Move the staged output into place: the file, the whole directory, or rank by rank."""
    if single_file:
        os.replace(os.path.join(stage, "rank_0", os.listdir(os.path.join(stage, "rank_0"))[0]), dst)
    elif not os.path.exists(dst):
        os.replace(stage, dst)
        return
    else:
        for d in sorted(os.listdir(stage)):
            final = os.path.join(dst, d)
            if os.path.exists(final):  # replace an older shard: move it aside, deleted with the stage
                os.replace(final, os.path.join(stage, f".old_{d}"))
            os.replace(os.path.join(stage, d), final)
    shutil.rmtree(stage)


class Plan(NamedTuple):
    """A checked transform: nothing has been written when this exists."""
    src_files: Dict[int, str]
    src: Dict[int, State]
    src_strategy: Optional[Dict[str, TensorLayout]]
    dst_strategy: Optional[Dict[str, TensorLayout]]
    full: Dict[str, tuple]  # name -> full shape
    ranks: List[int]  # destination ranks to write
    engine: str
    dst: str  # output directory, or the file of a merge into one file
    single_file: bool
    fmt: str


def plan(req: TransformRequest) -> Plan:
    """Read and check everything; nothing is written."""
    if req.rank_id is not None and (req.world_size is None or req.dst_strategy is None):
        raise TransformError("--rank_id needs --world_size and --dst_strategy")
    if not req.dst_strategy and not req.src_strategy:
        raise TransformError("nothing to do: give --dst_strategy (slice) or --src_strategy (merge shards)")
    src_files = source_files(req.src_checkpoint)
    if req.src_strategy is None and len(src_files) > 1:
        raise TransformError(f"{req.src_checkpoint} holds {len(src_files)} rank shards: give --src_strategy")
    src = {rank: read_checkpoint(f) for rank, f in src_files.items()}
    src_strategy = read_strategy(req.src_strategy) if req.src_strategy else None
    dst_strategy = read_strategy(req.dst_strategy) if req.dst_strategy else None
    full = check_transform(src, src_strategy, dst_strategy, req.src_checkpoint)

    world = device_num(dst_strategy, "--dst_strategy") if dst_strategy else 1
    if req.world_size is not None and req.world_size != world:
        raise TransformError(f"--dst_strategy describes {world} devices, but --world_size is {req.world_size}")
    if req.rank_id is not None and not 0 <= req.rank_id < world:
        raise TransformError(f"--rank_id {req.rank_id} is outside the world of {world} ranks")
    plain = all(tl.is_plain for s in (src_strategy, dst_strategy) if s for tl in s.values())
    engine = ("numpy" if plain else "mindspore") if req.engine == "auto" else req.engine
    if engine == "numpy" and not plain:
        raise TransformError("a strategy uses optimizer sharding, pipeline stages or nested layouts: "
                             "use --engine mindspore")
    if engine == "mindspore" and any(not f.endswith(".ckpt") for f in src_files.values()):
        raise TransformError("--engine mindspore reads .ckpt sources only; use --engine numpy")

    single_file = dst_strategy is None and req.dst_checkpoint.endswith((".ckpt", ".safetensors"))
    if not single_file and os.path.isfile(req.dst_checkpoint):
        raise TransformError(f"--dst_checkpoint {req.dst_checkpoint} is a file; give a directory")
    fmt = "safetensors" if single_file and req.dst_checkpoint.endswith(".safetensors") else req.format
    ranks = [req.rank_id] if req.rank_id is not None else list(range(world))
    return Plan(src_files, src, src_strategy, dst_strategy, full, ranks, engine,
                os.path.abspath(req.dst_checkpoint), single_file, fmt)


def transform(req: TransformRequest, progress: Optional[Progress] = None) -> dict:
    """Check, then write under a temporary directory beside the output and rename; `progress` is
    called after each rank is written. Returns the summary."""
    t_start = time.perf_counter()
    p = plan(req)
    parent = os.path.dirname(p.dst)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=f".{os.path.basename(p.dst)}.tmp-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(stage, 0o777 & ~umask)  # mkdtemp's 0700 would carry over to OUT_DIR

    def rank_path(rank):
        folder = os.path.join(stage, f"rank_{rank}")
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, f"{req.prefix}{rank}.{p.fmt}")

    done = []

    def log(rank, n, secs):
        done.append(rank)
        if progress is not None:
            final = p.dst if p.single_file else os.path.join(p.dst, f"rank_{rank}", f"{req.prefix}{rank}.{p.fmt}")
            progress(len(done), len(p.ranks), rank, n, secs, final)

    try:
        if p.engine == "numpy":
            state = p.src[0] if p.src_strategy is None else merge_shards(p.src, p.src_strategy, p.full)
            written = numpy_engine(state, p.dst_strategy, p.ranks, rank_path, p.fmt, log)
        else:
            work = os.path.join(stage, ".work")
            os.makedirs(work)
            written = mindspore_engine(req, p.src_files, p.ranks, rank_path, work, log)
            shutil.rmtree(work)
        publish(stage, p.dst, p.single_file)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    read = sum(a.nbytes for state in p.src.values() for _, a in state.values())
    return {"parameters": len(p.full), "bytes_read": read, "bytes_written": written, "ranks": len(p.ranks),
            "seconds": time.perf_counter() - t_start, "engine": p.engine, "output": p.dst}
