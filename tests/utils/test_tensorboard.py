"""The hand-written TensorBoard writer: crc32c vectors, protobuf parity, and a round trip through
tensorboard's own reader (skipped when tensorboard is not installed)."""

import math
import os
import random
import struct

import pytest

from mindgrpo.utils import tensorboard as tb
from mindgrpo.utils.tensorboard import SummaryWriter, crc32c, masked_crc32c


# RFC 3720 appendix B.4 and the usual check value.
@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0x00000000),
        (b"123456789", 0xE3069283),
        (bytes(32), 0x8A9136AA),
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ],
)
def test_crc32c_known_vectors(data, expected):
    assert crc32c(data) == expected


def test_crc32c_continues_across_chunks():
    data = bytes(random.Random(0).getrandbits(8) for _ in range(1000))
    assert crc32c(data[600:], crc32c(data[:600])) == crc32c(data)


def test_masked_crc_matches_tensorboard():
    stub = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")
    rng = random.Random(1)
    for n in (0, 1, 8, 100, 1000):
        data = bytes(rng.getrandbits(8) for _ in range(n))
        assert masked_crc32c(data) == stub.masked_crc32c(data)


def test_varint_hand_computed():
    assert tb._varint(0) == b"\x00"
    assert tb._varint(1) == b"\x01"
    assert tb._varint(300) == b"\xac\x02"
    assert tb._varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes


def test_scalar_event_hand_computed():
    # Event{wall_time: 0.0, step: 1, summary{value{tag: "a", simple_value: 1.0}}}
    value = b"\x0a\x01a" + b"\x15" + struct.pack("<f", 1.0)  # 8 bytes
    summary = b"\x0a\x08" + value  # 10 bytes
    expected = b"\x09" + bytes(8) + b"\x10\x01" + b"\x2a\x0a" + summary
    assert tb._summary_event(1, 0.0, [tb._scalar_value("a", 1.0)]) == expected


def _parse_event(data):
    event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")
    event = event_pb2.Event()
    event.ParseFromString(data)
    return event


def test_events_match_protobuf(tmp_path):
    values = [tb._scalar_value("loss", 0.25), tb._scalar_value("x/y", -3.0)]
    event = _parse_event(tb._summary_event(2**40, 12.5, values))
    assert (event.step, event.wall_time) == (2**40, 12.5)
    assert [(v.tag, v.simple_value) for v in event.summary.value] == [("loss", 0.25), ("x/y", -3.0)]

    event = _parse_event(tb._event(-5, 1.0, tb._str_field(3, "brain.Event:2")))
    assert (event.step, event.file_version) == (-5, "brain.Event:2")

    event = _parse_event(tb._summary_event(3, 1.0, [tb._text_value("sample", "héllo **x**")]))
    (value,) = event.summary.value
    assert value.tag == "sample" and value.metadata.plugin_data.plugin_name == "text"
    assert value.tensor.dtype == 7 and list(value.tensor.string_val) == ["héllo **x**".encode()]
    assert len(value.tensor.tensor_shape.dim) == 0

    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_session_start(7, wall_time=1.0)
    event = _parse_event(_records(writer.path)[-1])
    assert (event.step, event.wall_time, event.session_log.status) == (7, 1.0, 1)  # START


def _records(path):
    """The payloads of a TFRecord file, checking the framing with our own crc."""
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos < len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        payload = data[pos + 12 : pos + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        assert header_crc == masked_crc32c(header) and payload_crc == masked_crc32c(payload)
        out.append(payload)
        pos += 16 + length
    return out


def test_file_layout(tmp_path):
    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_scalar("a", 1.0, 0)
        writer.add_scalars({}, 1)  # nothing to write
        writer.add_scalars({"a": 2.0, "b": 3.0}, 1)
    (name,) = os.listdir(tmp_path)
    assert name.startswith("events.out.tfevents.") and writer.path == str(tmp_path / name)
    records = _records(writer.path)
    assert len(records) == 3
    assert b"brain.Event:2" in records[0] and b"\x1a\x0dbrain.Event:2" in records[0]
    with pytest.raises(ValueError, match="closed"):
        writer.add_scalar("a", 1.0, 2)


def _accumulator(logdir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_reads_scalars_and_text(tmp_path):
    with SummaryWriter(str(tmp_path)) as writer:
        for step in range(5):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
            writer.add_scalars({"reward/accuracy/mean": 0.1 * step, "kl": float("nan") if step == 2 else step}, step)
        writer.add_scalar("huge", 1e300, 4)
        writer.add_text("sample", "step 4: *hello*", 4)
    acc = _accumulator(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == ["huge", "kl", "loss", "reward/accuracy/mean"]
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [0, 1, 2, 3, 4]
    assert [e.value for e in loss] == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2], rel=1e-6)
    assert [e.value for e in acc.Scalars("reward/accuracy/mean")] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4], rel=1e-6)
    kl = [e.value for e in acc.Scalars("kl")]
    assert math.isnan(kl[2]) and [kl[i] for i in (0, 1, 3, 4)] == [0.0, 1.0, 3.0, 4.0]
    assert acc.Scalars("huge")[0].value == math.inf

    from tensorboard.util import tensor_util

    (text,) = acc.Tensors("sample")
    assert text.step == 4 and tensor_util.make_ndarray(text.tensor_proto).item() == b"step 4: *hello*"
    assert acc.SummaryMetadata("sample").plugin_data.plugin_name == "text"


def test_tensorboard_session_start_purges_old_steps(tmp_path):
    with SummaryWriter(str(tmp_path)) as first:
        for step in range(1, 6):
            first.add_scalar("loss", float(step), step)
    with SummaryWriter(str(tmp_path)) as resumed:  # a restart from the checkpoint of step 3
        resumed.add_session_start(4)
        for step in (4, 5, 6):
            resumed.add_scalar("loss", 10.0 * step, step)
    assert len(os.listdir(tmp_path)) == 2
    loss = _accumulator(tmp_path).Scalars("loss")
    assert [(e.step, e.value) for e in loss] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
