"""Slice a full MindSpore checkpoint into per-rank shards by a strategy file, merge shards back, or re-slice.

    # full -> shards: OUT_DIR/rank_k/<prefix>k.ckpt for every rank of the strategy
    python scripts/transform_checkpoint.py --src_checkpoint=FULL.ckpt --dst_checkpoint=OUT_DIR \
        --dst_strategy=STRATEGY_FILE_OR_DIR [--rank_id=K --world_size=N] [--format=safetensors]
    # shards -> full: OUT_DIR/rank_0/<prefix>0.ckpt, or the file itself if OUT ends in .ckpt/.safetensors
    python scripts/transform_checkpoint.py --src_checkpoint=SHARDS_DIR --src_strategy=STRATEGY --dst_checkpoint=OUT
    # shards -> other shards
    python scripts/transform_checkpoint.py --src_checkpoint=SHARDS_DIR --src_strategy=A --dst_strategy=B \
        --dst_checkpoint=OUT_DIR

A sharded source is MindSpore's layout, SHARDS_DIR/rank_k/*.ckpt (the last file in name order
when a rank has several, as `transform_checkpoints` picks). A strategy is a file, or a directory
of per-rank files that is merged first (`mindgrpo.parallel.strategy`). Our layouts' files come
from `mindgrpo.parallel.strategy.write_layout_strategies` (what `--only_save_strategy True` of the
trainer writes); files that MindSpore wrote on Ascend (MindFormers, mindrlhf runs) are read by the
same MindSpore functions, and the layouts our numpy engine does not handle go to MindSpore's.

Two engines give the same bytes (tests/scripts/test_transform_checkpoint.py checks it):
  mindspore  `mindspore.parallel.transform_checkpoints` / `transform_checkpoint_by_rank`; every
             strategy MindSpore supports (optimizer sharding, pipeline stages, nested layouts).
  numpy      memory-maps the source and writes each rank's slices straight to its file; several
             times faster (benchmarks/transform_checkpoint.py); plain layouts only.
--engine auto (the default) takes numpy when every layout is plain, else mindspore.

Everything is checked before anything is written: a weight missing from the checkpoint or from a
strategy, a shape a strategy cannot split, a device count that does not match; the error names
the parameter. Scalars missing from the strategy (global_step and the like) are copied to every
rank, as MindSpore does. Output is written under a temporary name beside OUT and renamed when
complete.
"""

from __future__ import annotations

import argparse
import glob
import mmap
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import numpy as np

from mindgrpo.models.convert import WeightError, read_safetensors, write_safetensors
from mindgrpo.parallel.layout import OPTIMIZER_PREFIXES, LayoutError
from mindgrpo.parallel.strategy import StrategyError, TensorLayout, device_num, read_strategy, strategy_file

# ckpt tensor_type -> numpy dtype of its bytes (bf16 kept as raw uint16 bits) and safetensors name
CKPT_DTYPES = {"Float32": (np.float32, "F32"), "Float16": (np.float16, "F16"), "BFloat16": (np.uint16, "BF16"),
               "Float64": (np.float64, "F64"), "Int8": (np.int8, "I8"), "UInt8": (np.uint8, "U8"),
               "Int16": (np.int16, "I16"), "UInt16": (np.uint16, "U16"), "Int32": (np.int32, "I32"),
               "UInt32": (np.uint32, "U32"), "Int64": (np.int64, "I64"), "UInt64": (np.uint64, "U64"),
               "Bool": (np.bool_, "BOOL")}
ST_TO_CKPT = {st: name for name, (_, st) in CKPT_DTYPES.items()}
CHUNK_BYTES = 512 * 1024 * 1024  # MindSpore's SLICE_SIZE: one protobuf message per chunk of a tensor

State = Dict[str, Tuple[str, np.ndarray]]  # name -> (ckpt tensor_type, array of its bytes)


class TransformError(ValueError):
    """Bad input to the transform; the message names the file or the parameter."""


# ---------------------------------------------------------------------------- .ckpt I/O
# A .ckpt is a run of protobuf `Checkpoint.value` entries (mindspore/train/checkpoint.proto):
# Value{1: tag, 2: TensorProto{1: dims, 2: tensor_type, 3: tensor_content}}; a tensor larger
# than CHUNK_BYTES is several consecutive entries with the same tag.


