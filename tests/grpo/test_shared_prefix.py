"""The shared-prefix layout (grpo/packing.py "shared", models/scoring.prefix_bias): the samples of a prompt in one
run, the prompt once, each response after it seeing the prompt and itself. The same log-probs as the padded rows
(one sample a row, the prompt in each), and the same update, through the whole-model graphs and through the layerwise
ones (grpo/layerwise.py: the embed graph makes the runs' bias, the head picks the scored tokens)."""

import os

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.grpo import builder
from mindgrpo.grpo.actor import PolicyUpdater, Scorer
from mindgrpo.grpo.experience import pack
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import AdamWSettings
from mindgrpo.grpo.packing import Batching, plan, prompt_groups
from mindgrpo.memory.policy import MemoryPolicy
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.progress import Progress

from fakes import RecordingLog, one_layer_micro, with_adapters  # tests/grpo is on sys.path under pytest

CFG = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=128)
PROMPTS = (5, 7, 3)  # three prompts of G = 3 samples, then a lone one
RESPONSES = ((4, 9, 2), (6, 1, 11), (8, 8, 3), (5,))


def experience(seed=0):
    rng = np.random.default_rng(seed)
    prompts, responses = [], []
    for k, group in enumerate(RESPONSES):
        prompt = list(rng.integers(2, 64, PROMPTS[k % len(PROMPTS)]))
        for n in group:
            prompts.append(prompt)
            responses.append(list(rng.integers(2, 64, n)))
    return pack(prompts, responses, rng.standard_normal(len(responses)).astype(np.float32))


def test_a_prompts_samples_are_one_run_with_the_prompt_once():
    exp = experience()
    assert prompt_groups(exp, np.arange(len(exp))) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    batches = plan(exp, Batching(4, max_tokens=64, packing=True, shared_prefix=True))
    laid = sum(int((mb.feed[1] != 0).sum()) for mb in batches)  # tokens laid out (padding has runs 0)
    assert laid == sum(PROMPTS) + PROMPTS[0] + sum(sum(g) for g in RESPONSES)
    assert sorted(s for mb in batches for s in mb.samples) == list(range(len(exp)))


def test_a_group_longer_than_the_budget_is_cut_into_runs_that_each_carry_the_prompt():
    exp = experience()
    batches = plan(exp, Batching(4, max_tokens=24, packing=True, step=8, shared_prefix=True))  # 7 + 6 + 1 + 11 > 24
    assert all(mb.ids.size <= 24 for mb in batches)
    assert sorted(s for mb in batches for s in mb.samples) == list(range(len(exp)))
    laid = sum(int((mb.feed[1] != 0).sum()) for mb in batches)
    assert laid > sum(PROMPTS) + PROMPTS[0] + sum(sum(g) for g in RESPONSES)  # some prompt laid out twice


@pytest.fixture(scope="module")
def padded_logp():
    return Scorer(Qwen2ForCausalLM(CFG, seed=1), 4)(experience())


@pytest.mark.parametrize("budget, layerwise", [(32, False), (64, False), (128, False), (32, True), (64, True)])
def test_shared_prefix_log_probs_equal_the_padded_rows(padded_logp, budget, layerwise):
    exp = experience()
    got = Scorer(Qwen2ForCausalLM(CFG, seed=1), 4, max_tokens=budget, packing=True, shared_prefix=True,
                 layerwise=layerwise)(exp)
    assert np.abs(padded_logp).max() > 1.0
    np.testing.assert_allclose(got, padded_logp, rtol=0, atol=1e-5)


def updated(lm=None, memory=MemoryPolicy(), **kw):
    lm = lm or Qwen2ForCausalLM(CFG, seed=1)
    up = PolicyUpdater(lm, GRPOLoss(beta=0.0, agg_mode="token-mean"), Batching(4, **kw), detach_old=True,
                       use_ref=False, optimizer=AdamWSettings(beta2=0.99, weight_decay=0.01), memory=memory)
    metrics = up.update(experience(), lr=1e-2)
    return metrics, {n: p.asnumpy() for n, p in lm.parameters_and_names()}


