"""LoRA under msrun (docs/lora.md): adapters on the training tp2 policy against one device, and the adapter-only
sync to inference dp2 against a full-weight sync of the merged weights. One msrun job of two ranks (the module
fixture `lora_job`: tests/parallel/workers/lora_ranks.py); the references are the one-device model in the same
process and, for the sync, the merged weights W + s B A computed in numpy and resharded whole."""

import numpy as np
import pytest

from mindgrpo.models.convert import expected_shapes
from mindgrpo.parallel.layout import ParallelLayout
from msrun_util import load_results, run_msrun
from parallel_cases import CFG, UPDATE_KEYS

pytestmark = [pytest.mark.msrun, pytest.mark.slow]
TRAIN = ParallelLayout(dp=1, tp=2)
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
    for m in metrics:  # only the adapters train: their gradients and moments alone
        assert m["trainable/tp"] == sorted(dense) == m["trainable/dense"]
        assert m["optimizer/tp"] == m["optimizer/dense"]
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
