"""The msrun tier: tensor and data parallelism, resharding and the distributed one-stage run on CPU.

One msrun job of two ranks (the module fixture `two_rank_job`, tests/parallel/workers/several.py) runs
each check of this file on a tiny model, each against an independent reference (the one-device model
or run, and MindSpore's own `transform_checkpoints`):
    two_ranks    tp=2 logits / log-probs / entropy, shards from scripts/transform_checkpoint.py,
                 one GRPO update with tp=2 and with dp=2 (also packed rows under tp=2,
                 token budgets under dp=2), rollouts, tp2 -> (dp2, tp1) resharding (a bucket per layer,
                 and in one bucket); the update and the resharding again on a Qwen3 (QK-norm, no q/k/v
                 bias, head_dim != H / nh)
    one_stage    scripts/grpo_one_stage.py under msrun (tp2 swap on, then off; two pipeline stages) vs one process;
                 one process on packed rows vs one process
    zero1        scripts/grpo_one_stage.py under msrun with dp=2, AdamW moments whole and split (ZeRO-1),
                 the split run stopped after one step and resumed from its sharded checkpoint; inference
                 also dp=2, so both generate with the policy itself (one copy of the weights)
The four-rank job (resharding from (dp2, tp2), tp=4, pipeline stages) is in test_pipeline.py.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import mindspore as ms
from mindspore.parallel import transform_checkpoints

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.memory.plan import plan
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.strategy import write_strategy_file
from grpo.fakes import save_judge  # tests/ is on the path (pyproject.toml)
from msrun_util import REPO, load_results, mindspore_slices, run_msrun, save_sharded
from parallel_cases import CFG, CFG_QWEN3, SEED, SHARD_SEED, UPDATE_KEYS, full_logits

pytestmark = [pytest.mark.msrun, pytest.mark.slow]


def mindspore_merge(pieces, layout, cfg, work):
    """MindSpore's transform_checkpoints of per-rank pieces back into the full weights."""
    strategy = write_strategy_file(os.path.join(work, "src_strategy.ckpt"), layout, expected_shapes(cfg))
    transform_checkpoints(save_sharded(pieces, os.path.join(work, "pieces")), os.path.join(work, "merged"), "ck_",
                          strategy, None)
    merged = ms.load_checkpoint(os.path.join(work, "merged", "rank_0", "ck_0.ckpt"))
    return {k: v.asnumpy() for k, v in merged.items()}


def prefixed(arrays, prefix):
    return {k[len(prefix) + 1:]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def assert_resharded_as_transform_checkpoints(arrays, trained, resharded, cfg, work):
    """Each rank's `resharded` weights (inference dp2) are bit for bit MindSpore's slices of the full
    weights that transform_checkpoints merges from the ranks' `trained` pieces (training tp2)."""
    full = mindspore_merge([prefixed(a, trained) for a in arrays], ParallelLayout(dp=1, tp=2), cfg, work)
    expected = mindspore_slices(full, ParallelLayout(dp=2, tp=1), cfg, work)
    for rank, a in enumerate(arrays):
        got = prefixed(a, resharded)
        assert sorted(got) == sorted(expected[rank])
        for name, value in expected[rank].items():
            assert got[name].dtype == value.dtype and got[name].tobytes() == value.tobytes(), (rank, name)


# ------------------------------------------------------------------------------ two ranks


@pytest.fixture(scope="module")
def two_rank_job(tmp_path_factory):
    """Every two-rank check of this file in one msrun launch: the two_ranks worker on shards that
    scripts/transform_checkpoint.py cut, then the one-stage runs (whose single-process peers, one process on
    padded rows and on packed rows (tests/parallel/workers/one_stage_runs.py), run first)."""
    work = tmp_path_factory.mktemp("two_rank_job")
    full = Qwen2ForCausalLM(CFG, seed=SHARD_SEED)
    ms.save_checkpoint([{"name": n, "data": p} for n, p in full.parameters_and_names()], str(work / "full.ckpt"))
    strategy = write_strategy_file(str(work / "tp2.ckpt"), ParallelLayout(dp=1, tp=2), expected_shapes(CFG))
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "transform_checkpoint.py"),
                    f"--src_checkpoint={work / 'full.ckpt'}", f"--dst_checkpoint={work / 'shards'}",
                    f"--dst_strategy={strategy}"], check=True, capture_output=True, timeout=600)
    save_judge(str(work / "runs" / "judge"), MICRO)  # the generative judge of the one-stage runs but opt_*
    # both single-process peers in one process (one start-up); tests/parallel on the path: worker_clock
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests", "parallel"),
                                                       os.environ.get("PYTHONPATH", "")]))
    single = subprocess.run([sys.executable, os.path.join(REPO, "tests", "parallel", "workers", "one_stage_runs.py"),
                             str(work / "runs"), "single,single_packed", *ONE_STAGE], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=1200)  # a guard against a hang: 20 to 60 s a run alone
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    print(single.stdout, end="")  # its [clock ...] lines, shown with -s or on a failure
    (work / "out").mkdir()
    run_msrun("several.py", 2, str(work / "log"),
              ["two_ranks.py", work / "out", work / "shards",
               "::", "one_stage_runs.py", work / "runs", "swap_on,swap_off,pp2,opt_whole,opt_shard", *ONE_STAGE],
              timeout=2400)  # a guard against a hang: the job takes a few minutes alone, far more on a busy machine
    return work


