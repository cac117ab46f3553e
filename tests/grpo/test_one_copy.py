"""One copy of the weights where the layouts match (mindgrpo/grpo/builder.py): on one device the rollout
engine generates with the policy model itself, with no second model and no weight sync. Against the same
build with generate_config.inference_weights=copy (a second model, synced after every update): the same
rollouts, greedy and sampled, tokens and both log-probs bit for bit, before and after a GRPO step; the
same step; and a memory ledger that holds one copy of the weights, counted here by hand from the shapes."""

import os

import mindspore as ms
import pytest

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.grpo import builder
from mindgrpo.memory.plan import plan
from mindgrpo.models.config import Qwen2Config
from mindgrpo.utils.progress import Progress

HERE = os.path.dirname(os.path.abspath(__file__))
# as test_variants.py: a dense reward (every group has a spread, so the step moves the weights), swap on (the
# ledger moves groups in and out at each phase and checks which may be resident together)
MICRO = ["rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=4",
         "generate_config.max_tokens=8", "synthetic_config.template=raw", "actor_config.lr=1e-2",
         "rl_config.val_interval=0", "rl_config.completions_interval=0", "rl_config.swap=true",
         "rl_config.max_steps=1", "reward_config.num_workers=0",
         f"reward_config.reward_plugin={os.path.join(HERE, 'text_length_reward.py')}",
         "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]"]
# what differs between two runs of the same work: wall-clock figures; and what sharing changes on purpose
TIMING = ("time/", "perf/", "seconds", "tokens_per_s")


class NoLog:
    def log_completions(self, step, rows):
        pass


def param_bytes(m: Qwen2Config) -> int:
    """The model's fp32 parameters, by hand: the embedding, per layer q/k/v (with their bias), o, the SwiGLU's
    three matrices and the two norms, the final norm, and the head unless tied."""
    h, i, q, kv = m.hidden_size, m.intermediate_size, m.num_attention_heads * m.d, m.num_key_value_heads * m.d
    layer = h * q + q + 2 * (h * kv + kv) + q * h + 3 * h * i + 2 * h
    return 4 * (m.vocab_size * h + m.num_hidden_layers * layer + h + (0 if m.tie_word_embeddings else m.vocab_size * h))


def fused_bytes(m: Qwen2Config) -> int:
    """The engine's fp32 fused copies, by hand: per layer [q; k; v] and its bias, o, [gate; up] and down."""
    h, i, q, kv = m.hidden_size, m.intermediate_size, m.num_attention_heads * m.d, m.num_key_value_heads * m.d
    return 4 * m.num_hidden_layers * (h * (q + 2 * kv) + (q + 2 * kv) + q * h + 2 * h * i + i * h)


