"""The four-rank msrun job (one launch, tests/parallel/workers/several.py):
- pipeline stages (tests/parallel/workers/pipeline_ranks.py): log-probs and one GRPO update equal to one
  device (also on packed rows), and resharding out of the stages bit-identical to MindSpore's transform_checkpoints (merge by our
  pipeline strategy file, slice by the inference one); a Qwen3's update through (dp1, tp2, pp2);
- resharding from (dp2, tp2) to (dp4, tp1) and (dp1, tp4), and the tp=4 model's logits
  (tests/parallel/workers/four_ranks.py).
scripts/grpo_one_stage.py in two stages is in test_msrun.py (the one-stage run)."""

import numpy as np
import pytest
import mindspore as ms
from mindspore.parallel import transform_checkpoints

from mindgrpo.grpo.actor import PolicyUpdater, Scorer
from mindgrpo.grpo.experience import pack
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.reward_model import RewardModel, RewardScorer
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.strategy import write_strategy_file
from msrun_util import load_results, mindspore_slices, run_msrun, save_sharded
from parallel_cases import CFG4, CFG_PP, CFG_PP_QWEN3, LOSS, SEED, UPDATE_KEYS, experience_arrays, full_logits, prompts, \
    rm_sequences, sampling_logprobs, updater_kwargs

pytestmark = [pytest.mark.msrun, pytest.mark.slow]

TP_PP, DP_PP, PP4 = ParallelLayout(dp=1, tp=2, pp=2), ParallelLayout(dp=2, tp=1, pp=2), ParallelLayout(pp=4)
DP4 = ParallelLayout(dp=4, tp=1)
LAYOUTS = {"tp_pp": TP_PP, "dp_pp": DP_PP, "pp4": PP4}
PACKED = {"tp_pp_packed": TP_PP}  # packed rows (mindgrpo/grpo/packing.py) through the same stages
RESHARDS = [("tp_pp_to_dp4", TP_PP, DP4), ("dp_pp_to_dp4", DP_PP, DP4), ("pp4_to_dp4", PP4, DP4)]


@pytest.fixture(scope="module")
def four_rank_job(tmp_path_factory):
    work = tmp_path_factory.mktemp("four_rank_job")
    (work / "pipeline").mkdir()
    (work / "four_ranks").mkdir()
    run_msrun("several.py", 4, str(work / "log"),
              ["pipeline_ranks.py", work / "pipeline", "::", "four_ranks.py", work / "four_ranks"], timeout=2400)
    return work


@pytest.fixture(scope="module")
def ranks(four_rank_job):
    return load_results(str(four_rank_job / "pipeline"), 4)


@pytest.fixture(scope="module")
def one_device():
    """The one-device model on the worker's inputs: log-probs, one update (metrics, weights), greedy rollouts."""
    exp = pack(*experience_arrays())
    exp.sampling_logp = sampling_logprobs(exp.mask)
    lm = Qwen2ForCausalLM(CFG_PP, seed=SEED, max_positions=128)
    logp = Scorer(lm, 3)(exp)
    metrics = PolicyUpdater(lm, GRPOLoss(**LOSS), **updater_kwargs()).update(exp, lr=1e-3)
    weights = {n: p.asnumpy() for n, p in lm.parameters_and_names()}
    greedy = SamplingParams(max_tokens=8, temperature=0.0, n=2)
    rollouts = [c.token_ids for c in RolloutEngine(lm).generate(prompts(), greedy)]
    return logp, metrics, weights, rollouts