def _varint(buf, pos: int) -> Tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, int value or (start, end) of a length-delimited field) of one message."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield field, value
        elif wire == 2:
            n, pos = _varint(buf, pos)
            yield field, (pos, pos + n)
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} at byte {pos}")


def read_ckpt(path: str) -> State:
    """Memory-mapped read of a (plain, unencrypted) MindSpore .ckpt; arrays are read-only views
    into the file (a tensor written in several chunks is joined into one copy)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise WeightError(f"{path}: empty checkpoint file")
        # MAP_POPULATE maps every page at once: 1.4x faster slicing than faulting page by page
        buf = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                        prot=mmap.PROT_READ)
    end = len(buf) - 17 if buf[-17:-10] == b"crc_num" else len(buf)
    chunks: Dict[str, list] = {}
    try:
        for field, (v0, v1) in _fields(buf, 0, end):
            if field != 1:
                raise ValueError(f"unexpected field {field}")
            tag, dims, dtype, content = None, [], None, None
            for vf, val in _fields(buf, v0, v1):
                if vf == 1:
                    tag = bytes(buf[val[0]:val[1]]).decode()
                elif vf == 2:
                    for tf, tval in _fields(buf, *val):
                        if tf == 1 and isinstance(tval, int):
                            dims.append(tval - (1 << 64) if tval >= 1 << 63 else tval)
                        elif tf == 1:
                            pos = tval[0]
                            while pos < tval[1]:
                                d, pos = _varint(buf, pos)
                                dims.append(d)
                        elif tf == 2:
                            dtype = bytes(buf[tval[0]:tval[1]]).decode()
                        elif tf == 3:
                            content = tval
                elif vf == 3:
                    raise WeightError(f"{path}: {tag!r} is a MapParameter; use --engine mindspore")
            if tag is None or dtype is None or content is None:
                raise ValueError("incomplete tensor entry")
            chunks.setdefault(tag, []).append((dims, dtype, content))
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise WeightError(f"{path}: cannot parse as a MindSpore checkpoint ({e}); encrypted checkpoints "
                          "need MindSpore's load_checkpoint") from None
    state = {}
    for tag, parts in chunks.items():
        dims, dtype, _ = parts[0]
        if dtype == "str":
            raw = b"".join(bytes(buf[a:b]) for _, _, (a, b) in parts)
            state[tag] = ("str", np.frombuffer(raw, np.uint8))
            continue
        if dtype not in CKPT_DTYPES:
            raise WeightError(f"{path}: tensor {tag!r} has unsupported type {dtype}")
        np_dtype = CKPT_DTYPES[dtype][0]
        if len(parts) == 1:
            a, b = parts[0][2]
            arr = np.frombuffer(buf, np_dtype, (b - a) // np.dtype(np_dtype).itemsize, a)
            arr.flags.writeable = False  # the map is read-only: a write would be a segfault
        else:  # chunk borders need not fall on element borders
            arr = np.frombuffer(b"".join(buf[a:b] for _, _, (a, b) in parts), np_dtype)
        shape = tuple(dims)
        if arr.size != int(np.prod(shape)):
            raise WeightError(f"{path}: tensor {tag!r} has {arr.size} values for shape {list(shape)}")
        state[tag] = (dtype, arr.reshape(shape))
    return state


def _key(field: int, wire: int) -> bytes:
    return _uvarint(field << 3 | wire)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def write_ckpt(path: str, items: Iterable[Tuple[str, str, np.ndarray]]) -> int:
    """Write (name, tensor_type, array) entries as MindSpore writes them; returns the tensor bytes."""
    total = 0
    with open(path, "wb") as f:
        for name, dtype, arr in items:
            arr = arr if arr.flags.c_contiguous else arr.copy()  # (ascontiguousarray makes 0-d 1-d)
            raw = memoryview(arr.reshape(-1)).cast("B")
            dims = b"".join(_key(1, 0) + _uvarint(d) for d in ((0,) if dtype == "str" else arr.shape))
            head = dims + _key(2, 2) + _uvarint(len(dtype)) + dtype.encode()
            tag = _key(1, 2) + _uvarint(len(name.encode())) + name.encode()
            for start in range(0, max(len(raw), 1), CHUNK_BYTES):
                chunk = raw[start:start + CHUNK_BYTES]
                tensor = head + _key(3, 2) + _uvarint(len(chunk))
                value = tag + _key(2, 2) + _uvarint(len(tensor) + len(chunk)) + tensor
                f.write(_key(1, 2) + _uvarint(len(value) + len(chunk)) + value)
                f.write(chunk)
            total += len(raw)
    return total


def read_checkpoint(path: str) -> State:
    if path.endswith(".safetensors"):
        out = {}
        for name, (st, arr) in read_safetensors(path).items():
            if st not in ST_TO_CKPT:
                raise WeightError(f"{path}: tensor {name!r} has unsupported dtype {st}")
            out[name] = (ST_TO_CKPT[st], arr)
        return out
    return read_ckpt(path)


def write_checkpoint(path: str, items: Iterable[Tuple[str, str, np.ndarray]], fmt: str) -> int:
    if fmt == "ckpt":
        return write_ckpt(path, items)
    tensors = {}
    for name, dtype, arr in items:
        if dtype == "str":
            raise TransformError(f"parameter {name!r} is a string, which safetensors cannot hold; use --format ckpt")
        tensors[name] = (CKPT_DTYPES[dtype][1], arr)
    write_safetensors(path, tensors, {"format": "ms"})
    return sum(a.nbytes for _, a in tensors.values())


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


def mindspore_engine(args, src_files: Dict[int, str], ranks: List[int], rank_path, work: str, log) -> int:
    """MindSpore's own transform into the staging directory; returns bytes written."""
    import mindspore as ms

    src_strategy = strategy_file(args.src_strategy, work) if args.src_strategy else None
    dst_strategy = strategy_file(args.dst_strategy, work) if args.dst_strategy else None
    src_dir = os.path.join(work, "src")
    for rank, file in src_files.items():  # MindSpore wants SRC/rank_k/*.ckpt
        os.makedirs(os.path.join(src_dir, f"rank_{rank}"))
        os.symlink(os.path.abspath(file), os.path.join(src_dir, f"rank_{rank}", os.path.basename(file)))
    out_dir = os.path.join(work, "out")
    t0 = time.perf_counter()
    try:
        if args.rank_id is not None:
            os.makedirs(os.path.join(out_dir, f"rank_{args.rank_id}"))
            need = ms.parallel.rank_list_for_transform(args.rank_id, src_strategy, dst_strategy)
            ms.parallel.transform_checkpoint_by_rank(
                args.rank_id, {r: src_files[r] for r in need},
                os.path.join(out_dir, f"rank_{args.rank_id}", f"{args.prefix}{args.rank_id}.ckpt"),
                src_strategy, dst_strategy)
        else:
            ms.parallel.transform_checkpoints(src_dir, out_dir, args.prefix, src_strategy, dst_strategy)
    except (ValueError, TypeError, RuntimeError, KeyError) as e:
        raise TransformError(f"MindSpore's transform failed: {str(e).splitlines()[0]}") from None
    total = 0
    for rank in ranks:
        produced = os.path.join(out_dir, f"rank_{rank}", f"{args.prefix}{rank}.ckpt")
        if args.format == "ckpt":
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


