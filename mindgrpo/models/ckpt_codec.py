"""MindSpore's .ckpt format read and written in numpy, without MindSpore: memory-mapped reads, files
byte-identical to `mindspore.save_checkpoint`; and the same interface over safetensors.

    state = read_checkpoint(path)                       # name -> (ckpt tensor_type, array), .ckpt or .safetensors
    write_checkpoint(path, ((name, tensor_type, array), ...), "ckpt" | "safetensors")

A .ckpt is a run of protobuf `Checkpoint.value` entries (mindspore/train/checkpoint.proto):
Value{1: tag, 2: TensorProto{1: dims, 2: tensor_type, 3: tensor_content}}; a tensor larger than
CHUNK_BYTES is several consecutive entries with the same tag. bf16 is kept as its raw uint16 bits,
so nothing is rounded on the way.
"""

from __future__ import annotations

import mmap
import os
from typing import Dict, Iterable, Tuple

import numpy as np

from mindgrpo.models.convert import WeightError, read_safetensors, write_safetensors

# ckpt tensor_type -> numpy dtype of its bytes (bf16 kept as raw uint16 bits) and safetensors name
CKPT_DTYPES = {"Float32": (np.float32, "F32"), "Float16": (np.float16, "F16"), "BFloat16": (np.uint16, "BF16"),
               "Float64": (np.float64, "F64"), "Int8": (np.int8, "I8"), "UInt8": (np.uint8, "U8"),
               "Int16": (np.int16, "I16"), "UInt16": (np.uint16, "U16"), "Int32": (np.int32, "I32"),
               "UInt32": (np.uint32, "U32"), "Int64": (np.int64, "I64"), "UInt64": (np.uint64, "U64"),
               "Bool": (np.bool_, "BOOL")}
ST_TO_CKPT = {st: name for name, (_, st) in CKPT_DTYPES.items()}
CHUNK_BYTES = 512 * 1024 * 1024  # MindSpore's SLICE_SIZE: one protobuf message per chunk of a tensor

State = Dict[str, Tuple[str, np.ndarray]]  # name -> (ckpt tensor_type, array of its bytes)


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
    """A .safetensors file (dtypes named as in a .ckpt) or a .ckpt (`read_ckpt`)."""
    if path.endswith(".safetensors"):
        out = {}
        for name, (st, arr) in read_safetensors(path).items():
            if st not in ST_TO_CKPT:
                raise WeightError(f"{path}: tensor {name!r} has unsupported dtype {st}")
            out[name] = (ST_TO_CKPT[st], arr)
        return out
    return read_ckpt(path)


def write_checkpoint(path: str, items: Iterable[Tuple[str, str, np.ndarray]], fmt: str) -> int:
    """(name, tensor_type, array) entries as a .ckpt or a .safetensors (fmt); returns the tensor bytes."""
    if fmt == "ckpt":
        return write_ckpt(path, items)
    tensors = {}
    for name, dtype, arr in items:
        if dtype == "str":
            raise WeightError(f"parameter {name!r} is a string, which safetensors cannot hold; use --format ckpt")
        tensors[name] = (CKPT_DTYPES[dtype][1], arr)
    write_safetensors(path, tensors, {"format": "ms"})
    return sum(a.nbytes for _, a in tensors.values())
