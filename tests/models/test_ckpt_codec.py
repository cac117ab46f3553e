"""mindgrpo.models.ckpt_codec: the .ckpt reader and writer against MindSpore's own save and load."""

import numpy as np
import pytest
import mindspore as ms

from mindgrpo.models import ckpt_codec
from mindgrpo.models.ckpt_codec import read_ckpt, write_ckpt
from mindgrpo.models.convert import WeightError


def test_ckpt_io_round_trip_is_byte_identical_to_mindspore(tmp_path):
    rng = np.random.default_rng(3)
    items = [{"name": "scalar", "data": ms.Tensor(np.float32(2.5))},
             {"name": "bf16", "data": ms.Tensor(rng.standard_normal((3, 5)).astype(np.float32)).astype(ms.bfloat16)},
             {"name": "fp16", "data": ms.Tensor(rng.standard_normal((4,)).astype(np.float16))},
             {"name": "step", "data": ms.Tensor(np.array([11], np.int32))}]
    src = str(tmp_path / "a.ckpt")
    ms.save_checkpoint(items, src, append_dict={"epoch_num": 3, "note": "hello"})
    state = read_ckpt(src)
    assert {k: (d, a.shape) for k, (d, a) in state.items()} == {
        "scalar": ("Float32", ()), "bf16": ("BFloat16", (3, 5)), "fp16": ("Float16", (4,)), "step": ("Int32", (1,)),
        "epoch_num": ("Int64", ()), "note": ("str", (20,))}
    write_ckpt(str(tmp_path / "b.ckpt"), [(k, d, a) for k, (d, a) in state.items()])
    assert open(tmp_path / "b.ckpt", "rb").read() == open(src, "rb").read()


def test_ckpt_io_large_tensors_in_chunks(tmp_path, monkeypatch):
    import mindspore.train.serialization as serialization

    big = np.random.default_rng(4).standard_normal((64, 48)).astype(np.float32)  # 12 KB
    monkeypatch.setattr(serialization, "SLICE_SIZE", 1)  # MindSpore writes 1 KB chunks
    ms.save_checkpoint([{"name": "big", "data": ms.Tensor(big)}], str(tmp_path / "ms.ckpt"))
    with open(tmp_path / "ms.ckpt", "rb") as f:
        assert f.read().count(b"\n\x03big") == 12  # the tag, once per chunk
    assert read_ckpt(str(tmp_path / "ms.ckpt"))["big"][1].tobytes() == big.tobytes()
    monkeypatch.setattr(ckpt_codec, "CHUNK_BYTES", 1001)  # ours: 13 chunks, borders inside floats
    write_ckpt(str(tmp_path / "ours.ckpt"), [("big", "Float32", big)])
    assert ms.load_checkpoint(str(tmp_path / "ours.ckpt"))["big"].asnumpy().tobytes() == big.tobytes()
    assert read_ckpt(str(tmp_path / "ours.ckpt"))["big"][1].tobytes() == big.tobytes()
    with pytest.raises(WeightError, match="cannot parse as a MindSpore checkpoint"):
        (tmp_path / "junk.ckpt").write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
        read_ckpt(str(tmp_path / "junk.ckpt"))