def plan(args) -> Plan:
    if args.rank_id is not None and (args.world_size is None or args.dst_strategy is None):
        raise TransformError("--rank_id needs --world_size and --dst_strategy")
    if not args.dst_strategy and not args.src_strategy:
        raise TransformError("nothing to do: give --dst_strategy (slice) or --src_strategy (merge shards)")
    src_files = source_files(args.src_checkpoint)
    if args.src_strategy is None and len(src_files) > 1:
        raise TransformError(f"{args.src_checkpoint} holds {len(src_files)} rank shards: give --src_strategy")
    src = {rank: read_checkpoint(f) for rank, f in src_files.items()}
    src_strategy = read_strategy(args.src_strategy) if args.src_strategy else None
    dst_strategy = read_strategy(args.dst_strategy) if args.dst_strategy else None
    full = check_transform(src, src_strategy, dst_strategy, args.src_checkpoint)

    world = device_num(dst_strategy, "--dst_strategy") if dst_strategy else 1
    if args.world_size is not None and args.world_size != world:
        raise TransformError(f"--dst_strategy describes {world} devices, but --world_size is {args.world_size}")
    if args.rank_id is not None and not 0 <= args.rank_id < world:
        raise TransformError(f"--rank_id {args.rank_id} is outside the world of {world} ranks")
    plain = all(tl.is_plain for s in (src_strategy, dst_strategy) if s for tl in s.values())
    engine = ("numpy" if plain else "mindspore") if args.engine == "auto" else args.engine
    if engine == "numpy" and not plain:
        raise TransformError("a strategy uses optimizer sharding, pipeline stages or nested layouts: "
                             "use --engine mindspore")
    if engine == "mindspore" and any(not f.endswith(".ckpt") for f in src_files.values()):
        raise TransformError("--engine mindspore reads .ckpt sources only; use --engine numpy")

    single_file = dst_strategy is None and args.dst_checkpoint.endswith((".ckpt", ".safetensors"))
    if not single_file and os.path.isfile(args.dst_checkpoint):
        raise TransformError(f"--dst_checkpoint {args.dst_checkpoint} is a file; give a directory")
    fmt = "safetensors" if single_file and args.dst_checkpoint.endswith(".safetensors") else args.format
    ranks = [args.rank_id] if args.rank_id is not None else list(range(world))
    return Plan(src_files, src, src_strategy, dst_strategy, full, ranks, engine,
                os.path.abspath(args.dst_checkpoint), single_file, fmt)