def generate(trainer, prompts):
    """Greedy and sampled completions of the prompts, in the ledger's rollout phase."""
    out = {}
    for name, params in (("greedy", trainer.sampling(1, seed=0, greedy=True)), ("sampled", trainer.sampling(4, 5))):
        with trainer.memory.phase("rollout"):
            out[name] = trainer.engine.generate(prompts, params)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """For inference_weights auto (shared) and copy, built alike: the parts, the rollouts before a GRPO step,
    the step's metrics, the rollouts after it and the updated weights."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    out = tmp_path_factory.mktemp("one_copy")
    with open(os.path.join(HERE, "micro_qwen2.yaml")) as f:  # one layer: fewer seconds of compiling
        text = f.read().replace("num_hidden_layers: 2", "num_hidden_layers: 1")
    assert "num_hidden_layers: 1" in text
    model = out / "micro_one_layer.yaml"
    model.write_text(text)
    runs = {}
    for weights in ("auto", "copy"):
        folder = out / weights
        cfg = load_config(GRPOConfig, None, MICRO + [f"actor_config.model={model}", f"rl_config.output_dir={folder}",
                                                     f"generate_config.inference_weights={weights}"])
        parts = builder.build(cfg, builder.Paths(output_dir=str(folder)))
        trainer = builder.make_trainer(cfg, parts, NoLog(), Progress(1), str(folder))
        prompts = parts.train_prompts.take(range(3)).ids
        before = generate(trainer, prompts)
        metrics = trainer.train_step()
        after = generate(trainer, prompts)
        weights_now = {n: p.asnumpy().copy() for n, p in parts.policy.parameters_and_names()}
        runs[weights] = dict(cfg=cfg, parts=parts, before=before, metrics=metrics, after=after, weights=weights_now,
                             mcfg=parts.policy.config)
    yield runs
    ms.set_context(mode=previous)


def test_one_device_generates_with_the_policy_itself_and_the_sync_moves_nothing(runs):
    shared, copy = runs["auto"]["parts"], runs["copy"]["parts"]
    assert shared.inference is shared.policy and copy.inference is not copy.policy
    assert shared.engine.lm is shared.policy
    m = shared.sync()
    assert m == {k: 0.0 for k in copy.sync()}  # the copy's columns, each 0
    assert runs["copy"]["metrics"]["sync/bytes"] == param_bytes(runs["copy"]["mcfg"])
    step = runs["auto"]["metrics"]
    assert {k: step[k] for k in m} == m


def assert_same_completions(a, b, what):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert (x.prompt_index, x.token_ids, x.finish_reason) == (y.prompt_index, y.token_ids, y.finish_reason), (what, i)
        for field in ("logprobs", "sampling_logprobs"):
            u, v = getattr(x, field), getattr(y, field)
            assert u.dtype == v.dtype and u.tobytes() == v.tobytes(), (what, i, field)


def test_the_rollouts_are_the_copied_ones_bit_for_bit_before_and_after_a_step(runs):
    shared, copy = runs["auto"], runs["copy"]
    assert shared["parts"].inference is shared["parts"].policy
    for when in ("before", "after"):
        for kind in ("greedy", "sampled"):
            assert_same_completions(shared[when][kind], copy[when][kind], (when, kind))
    assert len(shared["before"]["sampled"]) == 12 and len(shared["before"]["greedy"]) == 3
    # the step moved the weights, and generation after it reads them: each prompt's first greedy token has
    # another log-prob than before
    for a, b in zip(shared["before"]["greedy"], shared["after"]["greedy"]):
        assert a.logprobs[0] != b.logprobs[0]
    # the same step: its rollouts, loss, gradient and updated weights
    a, b = shared["metrics"], copy["metrics"]
    assert a.keys() == b.keys() and a["grad_norm"] > 0 and a["reward_std"] > 0
    same = [k for k in a if not any(s in k for s in TIMING) and not k.startswith(("sync/", "memory/"))]
    assert {k: a[k] for k in same} == {k: b[k] for k in same}
    for name, w in copy["weights"].items():
        assert w.tobytes() == shared["weights"][name].tobytes(), name


def test_the_ledger_holds_one_copy_of_the_weights(runs):
    shared, copy = runs["auto"], runs["copy"]
    m = shared["mcfg"]
    params, fused = param_bytes(m), fused_bytes(m)
    groups = {name: g.size() for name, g in shared["parts"].memory.groups.items()}
    assert groups["policy"] == params and groups["inference"] == fused  # the engine's fused copies alone
    assert copy["parts"].memory.groups["inference"].size() == params + fused
    kv = groups["kv_cache"]
    assert kv > 0
    # generating keeps the policy resident (not its gradients nor its moments) with the fused copies and the cache:
    # as many bytes as the copy's inference model with its fused copies and cache
    for run in (shared, copy):
        assert run["parts"].memory.phase_peaks["rollout"] == params + fused + kv
    assert shared["parts"].memory.phase_peaks["sync"] == params  # no sync bucket
    assert copy["parts"].memory.phase_peaks["sync"] > params
    # every group resident (swap off, or a CPU's memory): one copy of the weights fewer
    total = {k: sum(g.size() for g in run["parts"].memory.groups.values()) for k, run in runs.items()}
    assert total["copy"] - total["auto"] == params
    # scripts/plan_memory.py's plan of the same configs
    for key, run in runs.items():
        p = plan(run["cfg"], m)
        assert p.shared == (key == "auto")
        for name in ("policy", "inference", "kv_cache"):
            assert p.groups[name] == run["parts"].memory.groups[name].size(), (key, name)
        assert p.phase_bytes("rollout", True) == run["parts"].memory.phase_peaks["rollout"]
