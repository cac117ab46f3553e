"""scripts/convert_weight.py: bit-exact round trips, and bad inputs rejected with nothing written."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hf_models import make_hf_model

from mindgrpo.models.convert import bf16_to_f32, f32_to_bf16, read_hf_state, read_safetensors, write_safetensors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "convert_weight.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    make_hf_model(str(d), tied=False, vocab=128, hidden=32, inter=64, heads=4, kv_heads=2)
    return str(d)


def raw_tensors(folder):
    return {k: (dt, np.asarray(a).tobytes()) for k, (dt, a) in read_hf_state(folder).items()}


@pytest.mark.slow  # converts a model both ways through the command line
def test_round_trip_is_bit_exact(hf_dir, tmp_path):
    ckpt = str(tmp_path / "ms" / "m.ckpt")
    assert run("--torch_ckpt_dir", hf_dir, "--mindspore_ckpt_path", ckpt).returncode == 0
    back = str(tmp_path / "back")
    r = run("--reverse", "--mindspore_ckpt_path", ckpt, "--torch_ckpt_dir", back)
    assert r.returncode == 0, r.stderr
    assert raw_tensors(back) == raw_tensors(hf_dir)
    assert json.load(open(os.path.join(back, "config.json")))["hidden_size"] == 32


@pytest.mark.slow  # converts a model both ways through the command line
def test_bf16_round_trip_is_bit_exact(hf_dir, tmp_path):
    import torch  # the reference bf16 rounding

    src = read_hf_state(hf_dir)
    bf = {k: ("BF16", torch.from_numpy(np.array(a)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
          for k, (_, a) in src.items()}
    bf_dir = tmp_path / "hf_bf16"
    bf_dir.mkdir()
    write_safetensors(str(bf_dir / "model.safetensors"), bf)
    (bf_dir / "config.json").write_text(open(os.path.join(hf_dir, "config.json")).read())
    ckpt = str(tmp_path / "m_bf16.ckpt")
    assert run("--torch_ckpt_dir", str(bf_dir), "--mindspore_ckpt_path", ckpt).returncode == 0
    back = str(tmp_path / "back_bf16")
    assert run("--reverse", "--mindspore_ckpt_path", ckpt, "--torch_ckpt_dir", back).returncode == 0
    assert raw_tensors(back) == raw_tensors(str(bf_dir))
    # our fp32 -> bf16 rounding equals torch's
    for k, (_, a) in src.items():
        assert np.array_equal(f32_to_bf16(np.array(a)), bf[k][1])
        assert np.array_equal(bf16_to_f32(bf[k][1]), torch.from_numpy(bf[k][1].view(np.int16)).view(torch.bfloat16).float().numpy())


@pytest.mark.slow  # converts a model both ways through the command line
def test_sharded_index_input(hf_dir, tmp_path):
    state = read_hf_state(hf_dir)
    names = sorted(state)
    half = len(names) // 2
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    files = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for fname, keys in files.items():
        write_safetensors(str(sharded / fname), {k: state[k] for k in keys})
    json.dump({"weight_map": {k: f for f, ks in files.items() for k in ks}}, open(sharded / "model.safetensors.index.json", "w"))
    (sharded / "config.json").write_text(open(os.path.join(hf_dir, "config.json")).read())
    a, b = str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")
    assert run("--torch_ckpt_dir", hf_dir, "--mindspore_ckpt_path", a).returncode == 0
    assert run("--torch_ckpt_dir", str(sharded), "--mindspore_ckpt_path", b).returncode == 0
    from mindgrpo.models.checkpoint import read_ms_checkpoint
    ra, rb = read_ms_checkpoint(a), read_ms_checkpoint(b)
    assert sorted(ra) == sorted(rb) and all(np.array_equal(ra[k][1], rb[k][1]) for k in ra)


def broken_copy(hf_dir, tmp_path, edit):
    state = dict(read_hf_state(hf_dir))
    edit(state)
    d = tmp_path / "broken"
    d.mkdir()
    write_safetensors(str(d / "model.safetensors"), state)
    (d / "config.json").write_text(open(os.path.join(hf_dir, "config.json")).read())
    return str(d)


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.pop("model.layers.1.mlp.up_proj.weight"), "model.layers.1.feed_forward.w3.weight"),
    (lambda s: s.__setitem__("model.layers.0.extra.weight", ("F32", np.zeros(3, np.float32))), "model.layers.0.extra.weight"),
    (lambda s: s.__setitem__("model.norm.weight", ("F32", np.zeros(5, np.float32))), "model.norm_out.weight"),
])
def test_bad_checkpoint_is_rejected_and_nothing_written(hf_dir, tmp_path, edit, needle):
    src = broken_copy(hf_dir, tmp_path, edit)
    out = tmp_path / "out" / "m.ckpt"
    r = run("--torch_ckpt_dir", src, "--mindspore_ckpt_path", str(out))
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if "error" in ln]
    assert len(lines) == 1 and needle in lines[0]
    assert not out.exists()
    assert not (out.parent.exists() and any(out.parent.iterdir()))


def test_missing_directory_is_one_line_error(tmp_path):
    r = run("--torch_ckpt_dir", str(tmp_path / "nope"), "--mindspore_ckpt_path", str(tmp_path / "m.ckpt"))
    assert r.returncode != 0 and "nope" in r.stderr and not (tmp_path / "m.ckpt").exists()


def test_safetensors_reader_matches_library(hf_dir):
    from safetensors.numpy import load_file

    ref = load_file(os.path.join(hf_dir, "model.safetensors"))
    ours = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    assert sorted(ref) == sorted(ours)
    assert all(np.array_equal(ref[k], ours[k][1]) for k in ref)
