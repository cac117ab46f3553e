"""The rollout engine with our CPU matmul (mindgrpo.kernels, the default) against the engine with MindSpore's MatMul
everywhere (MINDGRPO_CPU_KERNELS=0), in two processes (the switch is read when the engine's model pieces are built).

A two-layer model of width 256 (4 heads of 64, 2 KV heads, MLP 512, vocabulary 512: every fused product at least
MIN_WIDTH wide but RoPE's d = 64) in three cases:
- prefill: 4 prompts of 150-230 tokens in the 256-position bucket, 4 x 256 = 1,024 prefill rows (at least MIN_ROWS:
  ours for every fused product, qkv / o / gate-up / down, the last layer's qkv only), then greedy decode steps at 4
  rows (MindSpore's) that read the prefilled KV cache; the same with `layerwise` (a prefill layer graph called for
  each layer, the layer's weights its inputs: 4 products of ours in the one, 1 in the last layer's);
- a decode step of 512 rows (4 prompts x 128 greedy samples, 512 slots): ours for every layer product and the head.
The two sides differ only in the order of the matmuls' fp32 sums (each product within K u sum|a b| of the exact one,
K <= 512: tests/kernels/test_matmul.py), carried through two layers, the KV cache and the head: the logits agree within
1e-5 of their largest magnitude (as the training model's gradients in test_model_kernels.py; measured: 4.7e-7 and
6.4e-7 of it, 1.8e-6 and 2.1e-6 on logits up to 3.8), the log-probs within twice that (a log-softmax moves at most
twice its inputs' largest change; measured 1.2e-6). A wrong transpose, block or layout in ours would be off by the
size of the logits. The greedy tokens must be equal: every step's top two logits are checked to be at least 100
times the tolerance apart on both sides, so no near-tie decides (measured: at least 280 times).

The tiny recipe's shape (width 128: no product wide enough) keeps MindSpore's MatMul with the switch on, also at a
prefill of 1,024 rows: its engine, the first in each process, gives the same tokens, log-probs and logits bit for bit
on both sides, and its graphs hold no kernel of ours (`run` says why the first, on one thread)."""

import os

import numpy as np
import pytest

from both_switches import nodes, run_both  # this folder (on the path under pytest and in run_both's processes)

SCALE_TOL = 1e-5  # of the logits' largest magnitude
MARGIN = 100  # a greedy step's top-two gap, in tolerances


def prompts(seed: int, lengths):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 512, n).tolist() for n in lengths]


def call(engine, work, params, ir_folder):
    """One generate call with its compiled graphs saved into ir_folder -> tokens, log-probs, logits per request."""
    import mindspore as ms

    ms.set_context(save_graphs=1, save_graphs_path=ir_folder)
    try:
        out = engine.generate(work, params, return_logits=True)
    finally:
        ms.set_context(save_graphs=0)
    return {"tokens": np.array([c.token_ids for c in out]), "logprobs": np.array([c.logprobs for c in out]),
            "logits": np.stack(engine.last_logits)}


