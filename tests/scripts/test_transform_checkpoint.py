"""scripts/transform_checkpoint.py (over mindgrpo.parallel.transform): byte-identical to MindSpore's
transform_checkpoints, bit-exact round trips, and bad input rejected with one line naming the parameter
and nothing written."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import mindspore as ms
from mindspore.parallel import transform_checkpoint_by_rank, transform_checkpoints

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.strategy import TensorLayout, layout_strategy, write_layouts, write_strategy_file
from scripts.transform_checkpoint import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "transform_checkpoint.py")
CFG = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
SHAPES = expected_shapes(CFG)

def random_state(shapes=SHAPES, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def save(state, path, dtype=None, fmt="ckpt"):
    """Write with MindSpore itself; returns path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    items = []
    for k, v in state.items():
        t = ms.Tensor(v)
        items.append({"name": k, "data": t.astype(dtype) if dtype is not None and v.size > 1 else t})
    ms.save_checkpoint(items, path, format=fmt)
    return path


def strategy(tmp_path, dp, tp, shapes=SHAPES, name=None):
    return write_strategy_file(str(tmp_path / (name or f"dp{dp}tp{tp}.ckpt")), ParallelLayout(dp, tp), shapes)


def run(capsys, *args):
    """The script in-process: (exit code, stdout, stderr)."""
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def mindspore_transform(full_ckpt, out_dir, strategy_path, src_strategy=None):
    """The oracle: MindSpore's transform_checkpoints on a rank_0/ source directory."""
    if os.path.isfile(full_ckpt):
        src = os.path.join(os.path.dirname(out_dir), os.path.basename(out_dir) + "_src")
        os.makedirs(os.path.join(src, "rank_0"))
        shutil.copyfile(full_ckpt, os.path.join(src, "rank_0", "full.ckpt"))
        full_ckpt = src
    transform_checkpoints(full_ckpt, out_dir, "checkpoint_", src_strategy, strategy_path)
    return out_dir


def rank_bytes(folder, ranks, ext="ckpt"):
    return {r: open(os.path.join(folder, f"rank_{r}", f"checkpoint_{r}.{ext}"), "rb").read() for r in ranks}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    d = tmp_path_factory.mktemp("full")
    state = random_state()
    return state, save(state, str(d / "full.ckpt"))


@pytest.mark.parametrize("dp, tp", [(1, 2), (2, 2)])
def test_slices_are_byte_identical_to_mindspore_transform(full, tmp_path, capsys, dp, tp):
    state, src = full
    lay = ParallelLayout(dp, tp)
    s = strategy(tmp_path, dp, tp)
    rc, out, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "out", "--dst_strategy", s)
    assert rc == 0, err
    ranks = range(lay.world_size)
    assert sorted(os.listdir(tmp_path / "out")) == [f"rank_{r}" for r in ranks]
    oracle = mindspore_transform(src, str(tmp_path / "ms"), s)
    assert rank_bytes(tmp_path / "out", ranks) == rank_bytes(oracle, ranks)
    for r in ranks:  # and they hold our layout's pieces
        got = ms.load_checkpoint(str(tmp_path / "out" / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
        assert sorted(got) == sorted(state)
        for name, arr in state.items():
            assert got[name].asnumpy().tobytes() == lay.shard(name, arr, lay.coords(r)[1]).tobytes()
    # progress per rank and a summary
    assert f"[{lay.world_size}/{lay.world_size}] rank {lay.world_size - 1}:" in out
    assert f"transformed {len(state)} parameters" in out and f"{lay.world_size} ranks" in out
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(s), "out", "ms", "ms_src"])  # no temp left


def test_mindspore_engine_gives_the_same_bytes(full, tmp_path, capsys):
    _, src = full
    s = strategy(tmp_path, 2, 2)
    for engine in ("numpy", "mindspore"):
        rc, out, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / engine,
                           "--dst_strategy", s, "--engine", engine)
        assert rc == 0 and f", {engine}) ->" in out, err
    assert rank_bytes(tmp_path / "numpy", range(4)) == rank_bytes(tmp_path / "mindspore", range(4))


