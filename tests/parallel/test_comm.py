"""mindgrpo/parallel/comm.py and friends without processes: layout checks against the world, groups,
data-parallel shares, and the tensor-parallel layers at tp=1 against the one-device model."""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from mindspore import Tensor

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import SequenceLogits, TokenLogProbs
from mindgrpo.parallel import comm as comm_module
from mindgrpo.parallel.comm import Comm, Group, check_layouts, create_groups, layout_groups, layouts_of, single_group
from mindgrpo.parallel.data_parallel import DataParallelGrads, share, share_by_tokens
from mindgrpo.parallel.layout import LayoutError, ParallelLayout
from mindgrpo.parallel.tp_layers import TensorParallelLayers


def config(*overrides):
    return load_config(GRPOConfig, None, list(overrides))


def test_layout_products_must_equal_the_world():
    cfg = config("actor_config.parallel_config.model_parallel=2", "generate_config.parallel_config.data_parallel=2")
    check_layouts(cfg, 2)
    with pytest.raises(LayoutError, match=re.escape("actor_config.parallel_config: data_parallel*model_parallel*"
                                                    "pipeline_stage = 2, but the world size is 4")):
        check_layouts(cfg, 4)
    cfg = config("actor_config.parallel_config.model_parallel=2")
    with pytest.raises(LayoutError, match="generate_config.parallel_config: .* = 1, but the world size is 2"):
        check_layouts(cfg, 2)


def test_reference_layout_is_checked_only_when_the_reference_runs():
    both = ["actor_config.parallel_config.data_parallel=2", "generate_config.parallel_config.data_parallel=2"]
    check_layouts(config(*both), 2)  # beta = 0: no reference model
    assert layouts_of(config(*both))[2] is None
    with pytest.raises(LayoutError, match="ref_config.parallel_config .*beta > 0"):
        check_layouts(config(*both, "rl_config.beta=0.04"), 2)
    check_layouts(config(*both, "rl_config.beta=0.04", "ref_config.parallel_config.model_parallel=2"), 2)
    lora = config(*both, "rl_config.beta=0.04", "actor_config.lora_rank=8")  # the reference is the policy's base
    check_layouts(lora, 2)
    assert layouts_of(lora)[2] is None


def test_pipeline_stages_train_but_do_not_generate():
    train, infer, _ = layouts_of(config("actor_config.parallel_config.pipeline_stage=2",
                                        "generate_config.parallel_config.data_parallel=2"))
    assert train == ParallelLayout(1, 1, 2) and infer == ParallelLayout(2, 1, 1)
    with pytest.raises(LayoutError, match="generate_config.parallel_config.pipeline_stage = 2: generation runs "
                                          "without pipeline stages"):
        layouts_of(config("generate_config.parallel_config.pipeline_stage=2"))


def test_groups_seen_from_a_rank():
    comm = Comm(rank=5, world=8, device="CPU", train=ParallelLayout(2, 4), infer=ParallelLayout(4, 2))
    assert comm.group([5]) == Group((5,), 5, None)
    with pytest.raises(ValueError, match="rank 5 is not in group"):
        comm.group([0, 1])
    with pytest.raises(RuntimeError, match="was not created"):
        comm.train_tp  # noqa: B018 - groups exist only after init_comm
    assert Group((4, 5, 6, 7), 5, "g").index == 1 and single_group().size == 1


def test_a_layouts_groups_are_its_pieces_replicas_and_chains():
    """dp 2, tp 2, pp 2 over ranks 0..7 (rank = stage * 4 + replica * 2 + piece), written out by hand."""
    pieces = {(0, 1), (2, 3), (4, 5), (6, 7)}
    replicas = {(0, 2), (1, 3), (4, 6), (5, 7)}
    chains = {(0, 4), (1, 5), (2, 6), (3, 7)}  # two stages: each chain is also its one hand-off
    layout = ParallelLayout(dp=2, tp=2, pp=2)
    assert layout_groups(layout) == pieces | replicas | chains
    assert layout_groups(layout, kinds=("tp",)) == pieces
    # three stages: the chain and its two hand-offs; one piece and one replica: groups of one rank
    assert layout_groups(ParallelLayout(dp=1, tp=1, pp=3)) == {(0,), (1,), (2,), (0, 1, 2), (0, 1), (1, 2)}
    # a separate placement's rollout replicas of 2 pieces after 3 training ranks
    assert layout_groups(ParallelLayout(dp=2, tp=2), first=3, kinds=("tp",)) == {(3, 4), (5, 6)}
    with pytest.raises(ValueError, match="unknown group kind 'ep'"):
        layout_groups(layout, kinds=("tp", "ep"))


def test_groups_are_created_by_their_members_in_one_order(monkeypatch):
    import mindspore.communication

    calls = []
    monkeypatch.setattr(mindspore.communication, "create_group", lambda name, ranks: calls.append((name, ranks)))
    monkeypatch.setattr(comm_module, "_CREATED", {(1, 2): "g1_2"})
    groups = [(1, 3), [0, 1], (1,), (0, 1, 2, 3), (2, 3), (1, 2), (0, 1)]
    create_groups(1, groups, world=4)  # not its own (2, 3), not one rank, not the world, not (1, 2) again
    assert calls == [("g0_1", [0, 1]), ("g1_3", [1, 3])]
    assert comm_module._CREATED == {(1, 2): "g1_2", (0, 1): "g0_1", (1, 3): "g1_3"}
    calls.clear()
    monkeypatch.setattr(comm_module, "_CREATED", {})  # rank 3's process, the groups given in another order
    create_groups(3, reversed(groups), world=4)
    assert calls == [("g1_3", [1, 3]), ("g2_3", [2, 3])]