@pytest.fixture(scope="module")
def two_ranks(two_rank_job):
    arrays, metrics = load_results(str(two_rank_job / "out"), 2)
    return arrays, metrics, two_rank_job


def test_tp2_logits_logprobs_entropy_match_one_device(two_ranks):
    arrays, _, _ = two_ranks
    one = arrays[0]  # the one-device references: rank 0 computes them (workers/two_ranks.py)
    assert np.abs(one["a/logits_dense"]).max() > 0.1  # not a degenerate comparison
    for a in arrays:
        np.testing.assert_allclose(a["a/logits_tp"], one["a/logits_dense"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(a["a/logp_tp"], one["a/logp_dense"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(a["a/ent_tp"], one["a/ent_dense"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(a["a/logp_tp_chunked"], one["a/logp_dense"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(a["a/ent_tp_chunked"], one["a/ent_dense"], rtol=0, atol=1e-5)


def test_tp2_shards_from_transform_checkpoint_give_the_full_model_logits(two_ranks):
    arrays, _, _ = two_ranks
    expected = full_logits(CFG, SHARD_SEED)
    assert not np.allclose(expected, arrays[0]["a/logits_dense"])  # the shards really replaced the weights
    for a in arrays:
        np.testing.assert_allclose(a["a/shard_logits"], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["tp", "dp", "tp_chunked", "tp_packed", "dp_budget"])
def test_grpo_update_matches_one_device(two_ranks, layout):
    """tp_packed: packed rows under tp=2; dp_budget: token-budget micro-batches, replicas split by tokens."""
    arrays, metrics, _ = two_ranks
    one = metrics[0]["update/dense"]
    assert one["grad_norm"] > 0.05  # the clip (0.05) is active: it needs the whole gradient's norm
    assert 0 < one["rollout_correction/clipfrac"] < 1  # the rollout correction truncates some weights
    lay = ParallelLayout(dp=2, tp=1) if layout.startswith("dp") else ParallelLayout(dp=1, tp=2)
    dense = prefixed(arrays[0], "b/dense")  # rank 0's one-device update
    for rank, (a, m) in enumerate(zip(arrays, metrics)):
        got = m[f"update/{layout}"]
        # with dp, each replica's rows hold a different largest mismatch: the maxima are over replicas
        for key in UPDATE_KEYS:
            assert got[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (rank, key)
        mine = prefixed(a, f"b/{layout}")
        initial = Qwen2ForCausalLM(CFG, seed=SEED)
        moved = max(np.abs(p.asnumpy() - dense[n]).max() for n, p in initial.parameters_and_names())
        assert moved > 1e-4  # the update changed the weights
        for name, full in dense.items():
            np.testing.assert_allclose(mine[name], lay.shard(name, full, lay.coords(rank)[1]), rtol=0, atol=1e-5,
                                       err_msg=name)


def test_rollouts_tp2_sampled_and_greedy_after_resharding_match_one_device(two_ranks):
    arrays, metrics, _ = two_ranks
    one, one_logp = metrics[0], arrays[0]["c/sampled_logp_dp1"]  # the one-device rollouts: rank 0's
    assert len(one["rollout/greedy/dense"]) == 6 and all(len(t) == 8 for t in one["rollout/greedy/dense"])
    assert len({tuple(t) for t in one["rollout/sampled_resharded/dp1"]}) == 6
    for a, m in zip(arrays, metrics):
        assert m["rollout/sampled/tp"] == one["rollout/sampled/dense"]
        assert m["rollout/greedy/resharded"] == one["rollout/greedy/dense"]
        # inference dp2 (two prompts on rank 0, one on rank 1) samples what one process samples
        assert m["rollout/sampled_resharded/dp2"] == one["rollout/sampled_resharded/dp1"]
        np.testing.assert_allclose(a["c/sampled_logp_dp2"], one_logp, rtol=0, atol=1e-5)


def test_reshard_tp2_to_dp2_is_bit_identical_to_transform_checkpoints(two_ranks, tmp_path):
    arrays, metrics, _ = two_ranks
    assert_resharded_as_transform_checkpoints(arrays, "b/tp", "c/infer", CFG, str(tmp_path))
    for rank in range(len(arrays)):
        m = metrics[rank]["reshard"]
        # tp2 -> tp1: a rank receives the other half of every split weight, the minimum
        assert m["sync/bytes_received"] == m["sync/bytes_min"] > 0.4 * m["sync/bytes"]
        first, again = metrics[rank]["reshard_compiled"]  # graphs the process compiled in the first, second sync
        assert first > 0 and again == 0  # the second sync compiles nothing


def test_reshard_in_one_bucket_gives_the_per_layer_buckets_bits_and_bytes(two_ranks):
    """rl_config.weight_sync_bucket_mb: the embedding, the layer, the norm and the head in one bucket (one
    AllGather, one assembly) give each rank the bits of one bucket per layer, receiving the same bytes."""
    arrays, metrics, _ = two_ranks
    for a, m in zip(arrays, metrics):
        assert m["reshard_buckets"] == [CFG.num_hidden_layers + 3, 1]
        per_layer, one = prefixed(a, "c/infer"), prefixed(a, "c/infer_one_bucket")
        assert sorted(one) == sorted(per_layer)
        for name, value in per_layer.items():
            assert one[name].dtype == value.dtype and one[name].tobytes() == value.tobytes(), name
        for key in ("sync/bytes", "sync/bytes_received", "sync/bytes_min"):
            assert m["reshard_one_bucket"][key] == m["reshard"][key], key
        assert m["reshard_one_bucket"]["sync/max_bucket_bytes"] > m["reshard"]["sync/max_bucket_bytes"]


def test_a_reward_model_split_like_training_tp2_gives_the_one_device_scores(two_ranks):
    all_arrays, all_metrics, _ = two_ranks
    whole = all_arrays[0]["e/rm_padded_dense"]  # the whole model's scores: rank 0's
    assert np.ptp(whole) > 1e-3  # the scores tell the sequences apart
    for arrays, metrics in zip(all_arrays, all_metrics):
        assert metrics["e/rm_tp_embedding_rows"] == 48  # half of the vocabulary: the model really is split
        for rows in ("padded", "packed"):
            np.testing.assert_allclose(arrays[f"e/rm_{rows}_tp"], whole, rtol=0, atol=1e-5)


def test_qwen3_tp2_update_matches_one_device_and_reshards_bit_identical_to_transform_checkpoints(two_ranks, tmp_path):
    """Qwen3 under training tp=2: the step's loss, grad norm and metrics and the updated weights (the
    replicated QK-norm weights included: their gradient is summed over the ranks) equal one device's;
    resharding to inference dp2 gives MindSpore's transform_checkpoints bit for bit."""
    arrays, metrics, _ = two_ranks
    one = metrics[0]["update/qwen3_dense"]
    assert one["grad_norm"] > 0.05
    train = ParallelLayout(dp=1, tp=2)
    initial = Qwen2ForCausalLM(CFG_QWEN3, seed=SEED)
    assert "model.layers.0.attention.q_norm.weight" in dict(initial.parameters_and_names())
    dense = prefixed(arrays[0], "d/dense")  # rank 0's one-device update
    assert np.abs(dense["model.layers.0.attention.k_norm.weight"] - 1).max() > 1e-4  # the update moved it
    for rank, (a, m) in enumerate(zip(arrays, metrics)):
        for key in UPDATE_KEYS:
            assert m["update/qwen3_tp"][key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (rank, key)
        mine = prefixed(a, "d/tp")
        for name, full in dense.items():  # 3% of the step (lr 1e-3): AdamW's first step is g / |g|, so a
            # gradient near zero turns rounding into up to 1.1e-5 here (an lm_head entry); a QK-norm gradient
            # that missed the other rank's heads moves its weights by ~1e-3
            np.testing.assert_allclose(mine[name], train.shard(name, full, rank), rtol=0, atol=3e-5, err_msg=name)
    assert_resharded_as_transform_checkpoints(arrays, "d/tp", "d/infer", CFG_QWEN3, str(tmp_path))


# ------------------------------------------------------------------------------ the one-stage run

MICRO = os.path.join(REPO, "tests", "parallel", "workers", "micro_untied.yaml")  # untied: pipeline stages
ONE_STAGE = ["rl_config.max_steps=1", "sft_config={steps: 0}", "rl_config.val_interval=0",
             "rl_config.batch_size=2", "rl_config.num_generations=4", "generate_config.max_tokens=16",
             "actor_config.micro_batch_size=2", "rl_config.completions_interval=0", f"actor_config.model={MICRO}",
             "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]",
             "reward_config.reward_plugin=" + os.path.join(REPO, "tests", "parallel", "workers", "text_length_reward.py")]
TP2 = ["actor_config.parallel_config.model_parallel=2", "generate_config.parallel_config.data_parallel=2"]
PP2 = ["actor_config.parallel_config.pipeline_stage=2", "generate_config.parallel_config.data_parallel=2"]


def step1(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return json.loads(f.readline())


@pytest.fixture(scope="module")
def one_stage(two_rank_job):
    """One GRPO step: one process (single); under msrun training tp2 with swap on and off, and training in
    two pipeline stages (both generating in dp2)."""
    return two_rank_job / "runs"


def merged_policy(step, tmp_path):
    """The run's policy pieces merged by MindSpore with the run's strategy file."""
    transform_checkpoints(str(step / "policy"), str(tmp_path / "merged"), "full_", str(step / "train_strategy.ckpt"),
                          None)
    return ms.load_checkpoint(str(tmp_path / "merged" / "rank_0" / "full_0.ckpt"))


@pytest.mark.parametrize("run", ["swap_on", "pp2"])
def test_one_stage_under_msrun_writes_the_single_process_step1_metrics(one_stage, tmp_path, run):
    single, parallel = step1(one_stage / "single"), step1(one_stage / run)
    assert single["reward_std"] > 0 and single["grad_norm"] > 0.01  # the step trained on something
    # the judge's scores too: each rank answered half of its questions (placement.judge_engine), one process all
    for key in ("reward_mean", "reward_std", "response_length/mean", "rollout/new_tokens", "reward/critic/none",
                "reward/critic/too_long"):
        assert parallel[key] == single[key], key
    assert repr(parallel["reward/critic/mean"]) == repr(single["reward/critic/mean"])  # NaN: no answer scored
    for key in ("grad_norm", "entropy"):
        assert parallel[key] == pytest.approx(single[key], rel=1e-5), key
    for key in ("loss", "pg_loss"):  # ~0: the group-normalised advantages sum to zero per group
        assert parallel[key] == pytest.approx(single[key], abs=1e-6), key
    # perf/* per device: the step's tokens (2 prompts x G=4 samples) over the world size
    for metrics, devices in ((single, 1), (parallel, 2)):
        tokens = (metrics["prompt_length/mean"] + metrics["response_length/mean"]) * 8
        assert metrics["perf/e2e_tokens_per_s_per_device"] == pytest.approx(tokens / devices / metrics["time/step"])
        assert metrics["perf/update_tokens_per_s_per_device"] == pytest.approx(tokens / devices / metrics["time/update"])
    # rank 0 alone writes metrics (one line for one step); every rank its log; sharded checkpoints
    assert len(open(one_stage / run / "metrics.jsonl").read().splitlines()) == 1
    assert sorted(os.listdir(one_stage / run / "logs")) == ["rank_0.log", "rank_1.log"]
    step = one_stage / run / "checkpoints" / "step_00000001"
    assert sorted(os.listdir(step / "policy")) == ["rank_0", "rank_1"]
    # the updated policy, merged by MindSpore: with pipeline stages
    # each rank's file holds its stage's parameters only, and the strategy file is MindSpore's pipeline form
    merged = merged_policy(step, tmp_path)
    expected = ms.load_checkpoint(str(one_stage / "single" / "checkpoints" / "step_00000001" / "policy.ckpt"))
    assert sorted(merged) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(merged[name].asnumpy(), value.asnumpy(), rtol=0, atol=1e-5, err_msg=name)


def test_the_trainer_on_packed_rows_writes_the_padded_step1_metrics_and_weights(one_stage):
    single, packed = step1(one_stage / "single"), step1(one_stage / "single_packed")
    assert single["grad_norm"] > 0.01
    for key in ("reward_mean", "reward_std", "response_length/mean"):
        assert packed[key] == single[key], key
    for key in ("grad_norm", "entropy"):
        assert packed[key] == pytest.approx(single[key], rel=1e-5), key
    assert packed["loss"] == pytest.approx(single["loss"], abs=1e-6)
    step = os.path.join("checkpoints", "step_00000001", "policy.ckpt")
    expected = ms.load_checkpoint(str(one_stage / "single" / step))
    got = ms.load_checkpoint(str(one_stage / "single_packed" / step))
    for name, value in expected.items():
        np.testing.assert_allclose(got[name].asnumpy(), value.asnumpy(), rtol=0, atol=1e-5, err_msg=name)


def test_swap_on_and_off_are_bit_identical_and_the_ledger_peak_is_one_phase(one_stage):
    on, off = step1(one_stage / "swap_on"), step1(one_stage / "swap_off")
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "reward_mean", "response_length/mean"):
        assert on[key] == off[key], key
    phases = {k: v for k, v in on.items() if k.startswith("memory/peak_bytes/")}
    assert {"memory/peak_bytes/rollout", "memory/peak_bytes/update", "memory/peak_bytes/sync"} <= set(phases)
    assert on["memory/peak_bytes"] == max(phases.values())
    # the policy's piece (tp=2) + its gradients + two AdamW moments, all fp32: the update phase
    train = ParallelLayout(dp=1, tp=2)
    cfg = Qwen2Config.load(MICRO)
    policy = sum(4 * int(np.prod(train.shard_shape(n, s))) for n, s in expected_shapes(cfg).items())
    assert on["memory/peak_bytes/update"] == 4 * policy
    # swap off: every model stays, the peak is the sum (policy, grads, optimizer, inference, cache)
    assert off["memory/peak_bytes"] > on["memory/peak_bytes"] + 0.9 * policy
    assert on["memory/swap_bytes"] > 0 and off["memory/swap_bytes"] == 0
    # scripts/plan_memory.py's prediction for this config (the KV cache it plans is an upper bound)
    gcfg = load_config(GRPOConfig, os.path.join(REPO, "model_configs", "qwen_grpo", "tiny", "grpo_config.yaml"),
                       ONE_STAGE + TP2)
    predicted = plan(gcfg, cfg)
    for phase in ("update", "sync"):
        assert on[f"memory/peak_bytes/{phase}"] == pytest.approx(predicted.phase_bytes(phase, True), rel=0.05)
    assert on["memory/peak_bytes/rollout"] <= predicted.phase_bytes("rollout", True)
    # the measured peak is the largest phase, and the plan's peak (full KV-cache capacity) bounds it
    assert on["memory/peak_bytes"] <= max(predicted.phase_bytes(p, True) for p in ("rollout", "update", "sync"))


def test_pipeline_ledger_matches_the_memory_plan_of_its_stage(one_stage):
    """Rank 0 (stage 0: the embedding, layers 0-1) writes the metrics: its update phase holds its stage's
    policy, gradients and moments, as scripts/plan_memory.py predicts for rank 0."""
    pp = step1(one_stage / "pp2")
    cfg = Qwen2Config.load(MICRO)
    layout = ParallelLayout(pp=2)
    stage0 = sum(4 * int(np.prod(s)) for n, s in expected_shapes(cfg).items() if layout.param_stage(n, 3) == 0)
    assert pp["memory/peak_bytes/update"] == 4 * stage0
    gcfg = load_config(GRPOConfig, os.path.join(REPO, "model_configs", "qwen_grpo", "tiny", "grpo_config.yaml"),
                       ONE_STAGE + PP2)
    predicted = plan(gcfg, cfg, rank=0)
    for phase in ("update", "sync"):
        assert pp[f"memory/peak_bytes/{phase}"] == pytest.approx(predicted.phase_bytes(phase, True), rel=0.05)


# ------------------------------------------------------------------------------ optimizer sharding (ZeRO-1)

DP2 = ["actor_config.parallel_config.data_parallel=2", "generate_config.parallel_config.data_parallel=2",
       "rl_config.max_steps=2"]  # as one_stage_runs.py runs opt_whole and opt_shard


@pytest.fixture(scope="module")
def zero1(two_rank_job):
    return two_rank_job / "runs"


def metrics(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_optimizer_shard_updates_bit_identically_and_keeps_half_the_moments(zero1, tmp_path):
    # (opt_shard ran one step, then --resume for the second: the resume is exact too)
    whole, shard = metrics(zero1 / "opt_whole"), metrics(zero1 / "opt_shard")
    assert len(whole) == len(shard) == 2 and whole[1]["grad_norm"] > 0
    for a, b in zip(whole, shard):
        for key in ("loss", "pg_loss", "grad_norm", "entropy", "reward_mean", "response_length/mean"):
            assert a[key] == b[key], key
    step = "checkpoints/step_00000002"
    cfg = Qwen2Config.load(MICRO)
    layout, full = ParallelLayout(dp=2, tp=1), expected_shapes(cfg)
    split = [n for n in full if layout.opt_shard_parts(n, full[n]) == 2]
    assert len(split) > len(full) // 2  # most parameters split (a dim 0 of odd size would not)
    moments = {}
    for rank in (0, 1):
        pw = ms.load_checkpoint(str(zero1 / "opt_whole" / step / "policy" / f"rank_{rank}" / "policy.ckpt"))
        ps = ms.load_checkpoint(str(zero1 / "opt_shard" / step / "policy" / f"rank_{rank}" / "policy.ckpt"))
        for name in full:  # the weights after two updates: bit for bit
            np.testing.assert_array_equal(ps[name].asnumpy(), pw[name].asnumpy(), err_msg=name)
        ow = ms.load_checkpoint(str(zero1 / "opt_whole" / step / "optimizer" / f"rank_{rank}" / "optimizer.ckpt"))
        os_ = ms.load_checkpoint(str(zero1 / "opt_shard" / step / "optimizer" / f"rank_{rank}" / "optimizer.ckpt"))
        for name in full:
            for prefix in ("adam_m.", "adam_v."):
                w = ow[prefix + name].asnumpy()
                mine = w[rank * len(w) // 2:(rank + 1) * len(w) // 2] if name in split else w
                np.testing.assert_array_equal(os_[prefix + name].asnumpy(), mine, err_msg=prefix + name)
                moments[prefix + name] = w
    assert max(np.abs(v).max() for k, v in moments.items() if k.startswith("adam_m.")) > 0
    # MindSpore's transform_checkpoints merges the split moments by the run's strategy file
    transform_checkpoints(str(zero1 / "opt_shard" / step / "optimizer"), str(tmp_path / "merged"), "full_",
                          str(zero1 / "opt_shard" / step / "train_strategy.ckpt"), None)
    merged = ms.load_checkpoint(str(tmp_path / "merged" / "rank_0" / "full_0.ckpt"))
    assert sorted(merged) == sorted(moments)
    for name, value in moments.items():
        np.testing.assert_array_equal(merged[name].asnumpy(), value, err_msg=name)
    # the ledger's update phase holds half of the split moments and, for the fused update, a copy of
    # half of those weights (optim.AdamW), as scripts/plan_memory.py predicts
    saved = sum((2 * 4 * int(np.prod(full[n])) - 3 * 4 * int(np.prod(full[n])) // 2) for n in split)
    assert whole[0]["memory/peak_bytes/update"] - shard[0]["memory/peak_bytes/update"] == saved
    gcfg = load_config(GRPOConfig, os.path.join(REPO, "model_configs", "qwen_grpo", "tiny", "grpo_config.yaml"),
                       ONE_STAGE + DP2 + ["actor_config.parallel_config.optimizer_shard=true"])
    assert shard[0]["memory/peak_bytes/update"] == pytest.approx(plan(gcfg, cfg).phase_bytes("update", True),
                                                                 rel=0.05)


def test_equal_layouts_generate_with_the_policy_itself_and_the_sync_moves_nothing(zero1, one_stage):
    """Training dp2 and inference dp2 (opt_whole, opt_shard): each rank generates with its policy replica itself
    (one copy of the weights; mindgrpo/grpo/builder.py): the sync moves nothing and logs Reshard's columns at 0,
    and the ledger's sync phase holds the policy alone, as scripts/plan_memory.py plans. Training tp2 against
    inference dp2 (swap_on) keeps a resharded copy."""
    from mindgrpo.parallel.reshard import Reshard

    columns = Reshard.metric_names()  # the inference sync's columns, as a resharding run logs them
    assert set(columns) <= set(step1(one_stage / "swap_on"))
    for run in ("opt_whole", "opt_shard"):
        for m in metrics(zero1 / run):
            assert {k: m[k] for k in columns} == {k: 0.0 for k in columns}, run
        for rank in (0, 1):
            assert "inference: the policy model itself" in open(zero1 / run / "logs" / f"rank_{rank}.log").read()
    assert step1(one_stage / "swap_on")["sync/bytes"] > 0
    assert "inference: the policy model itself" not in open(one_stage / "swap_on" / "logs" / "rank_0.log").read()
    whole = metrics(zero1 / "opt_whole")[0]
    cfg = Qwen2Config.load(MICRO)
    policy = sum(4 * int(np.prod(s)) for s in expected_shapes(cfg).values())  # dp2: every rank the whole model
    gcfg = load_config(GRPOConfig, os.path.join(REPO, "model_configs", "qwen_grpo", "tiny", "grpo_config.yaml"),
                       ONE_STAGE + DP2 + ["actor_config.parallel_config.optimizer_shard=false"])
    predicted = plan(gcfg, cfg)
    assert predicted.shared and predicted.phase_bytes("sync", True) == policy
    assert whole["memory/peak_bytes/sync"] == policy
    assert whole["memory/peak_bytes/rollout"] <= predicted.phase_bytes("rollout", True)
