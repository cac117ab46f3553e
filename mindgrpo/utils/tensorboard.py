"""A dependency-free TensorBoard writer for scalars and text.

    writer = SummaryWriter("out/tensorboard")
    writer.add_scalar("loss", 0.25, step=3)
    writer.add_scalars({"reward_mean": 0.5, "kl": 0.01}, step=3)
    writer.close()

The file is what TensorFlow writes: `events.out.tfevents.<time>.<host>.<pid>.<n>`, a
sequence of TFRecords, each `uint64 length | masked crc32c(length) | data | masked
crc32c(data)` (little-endian), whose data is one `Event` protobuf. The protobuf messages
are encoded here by hand; only the fields below are ever written:

    Event          1 wall_time double   2 step int64   3 file_version string
                   5 summary Summary    7 session_log SessionLog
    Summary        1 value Summary.Value (repeated)
    Summary.Value  1 tag string   2 simple_value float   8 tensor TensorProto
                   9 metadata SummaryMetadata
    SummaryMetadata  1 plugin_data PluginData { 1 plugin_name string }
    TensorProto    1 dtype enum (DT_STRING = 7)   2 tensor_shape {} (a scalar)   8 string_val bytes
    SessionLog     1 status enum (START = 1)

No tensorboard, tensorflow or torch is needed to write; tests read the files back with
tensorboard's own EventAccumulator.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import struct
import time
from typing import Mapping, Optional

# ---------------------------------------------------------------------------------------
# crc32c (Castagnoli) and the TFRecord framing
# ---------------------------------------------------------------------------------------


def _crc32c_table() -> tuple:
    poly = 0x82F63B78  # 0x1EDC6F41 bit-reversed
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C of `data`, continuing from `crc` (the result of a previous call) if given."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The TFRecord checksum: crc32c rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord holding `data`."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


# ---------------------------------------------------------------------------------------
# Protobuf wire format, just what Event needs
# ---------------------------------------------------------------------------------------

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_FLOAT32_MAX = 3.4028234663852886e38
_DT_STRING = 7
_SESSION_START = 1


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64 is its 64-bit two's complement (10 bytes)
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint((field << 3) | wire_type)


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, _BYTES) + _varint(len(payload)) + payload


def _str_field(field: int, text: str) -> bytes:
    return _len_field(field, text.encode("utf-8"))


def _float32(value: float) -> bytes:
    value = float(value)
    if math.isfinite(value) and abs(value) > _FLOAT32_MAX:  # struct refuses to round these to inf
        value = math.copysign(math.inf, value)
    return struct.pack("<f", value)


def _scalar_value(tag: str, value: float) -> bytes:
    """A Summary.Value with a simple_value."""
    return _str_field(1, tag) + _key(2, _FIXED32) + _float32(value)


def _text_value(tag: str, text: str) -> bytes:
    """A Summary.Value holding a scalar string tensor, tagged for the text plugin."""
    metadata = _len_field(1, _str_field(1, "text"))
    tensor = _key(1, _VARINT) + _varint(_DT_STRING) + _len_field(2, b"") + _len_field(8, text.encode("utf-8"))
    return _str_field(1, tag) + _len_field(8, tensor) + _len_field(9, metadata)


def _event(step: int, wall_time: float, body: bytes = b"") -> bytes:
    """An Event: wall_time, step, then `body` (already-encoded fields 3, 5 or 7)."""
    return _key(1, _FIXED64) + struct.pack("<d", wall_time) + _key(2, _VARINT) + _varint(int(step)) + body


def _summary_event(step: int, wall_time: float, values: list) -> bytes:
    summary = b"".join(_len_field(1, v) for v in values)
    return _event(step, wall_time, _len_field(5, summary))


# ---------------------------------------------------------------------------------------
# The writer
# ---------------------------------------------------------------------------------------

_file_counter = itertools.count()


class SummaryWriter:
    """Appends scalar and text summaries to a new event file in `logdir`.

    Records go through a buffered file: call `flush()` to make them visible to a running
    TensorBoard (MetricsLogger does so after every step), and `close()` at the end.
    """

    def __init__(self, logdir: str):
        os.makedirs(logdir, exist_ok=True)
        self.logdir = logdir
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_file_counter)}"
        self.path = os.path.join(logdir, name)
        self._file = open(self.path, "wb")
        self._write(_event(0, time.time(), _str_field(3, "brain.Event:2")))
        self.flush()

    def _write(self, event: bytes) -> None:
        if self._file is None:
            raise ValueError(f"SummaryWriter for {self.path} is closed")
        self._file.write(tfrecord(event))

    def add_scalar(self, tag: str, value: float, step: int, wall_time: Optional[float] = None) -> None:
        self.add_scalars({tag: value}, step, wall_time)

    def add_scalars(self, scalars: Mapping[str, float], step: int, wall_time: Optional[float] = None) -> None:
        """All of `scalars` ({tag: value}) at one step, as one Event."""
        if not scalars:
            return
        values = [_scalar_value(tag, float(value)) for tag, value in scalars.items()]
        self._write(_summary_event(step, time.time() if wall_time is None else wall_time, values))

    def add_text(self, tag: str, text: str, step: int, wall_time: Optional[float] = None) -> None:
        """Text (markdown) shown in TensorBoard's Text tab."""
        values = [_text_value(tag, text)]
        self._write(_summary_event(step, time.time() if wall_time is None else wall_time, values))

    def add_session_start(self, step: int, wall_time: Optional[float] = None) -> None:
        """Mark a restart at `step`: TensorBoard then drops events of earlier files with step >= `step`."""
        session_log = _key(1, _VARINT) + _varint(_SESSION_START)
        self._write(_event(step, time.time() if wall_time is None else wall_time, _len_field(7, session_log)))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "SummaryWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
