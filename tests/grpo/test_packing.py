"""Token-budget micro-batches and packed rows (mindgrpo.grpo.packing), and the Scorer and PolicyUpdater
on them.

The planner's layouts are checked by hand and against the samples themselves (each packed token is the
sample's token, each scored position predicts its label). The graphs are checked against the padded
path, micro_batch_size rows right-padded to the step's length (today's path, itself checked against
TRL and the one-device model elsewhere): on a batch whose response lengths differ by 10x, for every
loss aggregation mode, the log-probs, loss, metrics, gradient norm and updated weights agree within
1e-5 (fp32).
"""

import subprocess
import sys

import numpy as np
import pytest

from mindgrpo.grpo.actor import PolicyUpdater, Scorer
from mindgrpo.grpo.algos import AGG_MODES
from mindgrpo.grpo.experience import Experience, pack
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import AdamWSettings
from mindgrpo.grpo.packing import Batching, bucket_length, bucket_tokens, plan, pow2, shape_bound
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM

# one layer keeps the compiles short (a leak between packed samples changes its attention's output)
CFG = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=128)
RESPONSES = (3, 31, 5, 4, 12, 3, 28, 6)  # 10x apart
PROMPTS = (4, 3, 5, 2, 4, 3, 5, 2)


def experience(responses=RESPONSES, prompts=PROMPTS, seed=0):
    rng = np.random.default_rng(seed)
    return pack([list(rng.integers(2, 64, n)) for n in prompts], [list(rng.integers(2, 64, n)) for n in responses],
                rng.standard_normal(len(responses)).astype(np.float32))


def lengths_of(mb):
    return [int(mb.exp.prompt_lens[i] + mb.exp.response_lens[i]) for i in range(len(mb.samples))]


# ---------------------------------------------------------------------------------------
# the planner (numpy)
# ---------------------------------------------------------------------------------------


def test_rows_layout_is_todays_micro_batches_of_the_padded_arrays():
    exp = experience()
    batches = plan(exp, Batching(micro_batch_size=3))
    assert [mb.samples.tolist() for mb in batches] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    for mb in batches:
        np.testing.assert_array_equal(mb.ids, exp.input_ids[mb.samples])
        np.testing.assert_array_equal(mb.feed[0], exp.score_pos[mb.samples])
        np.testing.assert_array_equal(mb.feed[1], exp.labels[mb.samples])
        assert mb.stage_feed == () and not mb.packed


def test_budget_sorts_by_length_and_pads_each_micro_batch_to_its_own_length():
    # sample tokens: 7, 34, 10, 6, 16, 6, 33, 8; budget 64: the two longest (L 64) one at a time,
    # then the rest (L 32) two at a time, longest first (ties in order)
    batches = plan(experience(), Batching(max_tokens=64))
    assert [mb.samples.tolist() for mb in batches] == [[1], [6], [4, 2], [7, 0], [3, 5]]
    assert [mb.ids.shape for mb in batches] == [(1, 64), (1, 64), (2, 32), (2, 32), (2, 32)]
    for mb in batches:
        assert mb.ids.size <= 64
        assert len(mb.exp) == pow2(len(mb.samples))


def test_budget_splits_the_samples_of_a_row_length_evenly_in_one_shape():
    exp = experience(responses=(20,) * 7, prompts=(4,) * 7)  # 24 tokens each, L 32
    batches = plan(exp, Batching(max_tokens=96))  # 3 rows of 32 fit: 7 = 3 + 3 + 1, each (3, 32)
    assert [len(mb.samples) for mb in batches] == [3, 3, 1]
    assert {mb.ids.shape for mb in batches} == {(3, 32)} and {len(mb.exp) for mb in batches} == {3}
    batches = plan(exp, Batching(max_tokens=160))  # 5 rows fit: two micro-batches of 4 and 3, each (4, 32)
    assert [len(mb.samples) for mb in batches] == [4, 3] and {mb.ids.shape for mb in batches} == {(4, 32)}


def test_row_lengths_take_two_values_per_octave_within_the_budget():
    assert [bucket_length(n, 32, 4096) for n in (1, 32, 33, 64, 65, 96, 97, 128, 129, 192, 193, 300, 385, 600)] == \
        [32, 32, 64, 64, 96, 96, 128, 128, 192, 192, 256, 384, 512, 768]
    assert bucket_length(600, 32, 640) == 640  # capped by the budget, never below the sample
    assert bucket_length(600, 32, 700) == 672