@pytest.mark.parametrize("engine", ["numpy", "mindspore"])
def test_slice_then_merge_is_bit_exact(full, tmp_path, capsys, engine):
    _, src = full
    s = strategy(tmp_path, 2, 2)
    assert run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "shards", "--dst_strategy", s)[0] == 0
    rc, out, err = run(capsys, "--src_checkpoint", tmp_path / "shards", "--src_strategy", s,
                       "--dst_checkpoint", tmp_path / "merged", "--engine", engine)
    assert rc == 0, err
    assert os.listdir(tmp_path / "merged") == ["rank_0"]
    merged = tmp_path / "merged" / "rank_0" / "checkpoint_0.ckpt"
    assert open(merged, "rb").read() == open(src, "rb").read()
    # into a named file
    rc, _, err = run(capsys, "--src_checkpoint", tmp_path / "shards", "--src_strategy", s,
                     "--dst_checkpoint", tmp_path / "one" / "model.ckpt", "--engine", engine)
    assert rc == 0, err
    assert open(tmp_path / "one" / "model.ckpt", "rb").read() == open(src, "rb").read()


def test_reslice_shards_equals_mindspore(full, tmp_path, capsys):
    _, src = full
    a, b = strategy(tmp_path, 2, 2), strategy(tmp_path, 1, 2)
    assert run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "a", "--dst_strategy", a)[0] == 0
    rc, _, err = run(capsys, "--src_checkpoint", tmp_path / "a", "--src_strategy", a, "--dst_strategy", b,
                     "--dst_checkpoint", tmp_path / "b")
    assert rc == 0, err
    oracle = mindspore_transform(str(tmp_path / "a"), str(tmp_path / "ms"), b, src_strategy=a)
    assert rank_bytes(tmp_path / "b", range(2)) == rank_bytes(oracle, range(2))


@pytest.mark.parametrize("engine", ["numpy", "mindspore"])
def test_one_rank(full, tmp_path, capsys, engine):
    _, src = full
    s = strategy(tmp_path, 2, 2)
    rc, out, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "out", "--dst_strategy", s,
                       "--rank_id", 3, "--world_size", 4, "--engine", engine)
    assert rc == 0, err
    assert os.listdir(tmp_path / "out") == ["rank_3"] and "1 ranks" in out
    expected = tmp_path / "by_rank.ckpt"
    transform_checkpoint_by_rank(3, {0: src}, str(expected), None, s)
    assert rank_bytes(tmp_path / "out", [3])[3] == open(expected, "rb").read()


def test_bf16_and_scalars_match_mindspore(tmp_path, capsys):
    state = random_state(seed=1)
    state["global_step"] = np.array([7], np.int32)  # in no strategy: copied to every rank, as MindSpore does
    src = save(state, str(tmp_path / "bf16" / "full.ckpt"), dtype=ms.bfloat16)
    s = strategy(tmp_path, 2, 2)
    rc, _, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "out", "--dst_strategy", s)
    assert rc == 0, err
    oracle = mindspore_transform(src, str(tmp_path / "ms"), s)
    assert rank_bytes(tmp_path / "out", range(4)) == rank_bytes(oracle, range(4))
    got = ms.load_checkpoint(str(tmp_path / "out" / "rank_2" / "checkpoint_2.ckpt"))
    assert got["model.layers.0.attention.wq.weight"].dtype == ms.bfloat16
    assert got["global_step"].asnumpy().tolist() == [7]