@pytest.mark.slow  # two update graphs compile: ~16 s alone
def test_an_update_on_shared_prefix_runs_equals_the_padded_rows():
    m_rows, w_rows = updated()
    m_shared, w_shared = updated(max_tokens=64, packing=True, shared_prefix=True)
    assert m_rows["loss"] == pytest.approx(m_shared["loss"], abs=1e-6)
    assert m_rows["grad_norm"] == pytest.approx(m_shared["grad_norm"], rel=1e-5)
    # atol 1e-5 as test_packing's: a k bias's gradient is rounding noise (the softmax ignores what every key adds to
    # a query's scores) and AdamW's first step normalises it to the learning rate's size
    for name, w in w_rows.items():
        np.testing.assert_allclose(w_shared[name], w, rtol=0, atol=1e-5, err_msg=name)
    initial = {n: p.asnumpy() for n, p in Qwen2ForCausalLM(CFG, seed=1).parameters_and_names()}
    assert max(np.abs(w_rows[n] - initial[n]).max() for n in w_rows) > 1e-3  # the update moved the weights


@pytest.mark.slow  # four update graphs compile
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_layerwise_update_on_shared_prefix_runs_equals_the_padded_rows(lora):
    """actor_config.layerwise_update on shared-prefix runs: the head whole, or 3 samples a call (a part of 3 and one of
    1: each takes its samples' scored tokens from the whole x); every layer running its forward again in its backward,
    or with LoRA every layer keeping its activations (recompute_num_layers 0: saved_layer's pieces take the bias)."""
    model = (lambda: with_adapters(CFG, seed=1)) if lora else (lambda: Qwen2ForCausalLM(CFG, seed=1))
    m_rows, w_rows = updated(model())
    shared = dict(max_tokens=64, packing=True, shared_prefix=True)
    for head_rows in (0, 3):
        memory = MemoryPolicy(layerwise_update=True, head_rows=head_rows, recompute_num_layers=0 if lora else None)
        m, w = updated(model(), memory, **shared)
        assert m_rows["loss"] == pytest.approx(m["loss"], abs=1e-6), head_rows
        assert m_rows["grad_norm"] == pytest.approx(m["grad_norm"], rel=1e-5), head_rows
        for key in ("entropy", "nll"):
            assert m_rows[key] == pytest.approx(m[key], rel=1e-5), (head_rows, key)
        for name, v in w_rows.items():  # atol as the whole-graph test's
            np.testing.assert_allclose(w[name], v, rtol=0, atol=1e-5, err_msg=f"{head_rows} {name}")
    start = {n: p.asnumpy() for n, p in model().parameters_and_names()}
    moved = [n for n in w_rows if np.abs(w_rows[n] - start[n]).max() > 1e-3]
    assert moved and (not lora or all(".lora_" in n for n in moved))  # with LoRA the adapters alone train


HERE = os.path.dirname(os.path.abspath(__file__))
RUN = ["rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=8",
       "generate_config.max_tokens=8", "generate_config.max_prompt_length=32", "generate_config.max_num_seqs=8",
       "synthetic_config.template=raw", "actor_config.lr=1e-2", "rl_config.val_interval=0",
       "rl_config.completions_interval=0", "rl_config.max_steps=2", "reward_config.num_workers=0",
       f"reward_config.reward_plugin={os.path.join(HERE, 'text_length_reward.py')}",
       "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]",
       "rl_config.memory=speed", "rl_config.beta=0.04", "actor_config.max_tokens_per_micro_batch=256",
       "actor_config.packing=true"]


def trained(out, *extra):
    out.mkdir()
    cfg = load_config(GRPOConfig, None, RUN + [f"actor_config.model={one_layer_micro(out)}",
                                               f"rl_config.output_dir={out}", *extra])
    parts = builder.build(cfg, builder.Paths(output_dir=str(out)))
    trainer = builder.make_trainer(cfg, parts, RecordingLog(), Progress(1), str(out))
    steps = []
    for _ in range(2):
        steps.append(trainer.train_step())
        trainer.step += 1
    return steps


@pytest.mark.slow  # three trainers' graphs compile: ~50 s alone
def test_a_run_with_a_shared_prefix_trains_as_the_packed_run(tmp_path, graph_mode):
    """Through the trainer, the reference and the update with their whole-model graphs and with their layerwise ones
    (actor_config.layerwise_update, ref_config.layerwise)."""
    packed = trained(tmp_path / "packed")
    shared = trained(tmp_path / "shared", "actor_config.shared_prefix=true")
    layerwise = trained(tmp_path / "layerwise", "actor_config.shared_prefix=true", "actor_config.layerwise_update=true",
                        "ref_config.layerwise=true")
    assert packed[0]["kl"] == 0 and packed[1]["kl"] > 0  # the reference pass ran (the policy moved after step 1)
    for a, b in [*zip(packed, shared), *zip(packed, layerwise)]:
        assert a["reward_mean"] == b["reward_mean"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-4, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