def test_packed_rows_first_fit_longest_first():
    # lengths 34, 33, 16, 10, 8, 7, 6, 6 into rows of 64 (the longest, rounded up): 34+16+10 = 60,
    # 33+8+7+6+6 = 60; budget 128: both rows in one micro-batch
    batches = plan(experience(), Batching(max_tokens=128, packing=True))
    assert len(batches) == 1
    mb = batches[0]
    assert mb.ids.shape == (2, 64) and mb.packed
    assert mb.samples.tolist() == [1, 4, 2, 6, 7, 0, 3, 5]
    positions, segments, tokens, labels, slots = mb.feed
    np.testing.assert_array_equal(positions[0, :60], np.concatenate([np.arange(34), np.arange(16), np.arange(10)]))
    np.testing.assert_array_equal(segments[0], [1] * 34 + [2] * 16 + [3] * 10 + [0] * 4)
    np.testing.assert_array_equal(segments[1], [1] * 33 + [2] * 8 + [3] * 7 + [4] * 6 + [5] * 6 + [0] * 4)
    assert len(tokens) == bucket_tokens(sum(RESPONSES), 32) == 96 and slots.shape == (8, 32)
    # budget 64: one row of 64 per micro-batch
    assert [mb.ids.shape for mb in plan(experience(), Batching(max_tokens=64, packing=True))] == [(1, 64)] * 2


@pytest.mark.parametrize("batching", [Batching(max_tokens=64), Batching(max_tokens=128, packing=True),
                                      Batching(max_tokens=256, packing=True)])
