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
def cli():
    """The script's main() in this process (a subprocess pays MindSpore's import on every call)."""
    from scripts import convert_weight

    return convert_weight


@pytest.fixture
def convert(cli, capsys):
    """convert(*args) -> (exit code, stderr lines) of the script's main()."""
    def call(*args):
        capsys.readouterr()  # drop what came before (a progress bar of transformers)
        code = cli.main([str(a) for a in args])
        return code, capsys.readouterr().err.strip().splitlines()

    return call


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
    (lambda s: s.pop("model.layers.1.mlp.up_proj.weight"), "'model.layers.1.mlp.up_proj.weight'"),
    (lambda s: s.__setitem__("model.layers.0.extra.weight", ("F32", np.zeros(3, np.float32))), "model.layers.0.extra.weight"),
    (lambda s: s.__setitem__("model.norm.weight", ("F32", np.zeros(5, np.float32))), "'model.norm.weight'"),
])
def test_bad_checkpoint_is_rejected_and_nothing_written(hf_dir, tmp_path, edit, needle):
    """The line names the HF tensor, as the HF folder holds it."""
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


def shard(state, folder, config_from):
    """Write `state` as a two-shard HF folder with an index."""
    names = sorted(state)
    files = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
             "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    os.makedirs(folder, exist_ok=True)
    for fname, keys in files.items():
        write_safetensors(os.path.join(folder, fname), {k: state[k] for k in keys})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {k: f for f, ks in files.items() for k in ks}}, f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write(open(os.path.join(config_from, "config.json")).read())


def listing(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def test_reverse_into_a_sharded_model_is_refused_then_replaced_whole(hf_dir, tmp_path, convert):
    other = tmp_path / "other"  # the same shapes, other weights
    make_hf_model(str(other), tied=False, vocab=128, hidden=32, inter=64, heads=4, kv_heads=2, seed=1)
    ckpt = str(tmp_path / "ms" / "other.ckpt")
    assert convert("--torch_ckpt_dir", str(other), "--mindspore_ckpt_path", ckpt)[0] == 0
    target = str(tmp_path / "target")
    shard(read_hf_state(hf_dir), target, hf_dir)
    (tmp_path / "target" / "tokenizer.json").write_text('{"kept": true}')
    (tmp_path / "target" / "README.md").write_text("my notes")
    before = listing(target)

    code, err = convert("--reverse", "--mindspore_ckpt_path", ckpt, "--torch_ckpt_dir", target)
    assert code == 1 and listing(target) == before
    assert err == [
        f"convert_weight: error: {target} already holds a model (config.json, model-00001-of-00002.safetensors, "
        "model-00002-of-00002.safetensors, ...); pass --overwrite to replace its model files (its other files are kept)"]

    code, err = convert("--reverse", "--mindspore_ckpt_path", ckpt, "--torch_ckpt_dir", target, "--overwrite")
    assert code == 0, err
    assert sorted(os.listdir(target)) == ["README.md", "config.json", "model.safetensors", "tokenizer.json"]
    assert listing(target)["tokenizer.json"] == b'{"kept": true}' and listing(target)["README.md"] == b"my notes"
    assert raw_tensors(target) == raw_tensors(str(other))  # a forward conversion now reads the new weights
    assert sorted(os.listdir(tmp_path)) == ["ms", "other", "target"]  # no staging folder left


def test_forward_refuses_an_existing_checkpoint_or_another_models_config(hf_dir, tmp_path, convert):
    ckpt = tmp_path / "ms" / "m.ckpt"
    assert convert("--torch_ckpt_dir", hf_dir, "--mindspore_ckpt_path", str(ckpt))[0] == 0
    before = ckpt.read_bytes()
    code, err = convert("--torch_ckpt_dir", hf_dir, "--mindspore_ckpt_path", str(ckpt), "--dtype", "bf16")
    assert code == 1 and ckpt.read_bytes() == before
    assert err == [f"convert_weight: error: {ckpt} already exists (pass --overwrite to replace it)"]
    # a second checkpoint of the same model beside it is fine; one of another model is not
    assert convert("--torch_ckpt_dir", hf_dir, "--mindspore_ckpt_path", str(tmp_path / "ms" / "m_bf16.ckpt"),
               "--dtype", "bf16")[0] == 0
    other = tmp_path / "other"
    make_hf_model(str(other), tied=True, vocab=128, hidden=32, inter=64, heads=4, kv_heads=2)
    code, err = convert("--torch_ckpt_dir", str(other), "--mindspore_ckpt_path", str(tmp_path / "ms" / "tied.ckpt"))
    assert code == 1 and "config.json already exists and describes another model" in err[0]
    assert sorted(os.listdir(tmp_path / "ms")) == ["config.json", "m.ckpt", "m_bf16.ckpt"]
    assert convert("--torch_ckpt_dir", hf_dir, "--mindspore_ckpt_path", str(ckpt), "--dtype", "bf16",
               "--overwrite")[0] == 0
    from mindgrpo.models.checkpoint import read_ms_checkpoint

    assert {d for d, _ in read_ms_checkpoint(str(ckpt)).values()} == {"BF16"}


def header_lies(good: bytes) -> bytes:
    """The same file with the first tensor's end offset moved by 4 bytes."""
    n = int.from_bytes(good[:8], "little")
    header = json.loads(good[8 : 8 + n])
    first = sorted(k for k in header if k != "__metadata__")[0]
    header[first]["data_offsets"][1] += 4
    head = json.dumps(header).encode()
    head += b" " * (n - len(head)) if len(head) <= n else b""
    return len(head).to_bytes(8, "little") + head + good[8 + n :]


@pytest.mark.parametrize("damage, needle", [
    (lambda good: b"# My model\nThese are the weights.\n" * 3, "not a safetensors file (its first 8 bytes give a header"),
    (lambda good: good[:5], "not a safetensors file (5 bytes"),
    (lambda good: good[: len(good) - 64], "truncated: tensor"),
    (lambda good: good[:8] + b"\xff" + good[9:], "not a safetensors file (header:"),
    (header_lies, "needs"),
])
def test_a_file_that_is_not_safetensors_is_one_line(hf_dir, tmp_path, convert, damage, needle):
    good = open(os.path.join(hf_dir, "model.safetensors"), "rb").read()
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(damage(good))
    (src / "config.json").write_text(open(os.path.join(hf_dir, "config.json")).read())
    out = tmp_path / "out" / "m.ckpt"
    code, err = convert("--torch_ckpt_dir", str(src), "--mindspore_ckpt_path", str(out))
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"convert_weight: error: {src / 'model.safetensors'}: ") and needle in err[0], err
    assert not (tmp_path / "out").exists()