def run(args) -> dict:
    """Check, then write under a temporary directory beside the output and rename; returns the summary."""
    t_start = time.perf_counter()
    p = plan(args)
    parent = os.path.dirname(p.dst)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=f".{os.path.basename(p.dst)}.tmp-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(stage, 0o777 & ~umask)  # mkdtemp's 0700 would carry over to OUT_DIR

    def rank_path(rank):
        folder = os.path.join(stage, f"rank_{rank}")
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, f"{args.prefix}{rank}.{p.fmt}")

    done = []

    def log(rank, n, secs):
        done.append(rank)
        final = p.dst if p.single_file else os.path.join(p.dst, f"rank_{rank}", f"{args.prefix}{rank}.{p.fmt}")
        print(f"[{len(done)}/{len(p.ranks)}] rank {rank}: {n / 1e6:.1f} MB -> {final} ({secs:.2f}s)", flush=True)

    try:
        if p.engine == "numpy":
            state = p.src[0] if p.src_strategy is None else merge_shards(p.src, p.src_strategy, p.full)
            written = numpy_engine(state, p.dst_strategy, p.ranks, rank_path, p.fmt, log)
        else:
            work = os.path.join(stage, ".work")
            os.makedirs(work)
            written = mindspore_engine(args, p.src_files, p.ranks, rank_path, work, log)
            shutil.rmtree(work)
        publish(stage, p.dst, p.single_file)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    read = sum(a.nbytes for state in p.src.values() for _, a in state.values())
    return {"parameters": len(p.full), "bytes_read": read, "bytes_written": written, "ranks": len(p.ranks),
            "seconds": time.perf_counter() - t_start, "engine": p.engine, "output": p.dst}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src_checkpoint", required=True, help="full checkpoint file, or a directory of rank_k/ shards")
    ap.add_argument("--dst_checkpoint", required=True, help="output directory (or a .ckpt file when merging)")
    ap.add_argument("--dst_strategy", help="strategy file or directory to slice for; none: merge into one")
    ap.add_argument("--src_strategy", help="strategy of a sharded --src_checkpoint")
    ap.add_argument("--prefix", default="checkpoint_", help="output names: rank_k/<prefix>k.ckpt")
    ap.add_argument("--rank_id", type=int, help="write this rank only (needs --world_size)")
    ap.add_argument("--world_size", type=int, help="the destination world; must match --dst_strategy")
    ap.add_argument("--format", choices=["ckpt", "safetensors"], default="ckpt")
    ap.add_argument("--engine", choices=["auto", "numpy", "mindspore"], default="auto")
    args = ap.parse_args(argv)
    try:
        s = run(args)
    except (TransformError, StrategyError, LayoutError, WeightError, OSError) as e:
        print(f"transform_checkpoint: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"transformed {s['parameters']} parameters, {s['bytes_read'] / 1e6:.1f} MB read, "
          f"{s['bytes_written'] / 1e6:.1f} MB written, {s['ranks']} ranks, {s['seconds']:.2f}s "
          f"({s['bytes_read'] / 1e6 / max(s['seconds'], 1e-9):.0f} MB/s read, {s['engine']}) -> {s['output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