def test_safetensors_in_and_out(full, tmp_path, capsys):
    state, src = full
    s = strategy(tmp_path, 1, 2)
    rc, _, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "st", "--dst_strategy", s,
                     "--format", "safetensors")
    assert rc == 0, err
    lay = ParallelLayout(1, 2)
    for r in range(2):
        got = ms.load_checkpoint(str(tmp_path / "st" / f"rank_{r}" / f"checkpoint_{r}.safetensors"),
                                 format="safetensors")
        assert sorted(got) == sorted(state)
        for name, arr in state.items():
            assert got[name].asnumpy().tobytes() == lay.shard(name, arr, r).tobytes()
    rc, _, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "st_ms", "--dst_strategy", s,
                     "--format", "safetensors", "--engine", "mindspore")
    assert rc == 0, err
    assert rank_bytes(tmp_path / "st_ms", range(2), "safetensors") == rank_bytes(tmp_path / "st", range(2), "safetensors")
    st_src = save(state, str(tmp_path / "src_st" / "full.safetensors"), fmt="safetensors")
    rc, _, err = run(capsys, "--src_checkpoint", st_src, "--dst_checkpoint", tmp_path / "from_st", "--dst_strategy", s)
    assert rc == 0, err
    rc, _, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "from_ckpt", "--dst_strategy", s)
    for r in range(2):  # same tensors; the order follows the source file, which differs
        a = ms.load_checkpoint(str(tmp_path / "from_st" / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
        b = ms.load_checkpoint(str(tmp_path / "from_ckpt" / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
        assert {k: v.asnumpy().tobytes() for k, v in a.items()} == {k: v.asnumpy().tobytes() for k, v in b.items()}


def test_strategy_directory_and_rerun_into_the_same_output(full, tmp_path, capsys):
    _, src = full
    s = strategy(tmp_path, 2, 2)
    folder = tmp_path / "per_rank"
    folder.mkdir()
    for r in range(4):
        shutil.copyfile(s, folder / f"ckpt_strategy_rank_{r}.ckpt")
    assert run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "a", "--dst_strategy", s)[0] == 0
    for _ in range(2):  # the second run replaces the first one's shards
        rc, _, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "b", "--dst_strategy", folder)
        assert rc == 0, err
    rc, _, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "c", "--dst_strategy", folder,
                     "--engine", "mindspore")  # MindSpore reads the directory merged by merge_pipeline_strategys
    assert rc == 0, err
    expected = rank_bytes(tmp_path / "a", range(4))
    assert rank_bytes(tmp_path / "b", range(4)) == expected and rank_bytes(tmp_path / "c", range(4)) == expected
    assert sorted(os.listdir(tmp_path / "b")) == [f"rank_{r}" for r in range(4)]


def test_optimizer_sharded_strategy_goes_through_mindspore(full, tmp_path, capsys):
    state, src = full
    # tp 2 over dev (2, 2), and dim 0 of the split weights further split over the 2 dp replicas
    # (optimizer parallel; MindSpore wants the step to be the model-parallel size)
    entries = {k: TensorLayout(v.dev_matrix, v.tensor_map, opt_shard_step=2, opt_shard_size=-1)
               if max(v.splits) > 1 else v for k, v in layout_strategy(ParallelLayout(2, 2), SHAPES).items()}
    s = write_layouts(str(tmp_path / "opt.ckpt"), entries)
    rc, out, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "out", "--dst_strategy", s)
    assert rc == 0 and ", mindspore) ->" in out, err
    got = ms.load_checkpoint(str(tmp_path / "out" / "rank_1" / "checkpoint_1.ckpt"))
    assert got["lm_head.weight"].shape == (128 // 4, 32)  # 2 tp pieces x 2 optimizer pieces
    assert got["model.layers.0.attention.wo.weight"].shape == (32 // 2, 32 // 2)
    rc, _, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "np", "--dst_strategy", s,
                     "--engine", "numpy")
    assert rc == 1 and "use --engine mindspore" in err


def test_pipeline_stages_go_through_mindspore_both_ways(full, tmp_path, capsys):
    """full -> (tp2, pp2): rank r holds its stage's parameters only; the stages' shards -> (dp2, tp2) and
    -> full again, each equal to MindSpore's transform_checkpoints; a rank holding another stage's
    parameter is one clear line."""
    state, src = full
    pp = write_strategy_file(str(tmp_path / "pp.ckpt"), ParallelLayout(1, 2, 2), SHAPES)
    rc, out, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "stages", "--dst_strategy", pp)
    assert rc == 0 and ", mindspore) ->" in out, err
    lay = ParallelLayout(1, 2, 2)
    for r in range(4):
        got = ms.load_checkpoint(str(tmp_path / "stages" / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
        assert sorted(got) == sorted(lay.stage_names(list(SHAPES), lay.stage(r), 2))
    dst = strategy(tmp_path, 2, 2)
    rc, _, err = run(capsys, "--src_checkpoint", tmp_path / "stages", "--src_strategy", pp, "--dst_strategy", dst,
                     "--dst_checkpoint", tmp_path / "dp2tp2")
    assert rc == 0, err
    oracle = mindspore_transform(str(tmp_path / "stages"), str(tmp_path / "ms"), dst, src_strategy=pp)
    assert rank_bytes(tmp_path / "dp2tp2", range(4)) == rank_bytes(oracle, range(4))
    rc, _, err = run(capsys, "--src_checkpoint", tmp_path / "stages", "--src_strategy", pp,
                     "--dst_checkpoint", tmp_path / "merged" / "model.ckpt")
    assert rc == 0, err
    merged = ms.load_checkpoint(str(tmp_path / "merged" / "model.ckpt"))
    assert all(merged[k].asnumpy().tobytes() == v.tobytes() for k, v in state.items())
    stray = tmp_path / "stages" / "rank_3" / "checkpoint_3.ckpt"  # stage 1 with a stage-0 weight
    saved = ms.load_checkpoint(str(stray))
    ms.save_checkpoint([{"name": k, "data": v} for k, v in saved.items()] +
                       [{"name": "model.tok_embeddings.embedding_weight", "data": ms.Tensor(np.zeros((64, 32), np.float32))}],
                       str(stray))
    rc, _, err = run(capsys, "--src_checkpoint", tmp_path / "stages", "--src_strategy", pp,
                     "--dst_checkpoint", tmp_path / "never")
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert "rank 3 holds parameter 'model.tok_embeddings.embedding_weight'" in err and not (tmp_path / "never").exists()


# ---------------------------------------------------------------------------- bad input


def _drop(name):
    return {k: v for k, v in SHAPES.items() if k != name}


BAD = {
    "weight missing from the checkpoint": (
        lambda t: dict(state=_drop("model.layers.1.ffn_norm.weight")),
        "parameter 'model.layers.1.ffn_norm.weight' is in --dst_strategy but not in the checkpoint"),
    "weight missing from the strategy": (
        lambda t: dict(strategy_shapes=_drop("lm_head.weight")),
        "parameter 'lm_head.weight' is in the checkpoint but not in --dst_strategy"),
    "shape the layout cannot split": (
        lambda t: dict(state={**SHAPES, "model.tok_embeddings.embedding_weight": (129, 32)}),
        "parameter 'model.tok_embeddings.embedding_weight' of shape [129, 32]: dim 0 (size 129) cannot be split "
        "into 2 equal pieces"),
    "world size mismatch": (
        lambda t: dict(extra=["--world_size", "8"]),
        "--dst_strategy describes 4 devices, but --world_size is 8"),
    "rank outside the world": (
        lambda t: dict(extra=["--rank_id", "4", "--world_size", "4"]),
        "--rank_id 4 is outside the world of 4 ranks"),
    "rank without world size": (
        lambda t: dict(extra=["--rank_id", "1"]),
        "--rank_id needs --world_size and --dst_strategy"),
    "strategy over mixed device counts": (
        lambda t: dict(strategy_file=write_layouts(str(t / "mixed.ckpt"), {
            **layout_strategy(ParallelLayout(2, 2), _drop("model.norm_out.weight")),
            "model.norm_out.weight": TensorLayout((1, 2), (-1,))})),
        "parameter 'model.norm_out.weight' is laid out over 2 devices"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_clear_line_and_writes_nothing(full, tmp_path, capsys, case):
    make, message = BAD[case]
    spec = make(tmp_path)
    src = full[1]
    if "state" in spec:
        src = save(random_state(spec["state"]), str(tmp_path / "src" / "bad.ckpt"))
    s = spec.get("strategy_file") or write_strategy_file(str(tmp_path / "s.ckpt"), ParallelLayout(2, 2),
                                                         spec.get("strategy_shapes", SHAPES))
    before = sorted(os.listdir(tmp_path))
    rc, out, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "out", "--dst_strategy", s,
                       *spec.get("extra", []))
    assert rc == 1
    assert err.count("\n") == 1 and err.startswith("transform_checkpoint: error: ") and message in err, err
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary directory


def test_bad_sharded_sources(full, tmp_path, capsys):
    _, src = full
    s2, s4 = strategy(tmp_path, 1, 2), strategy(tmp_path, 2, 2)
    assert run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "shards", "--dst_strategy", s4)[0] == 0
    cases = [
        (["--src_strategy", s2], "--src_strategy describes 2 devices, but"),
        (["--dst_strategy", s2], "holds 4 rank shards: give --src_strategy"),
    ]
    for extra, message in cases:
        rc, _, err = run(capsys, "--src_checkpoint", tmp_path / "shards", "--dst_checkpoint", tmp_path / "out", *extra)
        assert rc == 1 and message in err, err
    # a shard whose shape disagrees with the strategy
    bad_rank = tmp_path / "shards" / "rank_2" / "checkpoint_2.ckpt"
    shard = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(bad_rank)).items()}
    shard["model.layers.0.attention.wo.weight"] = np.zeros((32, 32), np.float32)
    os.remove(bad_rank)
    save(shard, str(bad_rank))
    rc, _, err = run(capsys, "--src_checkpoint", tmp_path / "shards", "--src_strategy", s4,
                     "--dst_checkpoint", tmp_path / "out")
    assert rc == 1 and "parameter 'model.layers.0.attention.wo.weight' of rank 2 has shape [32, 32]" in err, err
    assert not (tmp_path / "out").exists()


