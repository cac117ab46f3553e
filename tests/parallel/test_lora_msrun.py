"""LoRA under msrun (docs/lora.md): adapters on the training tp2 policy against one device, and the adapter-only
sync to inference dp2 against a full-weight sync of the merged weights. One msrun job of two ranks (the module
fixture `lora_job`: tests/parallel/workers/lora_ranks.py); the references are the one-device model in the same
process and, for the sync, the merged weights W + s B A computed in numpy and resharded whole. Then the tp2
policy's checkpoint as the trainer writes it under msrun (each rank its pieces, the base by path and a layout-free
sha256, the PEFT folder whole), resumed exactly, and merged / sliced by scripts/transform_checkpoint.py. Then the same
under training pp2 (a layer per stage, each stage with its layers' adapters) against the one-device model computed
here (`one_device_pp`): the updates, the reference, the adapter-only sync out of the stages and its rollouts, the
checkpoint and its resume."""

import hashlib
import json
import os

import numpy as np
import pytest

from mindgrpo.models.convert import expected_shapes
from mindgrpo.parallel.layout import ParallelLayout
from msrun_util import load_results, run_msrun
from parallel_cases import CFG, CFG_PP2, LOSS, SEED, UPDATE_KEYS, experience_arrays, prompts, sampling_logprobs, \
    updater_kwargs

pytestmark = [pytest.mark.msrun, pytest.mark.slow]
TRAIN = ParallelLayout(dp=1, tp=2)
PP2 = ParallelLayout(dp=1, tp=1, pp=2)  # (e): rank k is stage k, which holds decoder layer k
RANK, TARGETS = 4, 7  # the worker's adapters: rank 4 on all seven projections of CFG's one layer


@pytest.fixture(scope="module")
def lora_job(tmp_path_factory):
    work = tmp_path_factory.mktemp("lora_job")
    (work / "out").mkdir()
    run_msrun("lora_ranks.py", 2, str(work / "log"), [work / "out"], timeout=1800)  # a guard against a hang
    return load_results(str(work / "out"), 2)


