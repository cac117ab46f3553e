"""The model with our CPU matmul (mindgrpo.kernels, the default) against the model with MindSpore's MatMul
everywhere (MINDGRPO_CPU_KERNELS=0): one GRPO training-graph call's loss, metrics and every gradient, in two
processes (the switch is read when the model's layers are built).

A one-layer model of width 256 (4 heads of 64, as many KV heads, MLP 512, vocabulary 512: every layer at least
MIN_WIDTH wide) on a batch of 4 x 144 = 576 token rows, 544 scored: every projection's product and the vocabulary
head take ours (at least MIN_ROWS rows); the fused head in chunks of 512 and 32 rows takes ours for the first and
MindSpore's for the second; a LoRA model (random B, so A gets a gradient too) runs the base's products on ours
and its rank-8 adapters' (narrow) on MindSpore's. The two sides differ only in the order of the matmuls' fp32 sums
(each product within K u sum|a b| of the exact one: tests/kernels/test_matmul.py), so they agree to fp32 rounding
carried through one layer and the loss: each tensor within 1e-5 of its largest magnitude (measured: at most
1.3e-6; element by element the relative difference reaches 1e-2 where a gradient's terms cancel to near zero, which
is rounding, not a wrong product). A wrong transpose, block or gradient in ours would be off by the size of the
values themselves."""

import numpy as np
import pytest

from both_switches import nodes, run_both  # this folder (on the path under pytest and in run_both's processes)

SCALE_TOL = 1e-5  # of a tensor's largest magnitude


def one_call(updater, exp):
    import mindspore as ms
    from mindspore import Tensor

    loss, metrics = updater.step_graph(
        Tensor(exp.input_ids), ms.mutable((Tensor(exp.score_pos), Tensor(exp.labels))), Tensor(exp.mask),
        Tensor(exp.advantages), Tensor(np.zeros_like(exp.mask)), Tensor(exp.ref_logp),
        Tensor(np.float32(exp.mask.sum())), Tensor(np.float32(len(exp))), None)
    out = {"loss": np.float32(loss.asnumpy()), "metrics": np.array([float(m.asnumpy()) for m in metrics])}
    out.update({f"grad {p.name}": b.asnumpy().copy() for p, b in zip(updater.params, updater.buffer.bufs)})
    return out


def run(out_path: str, ir_folder: str) -> None:
    """The child process: three training-graph calls (whole head, fused head in chunks, LoRA), saved to out_path;
    the first call's compiled graphs saved into ir_folder."""
    import mindspore as ms

    from mindgrpo.grpo.actor import PolicyUpdater
    from mindgrpo.grpo.experience import pack
    from mindgrpo.grpo.ms_objective import GRPOLoss
    from mindgrpo.grpo.packing import Batching
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.lora import LoraSpec, add_adapters
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    ms.set_context(mode=ms.GRAPH_MODE)
    micro = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                        tie_word_embeddings=True, param_init_std=0.05)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, 512, n).tolist() for n in (9, 5, 7, 12)]
    responses = [rng.integers(1, 512, n).tolist() for n in (120, 131, 100, 125)]
    exp = pack(prompts, responses, rng.standard_normal(4).astype(np.float32), step=8)
    exp.ref_logp = (-6.0 + 0.3 * rng.standard_normal(exp.labels.shape)).astype(np.float32) * exp.mask
    assert exp.input_ids.size == 576 and exp.labels.size == 544, (exp.input_ids.shape, exp.labels.shape)

    results = {}
    for name, chunk, lora in (("whole", 0, False), ("fused", 512, False), ("lora", 0, True)):
        lm = Qwen2ForCausalLM(micro, seed=7)
        if lora:
            add_adapters(lm, LoraSpec(rank=8, alpha=16), seed=1)
            for p in lm.get_parameters():
                if p.name.endswith(".lora_b"):
                    p.set_data(ms.Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.05))
        updater = PolicyUpdater(lm, GRPOLoss(beta=0.04, kl_kind="k3"), Batching(4), detach_old=True, use_ref=True,
                                chunk=chunk)
        if name == "whole":
            ms.set_context(save_graphs=1, save_graphs_path=ir_folder)
        try:
            values = one_call(updater, exp)
        finally:
            ms.set_context(save_graphs=0)
        results.update({f"{name}: {k}": v for k, v in values.items()})
    np.savez(out_path, **results)


@pytest.mark.slow  # two processes side by side, each compiling three training graphs (~1.5 min at load 10)
def test_the_model_with_our_matmul_matches_mindspores_within_fp32_rounding(tmp_path):
    ours, theirs = run_both(tmp_path, "test_model_kernels")
    # the switch reaches the compiled graph: ours with it on (7 projections and the head, forward and both
    # gradients), none with it off; the choice by rows is made at compile time (no Switch node for it)
    assert nodes(tmp_path / "ir1", "Custom") == 24 and nodes(tmp_path / "ir0", "Custom") == 0
    assert nodes(tmp_path / "ir1", "Switch") == nodes(tmp_path / "ir0", "Switch") == 0
    assert sorted(ours.files) == sorted(theirs.files)
    assert sum(k.startswith("lora: grad") and "lora_a" in k for k in ours.files) > 0
    for key in ours.files:
        if "grad" in key:
            assert np.any(theirs[key] != 0), key  # every compared gradient is live
        bound = SCALE_TOL * np.max(np.abs(theirs[key]))
        assert np.all(np.abs(ours[key] - theirs[key]) <= bound), (key, np.max(np.abs(ours[key] - theirs[key])), bound)