def test_command_line(full, tmp_path):
    _, src = full
    s = strategy(tmp_path, 1, 2)
    ok = subprocess.run([sys.executable, SCRIPT, f"--src_checkpoint={src}", f"--dst_checkpoint={tmp_path / 'out'}",
                         f"--dst_strategy={s}", "--prefix=qwen_"], capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert sorted(os.listdir(tmp_path / "out" / "rank_1")) == ["qwen_1.ckpt"]
    bad = subprocess.run([sys.executable, SCRIPT, f"--src_checkpoint={tmp_path / 'nope.ckpt'}",
                          f"--dst_checkpoint={tmp_path / 'out2'}", f"--dst_strategy={s}"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 1 and "no such checkpoint file or directory" in bad.stderr


def test_qwen3_slices_are_byte_identical_to_mindspore_and_its_qk_norms_replicated(tmp_path, capsys):
    """Qwen3's parameters (q_norm/k_norm (d,), no q/k/v bias, head_dim 12 != 32 / 4) in the strategy
    file and through the script: MindSpore's own transform gives the same bytes; the QK-norm weights
    are whole on every rank, wq's rows split."""
    cfg = Qwen2Config(model_type="qwen3", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=12)
    shapes = expected_shapes(cfg)
    assert shapes["model.layers.1.attention.q_norm.weight"] == (12,) and "model.layers.1.attention.wq.bias" not in shapes
    state = random_state(shapes, seed=3)
    src = save(state, str(tmp_path / "full3.ckpt"))
    s = strategy(tmp_path, 2, 2, shapes, name="qwen3_dp2tp2.ckpt")
    rc, _, err = run(capsys, "--src_checkpoint", src, "--dst_checkpoint", tmp_path / "out", "--dst_strategy", s)
    assert rc == 0, err
    oracle = mindspore_transform(src, str(tmp_path / "ms"), s)
    assert rank_bytes(tmp_path / "out", range(4)) == rank_bytes(oracle, range(4))
    for r in range(4):
        got = ms.load_checkpoint(str(tmp_path / "out" / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
        assert got["model.layers.0.attention.k_norm.weight"].asnumpy().tobytes() == \
            state["model.layers.0.attention.k_norm.weight"].tobytes()
        assert got["model.layers.0.attention.wq.weight"].shape == (24, 32)


def test_lora_adapters_slice_by_their_projections_split_and_merge_back(tmp_path, capsys):
    """A LoRA run's strategy (`write_layout_strategies(adapters=...)`: what its checkpoints hold, the adapters and
    their moments) slices a full adapter checkpoint as the numpy split rules written here say (a column-parallel
    projection's B by rows, a row-parallel one's A by columns, the rest whole), byte-identical to MindSpore's
    transform_checkpoints, and the pieces merge back bit for bit."""
    from mindgrpo.models.lora_targets import full_adapter_shapes
    from mindgrpo.parallel.strategy import read_strategy, write_layout_strategies

    adapters = full_adapter_shapes(CFG, 4, ["all-linear"])
    assert len(adapters) == 2 * 7 * CFG.num_hidden_layers
    paths = write_layout_strategies(str(tmp_path / "strategy"), CFG, ParallelLayout(1, 2), ParallelLayout(2, 1),
                                    adapters=adapters)
    assert set(read_strategy(paths["train"])) == {p + n for p in ("", "adam_m.", "adam_v.") for n in adapters}
    state = random_state(adapters, seed=3)
    full = save(state, str(tmp_path / "adapters.ckpt"))
    rc, _, err = run(capsys, f"--src_checkpoint={full}", f"--dst_checkpoint={tmp_path / 'tp2'}",
                     f"--dst_strategy={paths['train']}")
    assert rc == 0, err
    ours = rank_bytes(str(tmp_path / "tp2"), (0, 1))
    assert ours == rank_bytes(mindspore_transform(full, str(tmp_path / "oracle"), paths["train"]), (0, 1))
    for rank in (0, 1):
        pieces = {k: v.asnumpy() for k, v in ms.load_checkpoint(
            str(tmp_path / "tp2" / f"rank_{rank}" / f"checkpoint_{rank}.ckpt")).items()}
        assert sorted(pieces) == sorted(adapters)
        for name, whole in state.items():
            column = any(f".{w}." in name for w in ("wq", "wk", "wv", "w1", "w3"))
            if name.endswith(".lora_b") and column:
                half = whole.shape[0] // 2
                want = whole[rank * half:(rank + 1) * half]
            elif name.endswith(".lora_a") and not column:
                half = whole.shape[1] // 2
                want = whole[:, rank * half:(rank + 1) * half]
            else:
                want = whole
            assert pieces[name].tobytes() == np.ascontiguousarray(want).tobytes(), (rank, name)
    rc, _, err = run(capsys, f"--src_checkpoint={tmp_path / 'tp2'}", f"--src_strategy={paths['train']}",
                     f"--dst_checkpoint={tmp_path / 'merged.ckpt'}")
    assert rc == 0, err
    merged = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(tmp_path / "merged.ckpt")).items()}
    assert all(merged[k].tobytes() == v.tobytes() for k, v in state.items()) and len(merged) == len(state)