def prefixed(arrays, prefix):
    return {k[len(prefix) + 1:]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def merged_pieces(arrays, prefix):
    """The ranks' tp2 pieces of each adapter under `prefix`, merged by the layout's split rules."""
    names = prefixed(arrays[0], prefix)
    return {n: TRAIN.merge(n, [prefixed(a, prefix)[n] for a in arrays]) for n in names}


def test_split_rules_of_the_adapters_follow_their_projection():
    """Column-parallel (q, k, v, gate, up): B by output rows, A whole; row-parallel (o, down): A by input columns,
    B whole (x_k A_k^T summed over the ranks before B)."""
    for proj, column in (("attention.wq", True), ("attention.wk", True), ("attention.wv", True),
                         ("attention.wo", False), ("feed_forward.w1", True), ("feed_forward.w3", True),
                         ("feed_forward.w2", False)):
        a, b = f"model.layers.3.{proj}.lora_a", f"model.layers.3.{proj}.lora_b"
        weight = ParallelLayout.param_split(f"model.layers.3.{proj}.weight")
        assert (ParallelLayout.param_split(a), ParallelLayout.param_split(b)) == ((None, 0) if column else (1, None))
        assert weight == (0 if column else 1)


def test_the_reference_with_adapters_off_under_tp2_is_the_base_bit_for_bit(lora_job):
    arrays, _ = lora_job
    for a in arrays:
        assert a["a/logp_off"].tobytes() == a["a/logp_base"].tobytes()


def test_adapters_start_as_one_device_and_two_updates_under_tp2_match_it(lora_job):
    arrays, metrics = lora_job
    init, dense = merged_pieces(arrays, "init/tp"), prefixed(arrays[0], "b/dense")
    assert len(dense) == 2 * TARGETS
    assert np.concatenate([init[n].ravel() for n in dense]).tobytes() == arrays[0]["init/dense"].tobytes()
    for i in range(2):
        one = metrics[0][f"update{i}/dense"]
        assert one["grad_norm"] > 0.05  # the clip (0.05) is active: it needs the whole gradient's norm over the pieces
        for rank, m in enumerate(metrics):
            for key in UPDATE_KEYS:
                assert m[f"update{i}/tp"][key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (i, rank, key)
    trained = merged_pieces(arrays, "b/tp")
    for name, full in dense.items():
        assert np.abs(full - init[name]).max() > 1e-4, name  # the second update moved A too (B was 0 at the first)
        np.testing.assert_allclose(trained[name], full, rtol=0, atol=2e-5, err_msg=name)
    for m in metrics:  # only the adapters train: their gradients and moments alone (one device's: rank 0's)
        assert m["trainable/tp"] == sorted(dense) == metrics[0]["trainable/dense"]
        assert m["optimizer/tp"] == metrics[0]["optimizer/dense"]
        assert {n.split(".", 1)[1] for n in m["optimizer/tp"]} == set(dense)


def test_adapter_only_sync_gives_the_rollouts_of_a_full_sync_of_the_merged_weights(lora_job):
    """Training tp2 -> inference dp2: the adapters alone (the engine merges them into its copies) against the tp2
    pieces' W + s B A resharded whole into a model without adapters: greedy identical, sampled within 1e-5."""
    arrays, metrics = lora_job
    trained = merged_pieces(arrays, "b/tp")
    for a, m in zip(arrays, metrics):
        for name, full in trained.items():  # each inference rank holds the whole adapters, bit for bit
            assert a[f"c/adapters/{name}"].tobytes() == full.tobytes(), name
        assert m["rollout/greedy/adapters"] == m["rollout/greedy/merged"]
        assert len(m["rollout/greedy/adapters"]) == 6 and all(len(t) == 8 for t in m["rollout/greedy/adapters"])
        assert m["rollout/sampled/adapters"] == m["rollout/sampled/merged"]
        assert len({tuple(t) for t in m["rollout/sampled/merged"]}) == 6
        np.testing.assert_allclose(a["c/sampled_logp_adapters"], a["c/sampled_logp_merged"], rtol=0, atol=1e-5)
    init = merged_pieces(arrays, "init/tp")  # the first sync replaced the inference model's own adapters
    for a in arrays:
        for name, full in init.items():
            assert a[f"sync0/{name}"].tobytes() == full.tobytes(), name


def test_the_sync_moves_the_adapters_bytes_only(lora_job):
    _, metrics = lora_job
    h, inter, nh, nkv = CFG.hidden_size, CFG.intermediate_size, CFG.num_attention_heads, CFG.num_key_value_heads
    d = h // nh
    outs_ins = [(nh * d, h), (nkv * d, h), (nkv * d, h), (h, nh * d), (inter, h), (inter, h), (h, inter)]
    adapters = 4 * sum(RANK * (o + i) for o, i in outs_ins)  # fp32 A (r, in) + B (out, r), whole on each rank
    weights = 4 * sum(int(np.prod(s)) for s in expected_shapes(CFG).values())
    for m in metrics:
        lora, full = m["sync/adapters"], m["sync/full"]
        assert lora["sync/bytes"] == adapters == m["sync/first"]["sync/bytes"]
        assert full["sync/bytes"] == weights
        assert 0 < lora["sync/bytes_received"] <= lora["sync/bytes"]  # B of the column-parallel ones, A of the rows'
        assert lora["sync/bytes_received"] == lora["sync/bytes_min"]


# ---------------------------------------------------------------------------- (d) checkpoints under msrun

def column_parallel(name):
    return ".wq." in name or ".wk." in name or ".wv." in name or ".w1." in name or ".w3." in name


def numpy_merge(name, pieces):
    """The whole adapter (or its moment) from its tp pieces, by the rules written out here: a column-parallel
    projection's B by output rows, a row-parallel one's A by input columns, the rest whole (the pieces equal)."""
    if name.endswith(".lora_b") and column_parallel(name):
        return np.concatenate(pieces, axis=0)
    if name.endswith(".lora_a") and not column_parallel(name):
        return np.concatenate(pieces, axis=1)
    assert pieces[0].tobytes() == pieces[1].tobytes(), name
    return pieces[0]


# what a 2-rank LoRA step holds: each rank's adapters and moments, the PEFT folder whole, no copy of the base
LORA_FILES = {"lora/rank_0/lora.ckpt", "lora/rank_1/lora.ckpt", "optimizer/rank_0/optimizer.ckpt",
              "optimizer/rank_1/optimizer.ckpt", "adapter/adapter_model.safetensors", "adapter/adapter_config.json",
              "state.json", "train_strategy.ckpt"}


def written_base_sha256(path: str, cfg, one: dict) -> str:
    """Checks the base a checkpoint wrote at `path` against the one-device base `one` (name -> array) bit for bit
    and returns the sha256 of `one` computed here: names sorted, each name and shape, then its fp32 bytes."""
    from mindgrpo.models.checkpoint import read_model_state

    written = read_model_state(path, cfg)
    assert sorted(written) == sorted(one)
    h = hashlib.sha256()
    for name in sorted(one):
        assert written[name].tobytes() == one[name].tobytes(), name
        h.update(f"{name}{tuple(one[name].shape)}".encode())
        h.update(one[name].astype(np.float32).tobytes())
    return h.hexdigest()


def manifest_files(saved: str) -> set:
    with open(os.path.join(saved, "manifest.json")) as f:
        return set(json.load(f)["files"])


def test_a_tp2_checkpoint_holds_each_ranks_pieces_and_the_peft_folder_whole(lora_job):
    from mindgrpo.models.ckpt_codec import read_ckpt
    from mindgrpo.models.lora_files import read_adapter

    arrays, metrics = lora_job
    saved = metrics[0]["d/saved"]
    files = manifest_files(saved)
    assert LORA_FILES <= files
    assert not any(f.startswith(("policy/", "reference/")) for f in files)  # the base is referred to, not copied
    for rank, a in enumerate(arrays):  # every rank wrote its own pieces
        pieces = read_ckpt(os.path.join(saved, "lora", f"rank_{rank}", "lora.ckpt"))
        moments = read_ckpt(os.path.join(saved, "optimizer", f"rank_{rank}", "optimizer.ckpt"))
        mine = prefixed(a, "d/saved")
        assert len(pieces) == 2 * TARGETS and len(moments) == 4 * TARGETS
        for name, (_, value) in {**pieces, **moments}.items():
            assert value.tobytes() == mine[name].tobytes(), (rank, name)
    spec, whole = read_adapter(os.path.join(saved, "adapter"))
    assert (spec.rank, spec.alpha) == (RANK, 8.0)
    trained, dense = prefixed(arrays[0], "b/tp"), prefixed(arrays[0], "b/dense")
    assert sorted(whole) == sorted(dense)
    for name, value in whole.items():  # gathered by rank 0: the pieces whole, bit for bit; the one-device run's
        assert value.tobytes() == numpy_merge(name, [prefixed(a, "b/tp")[name] for a in arrays]).tobytes(), name
        np.testing.assert_allclose(value, dense[name], rtol=0, atol=2e-5, err_msg=name)
    assert len(trained) == len(whole)


def test_the_lora_base_is_written_once_whole_and_its_sha256_is_the_one_device_models(lora_job):
    """The base was drawn at random: rank 0 wrote it whole from the tp2 pieces; its sha256 (names, full shapes, fp32
    bytes in name order, computed here by hashlib) is the one a one-device run of the same base records."""
    from mindgrpo.models.checkpoint import model_state
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    _, metrics = lora_job
    base = metrics[0]["d/lora_base"]
    assert all(m["d/lora_base"] == base for m in metrics)
    assert os.path.basename(base["path"]) == base["sha256"][:16] + ".ckpt"
    assert os.path.dirname(base["path"]) == os.path.join(os.path.dirname(metrics[0]["d/saved"]), "lora_base")
    one = {k: v for k, v in model_state(Qwen2ForCausalLM(CFG, seed=SEED, max_positions=128)).items()
           if ".lora_" not in k}
    assert base["sha256"] == written_base_sha256(base["path"], CFG, one) == metrics[0]["d/sha_one_device"]


def test_resuming_a_tp2_lora_checkpoint_is_exact(lora_job):
    """After a third update and the base spoilt, the checkpoint brings back every rank's adapters and moments and
    its base bit for bit, and the third update again gives the same metrics and adapters."""
    arrays, metrics = lora_job
    for a, m in zip(arrays, metrics):
        assert m["d/found"] == m["d/saved"]
        saved, restored = prefixed(a, "d/saved"), prefixed(a, "d/restored")
        assert sorted(saved) == sorted(restored) and len(saved) == 6 * TARGETS
        for name in saved:
            assert restored[name].tobytes() == saved[name].tobytes(), name
        assert a["d/base_restored"].tobytes() == a["d/base_tp"].tobytes()
        assert m["d/update/resumed"] == m["d/update/straight"]
        straight, resumed = prefixed(a, "d/straight"), prefixed(a, "d/resumed")
        assert any(straight[n].tobytes() != saved[n].tobytes() for n in saved)  # the update moved them
        for name in straight:
            assert resumed[name].tobytes() == straight[name].tobytes(), name


def test_transform_checkpoint_merges_and_slices_the_adapter_pieces_by_the_checkpoints_strategy(lora_job, tmp_path):
    """scripts/transform_checkpoint.py on a LoRA step: the adapters' pieces merged by the strategy the checkpoint
    holds (numpy and MindSpore's engines) equal the numpy split rules' merge, and sliced again equal each rank's."""
    from mindgrpo.models.ckpt_codec import read_ckpt
    from scripts import transform_checkpoint

    arrays, metrics = lora_job
    saved = metrics[0]["d/saved"]
    strategy = os.path.join(saved, "train_strategy.ckpt")
    for engine in ("numpy", "mindspore"):
        full = tmp_path / f"lora_{engine}.ckpt"
        assert transform_checkpoint.main([f"--src_checkpoint={saved}/lora", f"--src_strategy={strategy}",
                                          f"--dst_checkpoint={full}", f"--engine={engine}"]) == 0
        merged = {n: v for n, (_, v) in read_ckpt(str(full)).items()}
        assert len(merged) == 2 * TARGETS
        for name, value in merged.items():
            assert value.tobytes() == numpy_merge(name, [prefixed(a, "d/saved")[name] for a in arrays]).tobytes()
    shards = tmp_path / "shards"
    assert transform_checkpoint.main([f"--src_checkpoint={tmp_path / 'lora_numpy.ckpt'}", f"--dst_strategy={strategy}",
                                      f"--dst_checkpoint={shards}"]) == 0
    for rank, a in enumerate(arrays):
        (file,) = (shards / f"rank_{rank}").glob("*.ckpt")
        for name, (_, value) in read_ckpt(str(file)).items():
            assert value.tobytes() == prefixed(a, "d/saved")[name].tobytes(), (rank, name)


# ---------------------------------------------------------------------------- (e) pipeline stages


@pytest.fixture(scope="module")
def one_device_pp():
    """The one-device model of (e) (CFG_PP2, the worker's adapters) on the worker's inputs: its initial adapters, two
    updates (metrics, adapters), its greedy rollouts, its base weights."""
    from mindgrpo.grpo.actor import PolicyUpdater
    from mindgrpo.grpo.experience import pack
    from mindgrpo.grpo.ms_objective import GRPOLoss
    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.models.checkpoint import model_state
    from mindgrpo.models.lora import ALL_LINEAR, LoraSpec, adapter_state, add_adapters
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    exp = pack(*experience_arrays())
    exp.sampling_logp = sampling_logprobs(exp.mask)
    lm = Qwen2ForCausalLM(CFG_PP2, seed=SEED, max_positions=128)
    base = {k: v.copy() for k, v in model_state(lm).items()}
    add_adapters(lm, LoraSpec(rank=RANK, alpha=8.0, targets=ALL_LINEAR), seed=3)
    init = adapter_state(lm)
    updater = PolicyUpdater(lm, GRPOLoss(**LOSS), **updater_kwargs())
    metrics = [updater.update(exp, lr=1e-3) for _ in range(2)]
    greedy = SamplingParams(max_tokens=8, temperature=0.0, n=2)
    rollouts = [c.token_ids for c in RolloutEngine(lm, max_num_seqs=2).generate(prompts(), greedy)]
    return dict(init=init, metrics=metrics, trained=adapter_state(lm), rollouts=rollouts, base=base)


def stage_of(name):
    return int(name.split(".")[2])  # model.layers.<k>...: stage k


def test_pp2_stages_hold_their_layers_adapters_drawn_as_one_device(lora_job, one_device_pp):
    arrays, _ = lora_job
    init = one_device_pp["init"]
    assert len(init) == 2 * 2 * TARGETS
    for rank, a in enumerate(arrays):
        mine = prefixed(a, "e/init")
        assert sorted(mine) == sorted(n for n in init if stage_of(n) == rank)
        for name, value in mine.items():
            assert value.tobytes() == init[name].tobytes(), name


def test_pp2_lora_updates_match_one_device(lora_job, one_device_pp):
    """Two updates (B off zero, then A) through 1F1B on two stages, the clip active: it needs the norm of every
    adapter's gradient, each counted once over the stages. The tolerance is test_pipeline's for full weights."""
    arrays, metrics = lora_job
    dense = one_device_pp["trained"]
    for i, one in enumerate(one_device_pp["metrics"]):
        assert one["grad_norm"] > 0.05
        for rank, m in enumerate(metrics):
            for key in UPDATE_KEYS:  # the last stage's metrics, on every stage
                assert m[f"e/update{i}"][key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (i, rank, key)
    for rank, (a, m) in enumerate(zip(arrays, metrics)):
        mine, initial = prefixed(a, "e/trained"), prefixed(a, "e/init")
        assert sorted(mine) == sorted(n for n in dense if stage_of(n) == rank)
        assert m["e/trainable"] == sorted(mine)  # only the stage's adapters train; moments for them alone
        assert {n.split(".", 1)[1] for n in m["e/optimizer"]} == set(mine) and len(m["e/optimizer"]) == 2 * len(mine)
        for name, value in mine.items():
            assert np.abs(value - initial[name]).max() > 1e-4, name  # the second update moved A too
            np.testing.assert_allclose(value, dense[name], rtol=0, atol=1e-5, err_msg=name)


def test_pp2_reference_with_adapters_off_is_the_base_bit_for_bit(lora_job):
    arrays, _ = lora_job
    for a in arrays:  # every stage gets the last stage's log-probs
        assert a["e/logp_off"].tobytes() == a["e/logp_base"].tobytes()
        assert np.abs(a["e/logp_on"] - a["e/logp_off"]).max() > 1e-5  # the trained adapters change them


def test_pp2_adapter_only_sync_out_of_the_stages_gives_one_devices_rollouts(lora_job, one_device_pp):
    """Each inference rank (dp2, whole) gets both stages' adapters bit for bit, the sync moving the adapters' bytes
    alone (half of them from the other stage), and generates one device's greedy rollouts."""
    arrays, metrics = lora_job
    trained = {}
    for a in arrays:
        trained.update(prefixed(a, "e/trained"))
    assert len(trained) == 2 * 2 * TARGETS
    c = CFG_PP2
    h, inter, nh, nkv = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads
    d = h // nh
    outs_ins = [(nh * d, h), (nkv * d, h), (nkv * d, h), (h, nh * d), (inter, h), (inter, h), (h, inter)]
    adapters = 2 * 4 * sum(RANK * (o + i) for o, i in outs_ins)  # two layers, fp32
    dense = one_device_pp["rollouts"]
    assert len(dense) == 6 and all(len(t) == 8 for t in dense)
    for a, m in zip(arrays, metrics):
        synced = prefixed(a, "e/synced")
        assert sorted(synced) == sorted(trained)
        for name, value in synced.items():
            assert value.tobytes() == trained[name].tobytes(), name
        sync = m["e/sync"]
        assert sync["sync/bytes"] == adapters and sync["sync/bytes_min"] == adapters // 2
        assert sync["sync/bytes_min"] <= sync["sync/bytes_received"] <= adapters
        assert m["e/rollout/greedy"] == dense


def test_a_pp2_checkpoint_holds_each_stages_adapters_and_the_peft_folder_and_base_whole(lora_job, one_device_pp):
    """Each stage wrote its adapters and moments; rank 0 wrote the PEFT folder (both stages' adapters, bit for bit the
    stages', within the update tolerance one device's) and the base (drawn at random) whole, with the sha256 of the
    one-device base computed here; the resume gives the third update again bit for bit."""
    from mindgrpo.models.ckpt_codec import read_ckpt
    from mindgrpo.models.lora_files import read_adapter

    arrays, metrics = lora_job
    saved = metrics[0]["e/saved"]
    files = manifest_files(saved)
    assert LORA_FILES <= files
    stages = {}
    for rank, a in enumerate(arrays):
        mine = prefixed(a, "e/saved")
        pieces = read_ckpt(os.path.join(saved, "lora", f"rank_{rank}", "lora.ckpt"))
        moments = read_ckpt(os.path.join(saved, "optimizer", f"rank_{rank}", "optimizer.ckpt"))
        assert len(pieces) == 2 * TARGETS and len(moments) == 4 * TARGETS
        for name, (_, value) in {**pieces, **moments}.items():
            assert stage_of(name.split(".", 1)[1] if name.startswith("adam_") else name) == rank, name
            assert value.tobytes() == mine[name].tobytes(), (rank, name)
        stages.update({n: v for n, (_, v) in pieces.items()})
    spec, whole = read_adapter(os.path.join(saved, "adapter"))
    assert (spec.rank, spec.alpha) == (RANK, 8.0) and sorted(whole) == sorted(stages)
    for name, value in whole.items():
        assert value.tobytes() == stages[name].tobytes(), name
        np.testing.assert_allclose(value, one_device_pp["trained"][name], rtol=0, atol=1e-5, err_msg=name)
    base = metrics[0]["e/lora_base"]
    assert all(m["e/lora_base"] == base for m in metrics)
    one = one_device_pp["base"]
    assert base["sha256"] == written_base_sha256(base["path"], CFG_PP2, one)
    for a, m in zip(arrays, metrics):
        assert m["e/found"] == saved
        before, restored = prefixed(a, "e/saved"), prefixed(a, "e/restored")
        assert sorted(before) == sorted(restored) and len(before) == 6 * TARGETS
        for name in before:
            assert restored[name].tobytes() == before[name].tobytes(), name
        assert a["e/base_restored"].tobytes() == a["e/base"].tobytes()
        assert m["e/update/resumed"] == m["e/update/straight"]
        straight, resumed = prefixed(a, "e/straight"), prefixed(a, "e/resumed")
        assert any(straight[n].tobytes() != before[n].tobytes() for n in before)
        for name in straight:
            assert resumed[name].tobytes() == straight[name].tobytes(), name