def test_qwen3_round_trip_is_bit_exact_and_its_yaml_config_makes_an_hf_qwen3(convert, tmp_path):
    """Qwen3 (q_norm/k_norm, no q/k/v bias, head_dim 12 != 32 / 4) both ways; the reverse with our
    YAML config writes a config.json that transformers reads as the same Qwen3 model."""
    import torch
    import transformers

    src = tmp_path / "hf3"
    hf = make_hf_model(str(src), tied=False, vocab=128, hidden=32, inter=64, heads=4, kv_heads=2, head_dim=12,
                       model_type="qwen3")
    ckpt = tmp_path / "ms" / "m.ckpt"
    assert convert("--torch_ckpt_dir", src, "--mindspore_ckpt_path", ckpt)[0] == 0
    from mindgrpo.models.checkpoint import read_ms_checkpoint

    names = set(read_ms_checkpoint(str(ckpt)))
    assert {"model.layers.0.attention.q_norm.weight", "model.layers.1.attention.k_norm.weight"} <= names
    assert not any(n.endswith(".bias") for n in names)
    back = tmp_path / "back3"
    assert convert("--reverse", "--mindspore_ckpt_path", ckpt, "--torch_ckpt_dir", back)[0] == 0
    assert raw_tensors(str(back)) == raw_tensors(str(src))
    yaml_cfg = tmp_path / "qwen3.yaml"
    yaml_cfg.write_text("model_type: qwen3\nvocab_size: 128\nhidden_size: 32\nintermediate_size: 64\n"
                        "num_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\nhead_dim: 12\n"
                        "rope_theta: 10000.0\n")
    from_yaml = tmp_path / "from_yaml"
    assert convert("--reverse", "--mindspore_ckpt_path", ckpt, "--torch_ckpt_dir", from_yaml, "--config", yaml_cfg)[0] == 0
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(from_yaml)).eval()
    assert type(reloaded).__name__ == "Qwen3ForCausalLM"
    ids = torch.arange(1, 9).reshape(1, 8)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, hf(ids).logits)


def test_qwen2_weights_under_a_qwen3_config_are_refused(hf_dir, convert, tmp_path):
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in os.listdir(hf_dir):
        if f.endswith(".safetensors"):
            os.symlink(os.path.join(hf_dir, f), bad / f)
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    code, err = convert("--torch_ckpt_dir", bad, "--mindspore_ckpt_path", tmp_path / "m.ckpt")
    assert code == 1 and len(err) == 1 and "unexpected tensor 'model.layers.0.self_attn.k_proj.bias'" in err[0]
    assert not (tmp_path / "m.ckpt").exists()


@pytest.fixture(scope="module")
def qwen3_without_head_dim(tmp_path_factory):
    """An HF Qwen3 folder whose config.json has no head_dim: transformers' default (128 for Qwen3, not
    hidden_size / num_attention_heads = 8) shapes its weights."""
    d = tmp_path_factory.mktemp("qwen3_no_head_dim")
    make_hf_model(str(d), vocab=64, hidden=32, inter=48, heads=4, kv_heads=2, layers=1, model_type="qwen3",
                  head_dim=128)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["head_dim"]
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_a_qwen3_config_without_head_dim_takes_transformers_default(qwen3_without_head_dim, convert, tmp_path):
    import transformers

    from mindgrpo.models.config import Qwen2Config

    d = qwen3_without_head_dim
    theirs = transformers.AutoConfig.from_pretrained(str(d)).head_dim
    assert theirs != 32 // 4  # the default is not H / nh, or this test would not tell them apart
    assert Qwen2Config.load(str(d / "config.json")).d == theirs
    code, err = convert("--torch_ckpt_dir", d, "--mindspore_ckpt_path", tmp_path / "m.ckpt")
    assert code == 0, err
    assert (tmp_path / "m.ckpt").exists()


def test_a_mis_shaped_tensor_names_the_hf_tensor_and_head_dim(qwen3_without_head_dim, convert, tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    for f in os.listdir(qwen3_without_head_dim):
        if f.endswith(".safetensors"):
            os.symlink(os.path.join(qwen3_without_head_dim, f), d / f)
    cfg = json.loads((qwen3_without_head_dim / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "head_dim": 16}))
    code, err = convert("--torch_ckpt_dir", d, "--mindspore_ckpt_path", tmp_path / "m.ckpt")
    assert code == 1 and len(err) == 1, err
    assert err[0] == (f"convert_weight: error: {d}: tensor 'model.layers.0.self_attn.q_proj.weight' has shape "
                      "[512, 32], expected [64, 32] (head_dim 16; HF's Qwen3 takes 128 when config.json has none)")
    assert not (tmp_path / "m.ckpt").exists()