def test_every_sample_is_laid_out_whole_and_each_scored_position_predicts_its_label(batching):
    exp = experience()
    batches = plan(exp, batching)
    assert sorted(s for mb in batches for s in mb.samples) == list(range(len(exp)))
    for mb in batches:
        positions, segments, tokens, labels, slots = mb.feed
        n_tok = len(tokens)
        flat_ids, flat_seg = mb.ids.reshape(-1), segments.reshape(-1)
        for k, s in enumerate(mb.samples):
            r = int(exp.response_lens[s])
            mine = slots[k, :r]
            assert (slots[k, r:] == n_tok).all()
            # the scored positions: inside one segment, at the sample's positions p-1 .. p+r-2
            pos = tokens[mine]
            assert len(set(flat_seg[pos])) == 1 and flat_seg[pos[0]] > 0
            np.testing.assert_array_equal(positions.reshape(-1)[pos], exp.score_pos[s, :r])
            # the next token in the row is the label, which is the sample's response token
            np.testing.assert_array_equal(flat_ids[pos + 1], labels[mine])
            np.testing.assert_array_equal(labels[mine], exp.labels[s, :r])
            # the sample's whole tokens, in one segment
            seg = np.flatnonzero((flat_seg == flat_seg[pos[0]]) & (np.arange(flat_seg.size) // mb.ids.shape[1]
                                                                  == pos[0] // mb.ids.shape[1]))
            np.testing.assert_array_equal(flat_ids[seg], exp.input_ids[s, :exp.prompt_lens[s] + r])
        # every per-sample array: the samples' rows, then zero rows
        np.testing.assert_array_equal(mb.exp.mask[:len(mb.samples)], exp.mask[mb.samples])
        assert not mb.exp.mask[len(mb.samples):].any() and (slots[len(mb.samples):] == n_tok).all()


def test_flash_runs_are_the_cumulative_ends_of_samples_and_padding():
    mb = plan(experience(), Batching(max_tokens=128, packing=True, attention="flash"))[0]
    runs = mb.feed[1]
    np.testing.assert_array_equal(runs, [34, 50, 60, 64, 64 + 33, 64 + 41, 64 + 48, 64 + 54, 64 + 60, 128])
    assert mb.stage_feed[1] is runs


def test_samples_without_a_token_to_train_on_are_left_out():
    exp = experience()
    exp.mask[[1, 5]] = 0.0  # e.g. overlong filtering
    for batching in (Batching(max_tokens=64), Batching(max_tokens=128, packing=True)):
        assert sorted(s for mb in plan(exp, batching) for s in mb.samples) == [0, 2, 3, 4, 6, 7]
    assert plan(exp.select(np.array([1, 5])), Batching(max_tokens=64, packing=True)) == []


def test_a_sample_longer_than_the_budget_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch = 32; raise it to at least 64"):
        plan(experience(), Batching(max_tokens=32))
    with pytest.raises(ValueError, match="packing needs a token budget"):
        Batching(packing=True)


def test_token_buckets_pad_by_at_most_an_eighth_beyond_a_step():
    values = {bucket_tokens(n, 32) for n in range(1, 4097)}
    for n in range(1, 4097):
        b = bucket_tokens(n, 32)
        assert b >= n and b % 32 == 0 and (b - n < 32 or b - n <= n / 8), n
    assert len([v for v in values if 2048 < v <= 4096]) == 8  # eight per octave


def test_a_step_compiles_one_shape_packed_and_one_per_row_length_budgeted():
    rng = np.random.default_rng(3)
    tokens = {bucket_tokens(n, 32) for n in range(1, 257)}
    seen = set()
    for batching in (Batching(max_tokens=256), Batching(max_tokens=256, packing=True)):
        for _ in range(40):
            resp = np.minimum(rng.pareto(1.5, 16) * 10 + 1, 100).astype(int)
            exp = experience(responses=resp, prompts=rng.integers(2, 20, 16), seed=int(rng.integers(1 << 30)))
            batches = plan(exp, batching)
            shapes = {(mb.ids.shape, len(mb.feed[2]), len(mb.exp)) for mb in batches}
            widths = {mb.ids.shape[1] for mb in batches}
            assert len(shapes) == (1 if batching.packing else len(widths))
            for (rows, width), n_tok, n in shapes:
                assert width in {32, 64, 96, 128} and n_tok in tokens
                assert rows * width <= 256
                assert n <= 16 and (n == pow2(n) if batching.packing else n == rows)
            seen |= {(s, batching.packing) for s in shapes}
    assert len(seen) < 60  # of the bound's 640
    for packing in (False, True):  # row lengths 32, 64, 96, 128: floor(256 / L) = 8, 4, 2, 2 rows at most
        assert shape_bound(120, 256, 16, 32, packing) == (8 + 4 + 2 + 2) * 5 * len(tokens) == 640
    assert shape_bound(160, 256, 16, 32, True) == (8 + 4 + 2 + 2 + 1) * 5 * 8  # 160: packed rows of 160
    assert shape_bound(160, 256, 16, 32, False) == (8 + 4 + 2 + 2 + 1) * 5 * 8  # 192 (two per octave)


def test_experience_select_and_padded_carry_every_per_sample_array():
    exp = experience()
    exp.old_logp = np.ones(exp.labels.shape, np.float32)
    exp.extras["rollout_logp"] = np.full(exp.labels.shape, 2.0, np.float32)
    part = exp.select(np.array([6, 1])).padded(4)
    assert len(part) == 4 and part.old_logp.shape == (4, exp.labels.shape[1])
    np.testing.assert_array_equal(part.response_lens, [28, 31, 0, 0])
    np.testing.assert_array_equal(part.extras["rollout_logp"][:2], 2.0)
    assert not part.extras["rollout_logp"][2:].any() and not part.mask[2:].any() and part.ref_logp is None


# ---------------------------------------------------------------------------------------
# the graphs: the same numbers as the padded path
# ---------------------------------------------------------------------------------------
# Lengths 10x apart, chosen so that each layout compiles few shapes (a compile takes seconds):
# padded, micro-batches of 2: (2, 64) x 3; budget 64: (1, 64) x 2 one sample each, (2, 32) x 2;
# packed 64: two rows of 64 holding three samples each (n = 4: a zero sample row in each)
GRAPH_RESPONSES, GRAPH_PROMPTS = (30, 3, 12, 28, 5, 6), (3, 4, 4, 5, 5, 2)
LAYOUTS = {"budget": dict(max_tokens=64), "packed": dict(max_tokens=64, packing=True)}


def graph_experience():
    return experience(GRAPH_RESPONSES, GRAPH_PROMPTS)


def test_the_graph_batch_takes_the_shapes_the_comment_says():
    exp = graph_experience()
    shapes = {name: [(mb.ids.shape, len(mb.exp), len(mb.samples)) for mb in plan(exp, Batching(**kw))]
              for name, kw in LAYOUTS.items()}
    assert shapes["budget"] == [((1, 64), 1, 1)] * 2 + [((2, 32), 2, 2)] * 2
    assert shapes["packed"] == [((1, 64), 4, 3)] * 2


@pytest.fixture(scope="module")
def padded_logp():
    """The padded path's log-probs of graph_experience (micro-batches of 2 rows)."""
    return Scorer(Qwen2ForCausalLM(CFG, seed=1), 2)(graph_experience())


def test_scorer_log_probs_match_the_padded_path(padded_logp):
    exp = graph_experience()
    lm = Qwen2ForCausalLM(CFG, seed=1)
    assert np.abs(padded_logp).max() > 1.0
    for name, kw in LAYOUTS.items():
        np.testing.assert_allclose(Scorer(lm, 2, **kw)(exp), padded_logp, rtol=0, atol=1e-5, err_msg=name)


def updated(exp, mode, **kw):
    lm = Qwen2ForCausalLM(CFG, seed=1)
    up = PolicyUpdater(lm, GRPOLoss(beta=0.1, kl_kind="k3", agg_mode=mode), Batching(2, **kw), detach_old=False,
                       use_ref=True, optimizer=AdamWSettings(beta2=0.99, weight_decay=0.01))
    metrics = up.update(exp, lr=1e-2)
    return metrics, {n: p.asnumpy() for n, p in lm.parameters_and_names()}


@pytest.fixture(scope="module")
def scored(padded_logp):
    """graph_experience with old and reference log-probs away from the policy's: ratios clip, the KL is > 0."""
    exp = graph_experience()
    rng = np.random.default_rng(5)
    exp.old_logp = (padded_logp + rng.normal(0, 0.3, padded_logp.shape).astype(np.float32)) * exp.mask
    exp.ref_logp = (padded_logp + rng.normal(0, 0.3, padded_logp.shape).astype(np.float32)) * exp.mask
    return exp


@pytest.mark.slow  # three update graphs compile per mode: 30 s of CPU each, 90 s wall at load 5
@pytest.mark.parametrize("mode", AGG_MODES.names())
def test_update_matches_the_padded_path_for_every_aggregation_mode(scored, mode):
    expected, weights = updated(scored, mode)
    assert expected["clipfrac"] > 0.05 and expected["kl"] > 0.01 and expected["grad_norm"] > 0.05
    initial = {n: p.asnumpy() for n, p in Qwen2ForCausalLM(CFG, seed=1).parameters_and_names()}
    assert max(np.abs(weights[n] - initial[n]).max() for n in weights) > 1e-3  # the update moved the weights
    for name, kw in LAYOUTS.items():
        got, mine = updated(scored, mode, **kw)
        for key in ("loss", "pg_loss", "grad_norm", "kl", "entropy", "clipfrac", "clipfrac_low", "clipfrac_high",
                    "nll"):
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), (name, key)
        for n, value in weights.items():
            np.testing.assert_allclose(mine[n], value, rtol=0, atol=1e-5, err_msg=f"{name} {n}")


def test_the_block_diagonal_bias_is_causal_within_each_sample():
    from mindspore import Tensor, nn

    from mindgrpo.models.qwen2 import NEG_INF
    from mindgrpo.models.scoring import segment_bias

    class Bias(nn.Cell):
        def construct(self, segments):
            return segment_bias(segments)

    segments = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]], np.int32)
    got = Bias()(Tensor(segments)).asnumpy()
    assert got.shape == (2, 1, 6, 6) and got.dtype == np.float32
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    for row, seg in zip(got[:, 0], segments):
        keep = (seg[:, None] == seg[None, :]) & (j <= i)
        np.testing.assert_array_equal(row, np.where(keep, 0.0, NEG_INF))  # -0.0 == 0.0


