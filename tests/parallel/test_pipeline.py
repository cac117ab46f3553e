"""Pipeline stages under msrun: log-probs and one GRPO update equal to one device, and resharding out of the
stages bit-identical to MindSpore's transform_checkpoints (merge by our pipeline strategy file, slice by the
inference one), on 4 CPU workers (tests/parallel/workers/pipeline_ranks.py); and scripts/grpo_one_stage.py
training in two stages (2 workers) against the single-process run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor
from mindspore.parallel import transform_checkpoints

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.memory.plan import plan
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.strategy import write_strategy_file
from msrun_util import REPO, run_msrun
from parallel_cases import CFG_PP, SEED

pytestmark = pytest.mark.msrun

TP_PP, DP_PP, PP4 = ParallelLayout(dp=1, tp=2, pp=2), ParallelLayout(dp=2, tp=1, pp=2), ParallelLayout(pp=4)
DP4 = ParallelLayout(dp=4, tp=1)
LAYOUTS = {"tp_pp": TP_PP, "dp_pp": DP_PP, "pp4": PP4}
RESHARDS = [("tp_pp_to_dp4", TP_PP, DP4), ("dp_pp_to_dp4", DP_PP, DP4), ("pp4_to_dp4", PP4, DP4)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    work = tmp_path_factory.mktemp("pipeline")
    (work / "out").mkdir()
    run_msrun("pipeline_ranks.py", 4, str(work / "log"), [work / "out"], timeout=480)
    arrays = [dict(np.load(os.path.join(work, "out", f"rank_{r}.npz"))) for r in range(4)]
    metrics = [json.load(open(os.path.join(work, "out", f"rank_{r}.json"))) for r in range(4)]
    return arrays, metrics


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


@pytest.mark.parametrize("key", LAYOUTS)
def test_pipeline_logprobs_match_one_device_on_every_stage(ranks, key):
    arrays, _ = ranks
    for a in arrays:
        assert np.abs(a["a/logp_dense"]).max() > 1.0
        np.testing.assert_allclose(a[f"a/logp_{key}"], a["a/logp_dense"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("key", LAYOUTS)
def test_pipeline_grpo_update_matches_one_device(ranks, key):
    """Four micro-batches through two stages, three through four (1F1B, the stages before the last recomputing
    their forward), the clip active (it needs the norm summed over the stages and tensor-parallel pieces)."""
    arrays, metrics = ranks
    layout = LAYOUTS[key]
    one = metrics[0]["update/dense"]
    assert one["grad_norm"] > 0.05
    for rank, (a, m) in enumerate(zip(arrays, metrics)):
        got = m[f"update/{key}"]
        for k in ("loss", "pg_loss", "grad_norm", "entropy"):
            assert got[k] == pytest.approx(one[k], rel=1e-5, abs=1e-6), (rank, k)
        dense, mine = prefixed(a, "b/dense"), prefixed(a, f"b/{key}")
        initial = prefixed(a, f"a/initial_{key}")
        assert max(np.abs(mine[n] - initial[n]).max() for n in mine) > 1e-4  # the update moved this stage
        for name, piece in mine.items():
            np.testing.assert_allclose(piece, layout.shard(name, dense[name], layout.coords(rank)[1]), rtol=0,
                                       atol=1e-5, err_msg=name)


def save_pieces(pieces, folder):
    for rank, state in enumerate(pieces):
        os.makedirs(os.path.join(folder, f"rank_{rank}"))
        ms.save_checkpoint([{"name": k, "data": Tensor(v)} for k, v in state.items()],
                           os.path.join(folder, f"rank_{rank}", f"ck_{rank}.ckpt"))
    return folder


@pytest.mark.parametrize("key, src, dst", RESHARDS)
def test_reshard_out_of_stages_is_bit_identical_to_transform_checkpoints(ranks, tmp_path, key, src, dst):
    arrays, metrics = ranks
    shapes = expected_shapes(CFG_PP)
    src_key = key.split("_to_")[0]
    src_strategy = write_strategy_file(str(tmp_path / "src.ckpt"), src, shapes)
    dst_strategy = write_strategy_file(str(tmp_path / "dst.ckpt"), dst, shapes)
    transform_checkpoints(save_pieces([prefixed(a, f"b/{src_key}") for a in arrays], str(tmp_path / "pieces")),
                          str(tmp_path / "out"), "ck_", src_strategy, dst_strategy)
    for rank, a in enumerate(arrays):
        expected = ms.load_checkpoint(str(tmp_path / "out" / f"rank_{rank}" / f"ck_{rank}.ckpt"))
        got = prefixed(a, f"c/{key}")
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            assert got[name].tobytes() == value.asnumpy().tobytes(), (rank, name)
        m = metrics[rank][f"reshard/{key}"]
        assert m["sync/bytes_received"] >= m["sync/bytes_min"] > 0  # every rank lacks the other stage


def test_rollouts_after_resharding_out_of_stages_match_one_device(ranks):
    _, metrics = ranks
    for m in metrics:
        dense = m["rollout/greedy/dense"]
        assert len(dense) == 6 and all(len(t) == 8 for t in dense)
        assert m["rollout/greedy/tp_pp_to_dp4"] == dense


# ------------------------------------------------------------------------------ the one-stage run

MICRO = os.path.join(REPO, "tests", "parallel", "workers", "micro_untied.yaml")
RUN = ["rl_config.max_steps=1", "rl_config.val_interval=0", "rl_config.batch_size=2", "rl_config.num_generations=4",
       "generate_config.max_tokens=16", "actor_config.micro_batch_size=2", "rl_config.completions_interval=0",
       "sft_config.steps=2", "sft_config.batch_size=4", f"actor_config.model={MICRO}",
       "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]",
       "reward_config.reward_plugin=" + os.path.join(REPO, "tests", "parallel", "workers", "text_length_reward.py")]
PP2 = ["actor_config.parallel_config.pipeline_stage=2", "generate_config.parallel_config.data_parallel=2"]


@pytest.fixture(scope="module")
def one_stage(tmp_path_factory):
    work = tmp_path_factory.mktemp("one_stage_pp")
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "grpo_one_stage.py"), "--output_dir",
                    str(work / "single"), *RUN], check=True, capture_output=True, timeout=300)
    run_msrun(os.path.join(REPO, "scripts", "grpo_one_stage.py"), 2, str(work / "log"),
              ["--use_parallel", "True", "--output_dir", str(work / "pp2"), *RUN, *PP2], timeout=420)
    return work


def step1(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return json.loads(f.readline())


def test_one_stage_with_pipeline_stages_writes_the_single_process_step1_metrics(one_stage, tmp_path):
    """Warm start (2 SFT steps) and one GRPO step, the policy trained in two stages, generating in dp2."""
    single, pp = step1(one_stage / "single"), step1(one_stage / "pp2")
    assert single["reward_std"] > 0 and single["grad_norm"] > 0.01
    for key in ("reward_mean", "reward_std", "response_length/mean", "rollout/new_tokens"):
        assert pp[key] == single[key], key
    for key in ("grad_norm", "entropy"):
        assert pp[key] == pytest.approx(single[key], rel=1e-5), key
    for key in ("loss", "pg_loss"):
        assert pp[key] == pytest.approx(single[key], abs=1e-6), key
    # the stages' checkpoint pieces, merged by MindSpore with the run's (pipeline) strategy file
    step = one_stage / "pp2" / "checkpoints" / "step_00000001"
    transform_checkpoints(str(step / "policy"), str(tmp_path / "merged"), "full_", str(step / "train_strategy.ckpt"),
                          None)
    merged = ms.load_checkpoint(str(tmp_path / "merged" / "rank_0" / "full_0.ckpt"))
    expected = ms.load_checkpoint(str(one_stage / "single" / "checkpoints" / "step_00000001" / "policy.ckpt"))
    assert sorted(merged) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(merged[name].asnumpy(), value.asnumpy(), rtol=0, atol=1e-5, err_msg=name)


def test_pipeline_ledger_matches_the_memory_plan_of_its_stage(one_stage):
    """Rank 0 (stage 0: embedding, layers 0-1) writes the metrics: its update phase holds its stage's policy,
    gradients and moments, as scripts/plan_memory.py predicts for rank 0."""
    pp = step1(one_stage / "pp2")
    cfg = Qwen2Config.load(MICRO)
    gcfg = load_config(GRPOConfig, os.path.join(REPO, "model_configs", "qwen_grpo", "tiny", "grpo_config.yaml"),
                       RUN + PP2)
    layout = ParallelLayout(pp=2)
    stage0 = sum(4 * int(np.prod(s)) for n, s in expected_shapes(cfg).items() if layout.param_stage(n, 3) == 0)
    assert pp["memory/peak_bytes/update"] == 4 * stage0
    predicted = plan(gcfg, cfg, rank=0)
    for phase in ("update", "sync"):
        assert pp[f"memory/peak_bytes/{phase}"] == pytest.approx(predicted.phase_bytes(phase, True), rel=0.05)
    assert plan(gcfg, cfg).rank in (0, 1)  # the default plans the stage with the largest peak