def test_data_parallel_shares_are_contiguous_and_cover_everything():
    assert [share(8, 2, i).tolist() for i in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [len(share(7, 3, i)) for i in range(3)] == [3, 2, 2]
    assert np.concatenate([share(10, 4, i) for i in range(4)]).tolist() == list(range(10))


def test_data_parallel_maxima_over_replicas():
    """Each of three replicas puts its values in its own row; the group's sum holds them all."""
    values = {0: np.array([5.0, 1.0]), 1: np.array([3.0, 7.0]), 2: np.array([0.5, 2.0])}

    class ThreeReplicas:  # host_sum as the group would sum it: this replica's table + the others' rows
        def __init__(self, index):
            self.index = index

        def host_sum(self, table, group):
            others = np.zeros_like(table)
            for i, v in values.items():
                if i != self.index:
                    others[i] = v
            return table + others

    for index in range(3):
        dp = DataParallelGrads(ThreeReplicas(index), Group((0, 1, 2), index, "dp"))
        np.testing.assert_array_equal(dp.max(values[index]), [5.0, 7.0])


def test_data_parallel_shares_by_tokens_balance_tokens_not_rows():
    # longest first to the lightest share: 90 -> 0; 40 -> 1; 30 -> 1 (70); 20 -> 1 (90); 10 -> 0 (100); 5 -> 1
    tokens = np.array([10, 90, 20, 5, 40, 30])
    assert [share_by_tokens(tokens, 2, i).tolist() for i in range(2)] == [[0, 1], [2, 3, 4, 5]]
    rng = np.random.default_rng(0)
    for parts in (2, 3, 4):
        tokens = (rng.pareto(1.2, 64) * 50 + 10).astype(int)  # long-tailed, as R1 responses
        shares = [share_by_tokens(tokens, parts, i) for i in range(parts)]
        assert sorted(np.concatenate(shares).tolist()) == list(range(64))
        loads = [int(tokens[s].sum()) for s in shares]
        assert max(loads) - min(loads) <= tokens.max()
        contiguous = [int(tokens[share(64, parts, i)].sum()) for i in range(parts)]
        assert max(loads) - min(loads) <= max(contiguous) - min(contiguous)


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
@pytest.mark.parametrize("tied", [True, False])
def test_tensor_parallel_layers_at_tp1_are_the_one_device_model(tied):
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied)
    dense = Qwen2ForCausalLM(cfg, seed=3)
    tp1 = Qwen2ForCausalLM(cfg, seed=3, layers=TensorParallelLayers(single_group()))
    assert {n: p.shape for n, p in dense.parameters_and_names()} == {n: p.shape for n, p in tp1.parameters_and_names()}
    rng = np.random.default_rng(0)
    ids = Tensor(rng.integers(0, 64, (2, 6)).astype(np.int32))
    mask = Tensor(np.ones((2, 6), np.int32))
    np.testing.assert_allclose(SequenceLogits(tp1)(ids, mask).asnumpy(), SequenceLogits(dense)(ids, mask).asnumpy(),
                               rtol=0, atol=1e-6)
    pos = Tensor(np.tile(np.arange(5, dtype=np.int32), (2, 1)))
    labels = Tensor(rng.integers(0, 64, (2, 5)).astype(np.int32))
    (lp1, e1), (lp, e) = TokenLogProbs(tp1)(ids, pos, labels), TokenLogProbs(dense)(ids, pos, labels)
    np.testing.assert_allclose(lp1.asnumpy(), lp.asnumpy(), rtol=0, atol=1e-5)  # the vocabulary-parallel formula
    np.testing.assert_allclose(e1.asnumpy(), e.asnumpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("role,armed", [("MS_SCHED", True), ("MS_WORKER", True), (None, False)])
def test_a_process_msrun_started_dies_with_msrun(role, armed):
    """tie_to_msrun arms SIGTERM on the parent's death (read back with prctl(PR_GET_PDEATHSIG)) in msrun's
    scheduler and workers, before init(); in a process msrun did not start it arms nothing."""
    probe = ("import ctypes, signal\n"
             "from mindgrpo.parallel.comm import tie_to_msrun\n"
             "tie_to_msrun()\n"
             "sig = ctypes.c_int(-1)\n"
             "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
             "print(sig.value)\n")
    env = {k: v for k, v in os.environ.items() if k != "MS_ROLE"}
    if role:
        env["MS_ROLE"] = role
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) == (int(signal.SIGTERM) if armed else 0)


def test_cpu_collectives_wait_past_the_watchdogs_bounds(caplog):
    from mindgrpo.parallel.comm import collective_wait_s

    assert collective_wait_s(None, 5, 20) == 80 and collective_wait_s(None, 1800, 3600) == 3660
    assert collective_wait_s("7200", 1800, 3600) == 7200  # a longer wait of the user's stays
    assert not caplog.records
    for given in ("300", "soon"):  # shorter, or not a number: raised, saying so
        caplog.clear()
        assert collective_wait_s(given, 1800, 3600) == 3660
        assert [r.levelname for r in caplog.records] == ["WARNING"]
        assert f"MS_CPU_COMM_OP_TIMEOUT={given} raised to 3660" in caplog.records[0].getMessage()