# The memory a differentiated graph over packed rows holds against one over right-padded rows of the
# same shape (4 rows of 1024 tokens, 4 samples per packed row, the same number of scored tokens). The
# packed one needs its block-diagonal bias (rows, 1, S, S), where the padded one has a causal (1, 1, S, S):
# it may hold that bias in fp32 and its bool mask (5 bytes per (rows, S, S) element), not the 27 bytes
# per element that `where` over broadcast segments held. On the benchmark's workloads the packed
# rows' fewer scored tokens more than pay for it (benchmarks/packing_memory.py). One process per side;
# graph code compiles from a file.
GRAPH_MEMORY = """
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import PackedTokenLogProbs, TokenLogProbs

ms.set_context(mode=ms.GRAPH_MODE)
ROWS, S, PER_ROW, SCORED = 4, 1024, 4, 64  # each packed sample: S / PER_ROW tokens, its last SCORED scored
CFG = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=S)


def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024


class Total(nn.Cell):
    def __init__(self, scorer):
        super().__init__(auto_prefix=False)
        self.scorer = scorer

    def construct(self, *inputs):
        return self.scorer(*inputs)[0].sum()


class Grad(nn.Cell):
    def __init__(self, scorer, lm):
        super().__init__(auto_prefix=False)
        self.grad = ms.value_and_grad(Total(scorer), None, lm.trainable_params())

    def construct(self, *inputs):
        return self.grad(*inputs)[0]


def inputs(packed, s):
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 64, (ROWS, s)).astype(np.int32)
    n = s // PER_ROW
    scored = min(SCORED, n - 1)
    if not packed:  # the same scored count: PER_ROW * scored at the end of each row
        pos = np.broadcast_to(np.arange(s - PER_ROW * scored - 1, s - 1), (ROWS, PER_ROW * scored))
        return ids, pos.astype(np.int32), rng.integers(2, 64, pos.shape).astype(np.int32)
    positions = np.tile(np.arange(n), (ROWS, PER_ROW)).astype(np.int32)
    segments = np.repeat(np.arange(1, PER_ROW + 1), n)[None].repeat(ROWS, 0).astype(np.int32)
    starts = np.arange(ROWS * PER_ROW) * n  # each sample's first token in ROWS * s
    tokens = (starts[:, None] + np.arange(n - scored - 1, n - 1)).reshape(-1).astype(np.int32)
    slots = np.arange(tokens.size).reshape(ROWS * PER_ROW, scored).astype(np.int32)
    return ids, positions, segments, tokens, rng.integers(2, 64, tokens.size).astype(np.int32), slots


packed = sys.argv[1] == "packed"
lm = Qwen2ForCausalLM(CFG, seed=0)
make = (lambda: PackedTokenLogProbs(lm)) if packed else (lambda: TokenLogProbs(lm))
Grad(make(), lm)(*map(Tensor, inputs(packed, 32))).asnumpy()  # the runtime's own start-up, not counted
graph, feed = Grad(make(), lm), tuple(map(Tensor, inputs(packed, S)))
base = rss()
graph(*feed).asnumpy()
print(rss() - base)
"""


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
def test_a_differentiated_graph_on_packed_rows_holds_only_its_bias_beyond_padded_rows(tmp_path):
    script = tmp_path / "graph_memory.py"
    script.write_text(GRAPH_MEMORY)
    held = {}
    for side in ("padded", "packed"):
        run = subprocess.run([sys.executable, str(script), side], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        held[side] = int(run.stdout.split()[-1])
    element = 4 * 1024 * 1024  # (rows, S, S)
    assert held["padded"] >= 2 * (2 * element * 4), held  # it sees the attention's scores, (rows, nh, S, S) fp32
    # measured 4.64 bytes per element (2026-11-26); 6 leaves room for the noise of RSS readings (~2 MB)
    assert held["packed"] - held["padded"] <= 6 * element, (held, (held["packed"] - held["padded"]) / element)


def test_flash_attention_is_refused_off_ascend_naming_the_key():
    from mindgrpo.config import ConfigError, GRPOConfig, load_config

    flash = ["actor_config.max_tokens_per_micro_batch=2048", "actor_config.packing=true",
             "actor_config.packed_attention=flash"]
    cfg = load_config(GRPOConfig, overrides=flash)
    cfg.check_device("Ascend")
    with pytest.raises(ConfigError, match="actor_config.packed_attention': 'flash' needs Ascend .* on CPU: use 'mask'"):
        cfg.check_device("CPU")
    load_config(GRPOConfig, overrides=flash[:2]).check_device("CPU")  # the mask path runs anywhere