def prefixed(arrays, prefix):
    return {k[len(prefix) + 1:]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def test_stages_hold_their_layers_and_start_from_the_one_device_weights(ranks):
    arrays, _ = ranks
    full = {n: p.asnumpy() for n, p in Qwen2ForCausalLM(CFG_PP, seed=SEED).parameters_and_names()}
    for key, layout in LAYOUTS.items():
        for rank, a in enumerate(arrays):
            mine = prefixed(a, f"a/initial_{key}")
            stage = layout.stage(rank)
            assert sorted(mine) == sorted(layout.stage_names(list(full), stage, CFG_PP.num_hidden_layers))
            layers = {int(n.split(".")[2]) for n in mine if ".layers." in n}
            assert layers == ({stage} if layout.pp == 4 else {2 * stage, 2 * stage + 1})
            for name, piece in mine.items():
                assert piece.tobytes() == layout.shard(name, full[name], layout.coords(rank)[1]).tobytes(), name


@pytest.mark.parametrize("key", [*LAYOUTS, *PACKED])
def test_pipeline_logprobs_match_one_device_on_every_stage(ranks, one_device, key):
    arrays, _ = ranks
    expected = one_device[0]
    assert np.abs(expected).max() > 1.0
    for a in arrays:
        np.testing.assert_allclose(a[f"a/logp_{key}"], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("key", [*LAYOUTS, *PACKED])
def test_pipeline_grpo_update_matches_one_device(ranks, one_device, key):
    """Four micro-batches through two stages, three through four (1F1B, the stages before the last recomputing
    their forward), two packed ones (one with an empty row) through two, the clip active (it needs the norm summed
    over the stages and tensor-parallel pieces)."""
    arrays, metrics = ranks
    layout = {**LAYOUTS, **PACKED}[key]
    initial_key = "tp_pp" if key in PACKED else key  # the same seed's stages
    one, dense = one_device[1], one_device[2]
    assert one["grad_norm"] > 0.05
    assert 0 < one["rollout_correction/clipfrac"] < 1  # the rollout correction truncates some weights
    for rank, (a, m) in enumerate(zip(arrays, metrics)):
        got = m[f"update/{key}"]
        for k in UPDATE_KEYS:  # the metrics, maxima among them, are the last stage's on every stage
            assert got[k] == pytest.approx(one[k], rel=1e-5, abs=1e-6), (rank, k)
        mine = prefixed(a, f"b/{key}")
        initial = prefixed(a, f"a/initial_{initial_key}")
        assert max(np.abs(mine[n] - initial[n]).max() for n in mine) > 1e-4  # the update moved this stage
        for name, piece in mine.items():
            np.testing.assert_allclose(piece, layout.shard(name, dense[name], layout.coords(rank)[1]), rtol=0,
                                       atol=1e-5, err_msg=name)


def test_qwen3_update_through_tp2_pp2_matches_one_device(ranks):
    """Qwen3 (QK-norm, no q/k/v bias, head_dim != H / nh) in two stages of two tensor-parallel pieces: the
    step's metrics and every stage's updated pieces (the replicated QK-norm weights included) equal one
    device's update."""
    arrays, metrics = ranks
    exp = pack(*experience_arrays())
    exp.sampling_logp = sampling_logprobs(exp.mask)
    lm = Qwen2ForCausalLM(CFG_PP_QWEN3, seed=SEED, max_positions=128)
    one = PolicyUpdater(lm, GRPOLoss(**LOSS), **updater_kwargs()).update(exp, lr=1e-3)
    dense = {n: p.asnumpy() for n, p in lm.parameters_and_names()}
    assert one["grad_norm"] > 0.05 and np.abs(dense["model.layers.3.attention.q_norm.weight"] - 1).max() > 1e-4
    for rank, (a, m) in enumerate(zip(arrays, metrics)):
        for k in UPDATE_KEYS:
            assert m["update/qwen3_tp_pp"][k] == pytest.approx(one[k], rel=1e-5, abs=1e-6), (rank, k)
        mine = prefixed(a, "b/qwen3_tp_pp")
        assert sorted(mine) == sorted(TP_PP.stage_names(list(dense), TP_PP.stage(rank), 4))
        assert any(".q_norm." in n for n in mine)
        for name, piece in mine.items():  # 3% of the step (lr 1e-3): AdamW's first step is g / |g|, so a gradient
            # near zero turns rounding into up to 1.1e-5 (a wq entry); a wrong QK-norm gradient moves by ~1e-3
            np.testing.assert_allclose(piece, TP_PP.shard(name, dense[name], TP_PP.coords(rank)[1]), rtol=0,
                                       atol=3e-5, err_msg=name)


@pytest.mark.parametrize("key, src, dst", RESHARDS)
def test_reshard_out_of_stages_is_bit_identical_to_transform_checkpoints(ranks, tmp_path, key, src, dst):
    arrays, metrics = ranks
    shapes = expected_shapes(CFG_PP)
    src_key = key.split("_to_")[0]
    src_strategy = write_strategy_file(str(tmp_path / "src.ckpt"), src, shapes)
    dst_strategy = write_strategy_file(str(tmp_path / "dst.ckpt"), dst, shapes)
    transform_checkpoints(save_sharded([prefixed(a, f"b/{src_key}") for a in arrays], str(tmp_path / "pieces")),
                          str(tmp_path / "out"), "ck_", src_strategy, dst_strategy)
    for rank, a in enumerate(arrays):
        expected = ms.load_checkpoint(str(tmp_path / "out" / f"rank_{rank}" / f"ck_{rank}.ckpt"))
        got = prefixed(a, f"c/{key}")
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            assert got[name].tobytes() == value.asnumpy().tobytes(), (rank, name)
        m = metrics[rank][f"reshard/{key}"]
        assert m["sync/bytes_received"] >= m["sync/bytes_min"] > 0  # every rank lacks the other stage


def test_rollouts_after_resharding_out_of_stages_match_one_device(ranks, one_device):
    _, metrics = ranks
    dense = one_device[3]
    assert len(dense) == 6 and all(len(t) == 8 for t in dense)
    for m in metrics:
        assert m["rollout/greedy/tp_pp_to_dp4"] == dense


# ------------------------------------------------------------------------------ four ranks


@pytest.fixture(scope="module")
def four_ranks(four_rank_job):
    return load_results(str(four_rank_job / "four_ranks"), 4)


@pytest.mark.parametrize("key, layout", [("dp4", ParallelLayout(dp=4, tp=1)), ("tp4", ParallelLayout(dp=1, tp=4))])
def test_reshard_dp2tp2_is_bit_identical_to_transform_checkpoints(four_ranks, tmp_path, key, layout):
    arrays, metrics = four_ranks
    full = {n: p.asnumpy() for n, p in Qwen2ForCausalLM(CFG4, seed=SEED).parameters_and_names()}
    train = ParallelLayout(dp=2, tp=2)
    for rank, a in enumerate(arrays):  # the policy pieces are the seed's full weights, sliced
        for name, piece in prefixed(a, "policy").items():
            assert piece.tobytes() == train.shard(name, full[name], train.coords(rank)[1]).tobytes()
    expected = mindspore_slices(full, layout, CFG4, str(tmp_path))
    for rank, a in enumerate(arrays):
        got = prefixed(a, key)
        assert sorted(got) == sorted(expected[rank])
        for name, value in expected[rank].items():
            assert got[name].tobytes() == value.tobytes(), (key, rank, name)
    received = [m[key]["sync/bytes_received"] for m in metrics]
    minimum = [m[key]["sync/bytes_min"] for m in metrics]
    if key == "tp4":  # ranks 0 and 3 hold their quarter already; 1 and 2 need one quarter
        assert minimum[0] == minimum[3] == 0 and minimum[1] == minimum[2] > 0
        assert received[1] == minimum[1] and received[0] == minimum[1]  # plus the AllGather's padding
    else:
        assert received == minimum


def test_tp4_logits_match_one_device(four_ranks):
    arrays, _ = four_ranks
    expected = full_logits(CFG4, SEED)
    for a in arrays:
        np.testing.assert_allclose(a["logits_tp4"], expected, rtol=0, atol=1e-5)


def test_a_reward_model_in_layouts_of_its_own_scores_each_replicas_share(four_ranks):
    """reward_config.reward_models[i].model_parallel (parallel/replica_scores.py): four whole replicas (dp4) and two
    tp2 replicas (dp2 x tp2) each score their share of nine sequences (dealt by tokens, disjoint, together all), and
    every rank gets every score: the same bits on every rank, one device's scores within fp32 rounding (the micro-batches
    hold other rows and padded lengths than one device's)."""
    arrays, metrics = four_ranks
    sequences = rm_sequences()
    expected = RewardScorer(RewardModel(CFG4, seed=SEED), 4)(sequences)
    assert np.ptp(expected) > 1e-3  # the scores differ between sequences
    for key, replicas in (("rm_dp4", 4), ("rm_dp2tp2", 2)):
        for a in arrays:
            assert a[key].tobytes() == arrays[0][key].tobytes(), key
        np.testing.assert_allclose(arrays[0][key], expected, rtol=0, atol=1e-5)
        shares = {}  # replica index -> the shares its ranks scored (a tp2 replica's two ranks: the same one)
        for m in metrics:
            index, count = m[f"{key}/replica"]
            assert count == replicas
            shares.setdefault(index, []).append(tuple(m[f"{key}/share"]))
        assert sorted(shares) == list(range(replicas))
        assert all(len(v) == 4 // replicas and len(set(v)) == 1 for v in shares.values())
        rows = sorted(r for v in shares.values() for r in v[0])
        assert rows == list(range(len(sequences))) and all(v[0] for v in shares.values())  # disjoint, all, none idle