def run(out_path: str, ir_folder: str) -> None:
    """A child process (MINDGRPO_CPU_KERNELS as it is given), MindSpore's kernels on one thread: the tiny shape's
    engine first, then the two cases on the wide model, saved to out_path, each case's graphs into ir_folder/CASE.

    The tiny engines of the two sides are compared bit for bit, so each is its process's first and only tiny
    engine, on one thread: MindSpore's split of a kernel's work over threads depends on the machine's timing in its
    first launches (DEVELOPERS.md), and under jemalloc (the suite's allocator) two engines built alike in one process
    gave logits up to 1.4e-6 apart (measured: with the switch off for both too; glibc's malloc gave the same bits)."""
    import mindspore as ms

    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.device_context.cpu.op_tuning.threads_num(1)
    tiny = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=True, param_init_std=0.05)
    wide = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=True, param_init_std=0.05)
    lm = Qwen2ForCausalLM(wide, seed=7)
    cases = {"tiny": (RolloutEngine(Qwen2ForCausalLM(tiny, seed=7), max_num_seqs=8), prompts(1, (200, 180, 150, 230)),
                      SamplingParams(max_tokens=6, temperature=1.0, n=2, seed=3)),
             "prefill": (RolloutEngine(lm, max_num_seqs=4), prompts(2, (200, 180, 150, 230)),
                         SamplingParams(max_tokens=6, temperature=0.0)),
             "layerwise": (RolloutEngine(lm, max_num_seqs=4, layerwise=True), prompts(2, (200, 180, 150, 230)),
                           SamplingParams(max_tokens=6, temperature=0.0)),
             "decode512": (RolloutEngine(lm, max_num_seqs=512), prompts(3, (20, 18, 15, 23)),
                           SamplingParams(max_tokens=2, temperature=0.0, n=128))}
    results = {}
    for name, (engine, work, params) in cases.items():
        got = call(engine, work, params, os.path.join(ir_folder, name))
        results.update({f"{name}: {k}": v for k, v in got.items()})
    np.savez(out_path, **results)


def top_two_gap(logits):
    """(..., V) -> (...) the largest logit less the second."""
    top = np.sort(logits, axis=-1)
    return top[..., -1] - top[..., -2]


@pytest.mark.slow  # two processes side by side, each compiling about 17 engine graphs (~1.5 min)
def test_the_engine_with_our_matmul_matches_mindspores_within_fp32_rounding(tmp_path):
    ours, theirs = run_both(tmp_path, "test_engine_kernels")

    # the switch reaches the compiled graphs: the prefill of 1,024 rows (whole or layerwise) takes ours for layer 0's
    # four fused products and the last layer's qkv (its attention and MLP are not run); the 4-row decode steps none;
    # the 512-row decode step every layer's four and the head; with the switch off none; no Switch node for the choice
    ir1, ir0 = tmp_path / "ir1", tmp_path / "ir0"
    assert nodes(ir1 / "prefill", "Custom") == nodes(ir1 / "layerwise", "Custom") == 5
    assert nodes(ir1 / "decode512", "Custom") == 9
    for case in ("prefill", "layerwise", "decode512"):
        assert nodes(ir0 / case, "Custom") == 0
        assert nodes(ir1 / case, "Switch") == nodes(ir0 / case, "Switch") == 0
        assert nodes(ir1 / case, "MatMul") > 0  # RoPE's rotation (d = 64) and the decode steps: MindSpore's
        key = f"{case}: "
        logits, reference = ours[key + "logits"], theirs[key + "logits"]
        bound = SCALE_TOL * np.max(np.abs(reference))
        assert np.all(top_two_gap(reference) >= MARGIN * bound) and np.all(top_two_gap(logits) >= MARGIN * bound), \
            (case, top_two_gap(reference).min(), bound)  # no near-tie: the greedy tokens must agree
        np.testing.assert_array_equal(ours[key + "tokens"], theirs[key + "tokens"])
        assert np.max(np.abs(logits - reference)) <= bound, (case, np.max(np.abs(logits - reference)), bound)
        lp, lp_ref = ours[key + "logprobs"], theirs[key + "logprobs"]
        assert np.all(lp_ref < 0) and np.max(np.abs(lp - lp_ref)) <= 2 * bound, (case, np.max(np.abs(lp - lp_ref)))

    # the tiny shape: no kernel of ours with the switch on, the same graphs' MatMuls, the same bits
    assert nodes(ir1 / "tiny", "Custom") == nodes(ir0 / "tiny", "Custom") == 0
    assert nodes(ir1 / "tiny", "MatMul") == nodes(ir0 / "tiny", "MatMul") > 0
    for k in ("tokens", "logprobs", "logits"):
        np.testing.assert_array_equal(ours[f"tiny: {k}"], theirs[f"tiny: {k}"], err_msg=k)
