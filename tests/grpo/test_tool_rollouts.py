"""Conversations in the trainer (generate_config.tools): the engine gets the run's turns, the rewards the columns
tool_calls and messages, the step the tool/ and turns/ metrics, validation the same; the experience trains the
model's tokens only. A scripted engine drives the real ToolTurns (the tiny tool recipe's chat template, a real tool
pool) as RolloutEngine.generate does: no model runs."""

import os

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.data.synthetic import ensure_tiny_tokenizer
from mindgrpo.grpo.conversations import build_conversations, trajectory_runs
from mindgrpo.grpo.prompts import PromptSource
from mindgrpo.grpo.trainer import GRPOTrainer
from mindgrpo.inference.engine import Completion
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.progress import Progress

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(REPO, "model_configs", "qwen_grpo", "tiny_tools", "tokenizer_config.json")
G = 4


def call(expression, name="calculator"):
    return '<tool_call>\n{"name": "%s", "arguments": {"expression": "%s"}}\n</tool_call>' % (name, expression)


# sample j of every prompt: a right call, bad JSON, an unknown tool, no call at all
FIRST_TURNS = [lambda q: call(q), lambda q: "<tool_call>\n{oops}\n</tool_call>", lambda q: call(q, "search"),
               lambda q: "\\boxed{0}"]


class ScriptedToolEngine:
    """Each sample's turns as RolloutEngine.generate runs them: end_turn after a turn's stop token, the tool turn
    from poll, the next turn; tool turns False in model_mask, their log-probs 0."""

    def __init__(self, tokenizer):
        self.tok, self.calls, self.last_stats = tokenizer, [], {"new_tokens": 0, "tokens_per_s": 1.0}
        self.stop = tokenizer.stop_token_ids[0]

    def generate(self, prompts, params, turns=None):
        self.calls.append(turns)
        out = []
        for i, prompt in enumerate(prompts):
            question = self.tok.decode(prompt).split("What is ")[1].split("?")[0]
            for j in range(params.n):
                request = i * params.n + j
                ids = self.tok.encode(FIRST_TURNS[j](question)) + [self.stop]
                mask = [True] * len(ids)
                if turns.end_turn(request, i, ids):
                    ready = []
                    while not ready:
                        ready = [t for r, t in turns.poll(True) if r == request]
                    ids += ready[0]
                    mask += [False] * len(ready[0])
                    final = self.tok.encode("\\boxed{%d}" % eval(question)) + [self.stop]  # the test's own sum
                    assert not turns.end_turn(request, i, final)
                    ids += final
                    mask += [True] * len(final)
                mask = np.array(mask)
                logp = np.where(mask, -0.5, 0.0).astype(np.float32)
                out.append(Completion(i, ids, "stop", logp, logp, mask, int((~mask).any())))
        self.last_stats = {"new_tokens": sum(int(c.model_mask.sum()) for c in out), "tokens_per_s": 1.0,
                           "turns_cut": 0}  # it appends every tool turn
        return out


class CapturingRewards:
    """Right when the trajectory's text ends with the solution boxed; keeps the columns it was given."""

    def __init__(self):
        self.columns = None

    def __call__(self, completions, **columns):
        self.columns = columns
        r = np.array([float(c.endswith("\\boxed{%s}" % s)) for c, s in zip(completions, columns["solution"])],
                     np.float32)
        return r, {"accuracy": r}, {}


class Log:
    def log_completions(self, step, rows):
        pass


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return ensure_tiny_tokenizer(str(tmp_path_factory.mktemp("tiny") / "tokenizer"))


@pytest.fixture(scope="module")
def trained(tokenizer):
    """A trainer whose engine is scripted, its conversations built as the builder builds them."""
    cfg = from_dict(GRPOConfig, {"rl_config": {"batch_size": 2, "num_generations": G, "val_interval": 1,
                                               "val_size": 2, "val_n": 1},
                                 "actor_config": {"micro_batch_size": 4},
                                 "generate_config": {"tools": ["calculator"], "tool_num_workers": 1,
                                                     "max_turns": 1, "tool_response_max_tokens": 16}})
    conv = build_conversations(cfg, tokenizer, TEMPLATE)
    questions = ["123 + 456 + 789", "500 + 321 + 99", "111 + 222 + 333"]
    data = {"prompt_ids": [np.array(tokenizer.encode(f"What is {q}?")) for q in questions],
            "prompt_length": [len(tokenizer.encode(f"What is {q}?")) for q in questions],
            "solution": [str(eval(q)) for q in questions], "answer": [""] * 3, "prompt": questions}
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256))
    engine, rewards = ScriptedToolEngine(tokenizer), CapturingRewards()
    trainer = GRPOTrainer(cfg, policy=lm, inference=lm, reference=None, engine=engine, sync=None, ref_sync=None,
                          memory=SwapManager(enabled=False), rewards=rewards, tokenizer=tokenizer,
                          train_prompts=PromptSource(data, seed=0, shuffle=False),
                          val_prompts=PromptSource(data, seed=0, shuffle=False), metrics_log=Log(),
                          progress=Progress(1), output_dir="unused", conversations=conv)
    conv.start()
    try:
        r, metrics = trainer.collect()
        train_columns = rewards.columns
        val = trainer.validate()
        yield trainer, engine, r, metrics, train_columns, val, conv
    finally:
        conv.close()


def test_the_engine_runs_the_conversations_and_the_rewards_see_them(trained):
    trainer, engine, r, metrics, columns, _, conv = trained
    assert engine.calls[0] is conv.turns
    calls = columns["tool_calls"]
    assert len(calls) == 2 * G
    assert [[c["status"] for c in per] for per in calls[:G]] == [["ok"], ["error"], ["error"], []]
    assert calls[0] == [{"name": "calculator", "arguments": {"expression": "123 + 456 + 789"}, "status": "ok",
                         "response": "1368"}]
    assert "unknown tool 'search'" in calls[2][0]["response"]
    messages = columns["messages"]
    assert messages[0] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "123 + 456 + 789"}}}]},
        {"role": "tool", "content": "1368"},
        {"role": "assistant", "content": "\\boxed{1368}"}]
    assert messages[3] == [{"role": "assistant", "content": "\\boxed{0}"}]
    assert messages[G][1] == {"role": "tool", "content": "920"}
    # the right call's samples answer right; the others give the right sum too (the script), no call: wrong
    np.testing.assert_array_equal(r.rewards, [1, 1, 1, 0] * 2)


def test_the_step_logs_tool_and_turn_metrics(trained):
    _, _, r, metrics, _, _, _ = trained
    assert metrics["tool/calls_mean"] == 0.75 and metrics["tool/errors"] == 4.0
    assert metrics["tool/timeouts"] == 0.0 and metrics["tool/seconds"] > 0
    assert metrics["turns/mean"] == 0.75 and metrics["tool/samples_with_calls"] == 0.75
    assert metrics["turns/cut"] == 0.0  # the engine's count: every tool turn fitted
    masked = sum(int((~c.model_mask).sum()) for c in r.completions)
    assert masked > 0
    assert metrics["turns/masked_fraction"] == pytest.approx(masked / sum(len(c.token_ids) for c in r.completions))


def test_the_experience_trains_the_models_tokens_only(trained):
    trainer, _, r, _, _, _, _ = trained
    adv, _ = trainer.advantages(r)
    exp = trainer.build_experience(r, adv)
    for i, c in enumerate(r.completions):
        n = len(c.token_ids)
        np.testing.assert_array_equal(exp.mask[i, :n] > 0, c.model_mask)
        assert exp.mask[i, n:].sum() == 0


def test_validation_runs_the_conversations(trained):
    _, engine, _, _, _, val, conv = trained
    assert engine.calls[-1] is conv.turns and len(engine.calls) == 2
    assert val["val/tool/calls_mean"] == 1.0  # validation's one sample per prompt is the right call
    assert val["val/accuracy"] == 1.0


def test_trajectory_runs():
    runs = trajectory_runs([5, 6, 7, 8, 9], np.array([True, True, False, False, True]))
    assert runs == [(True, [5, 6]), (False, [7, 8]), (True, [9])]


def test_dynamic_samplings_selection_keeps_each_samples_own_columns():
    from mindgrpo.grpo.prompts import PromptBatch
    from mindgrpo.grpo.rollouts import Rollouts

    batch = PromptBatch([[1], [2], [3]], {"solution": ["a", "b", "c"]})
    comps = [Completion(i // 2, [i], "stop") for i in range(6)]
    r = Rollouts(batch, comps, [str(i) for i in range(6)], 2, {"tool_calls": [[i] for i in range(6)]})
    kept = r.groups(np.array([True, False, True]))
    assert kept.columns["tool_calls"] == [[0], [1], [4], [5]] and kept.columns["solution"] == ["a", "a", "c", "c"]
    both = Rollouts.concat([kept, r.groups(np.array([False, True, False]))])
    assert both.columns["tool_calls"] == [[0], [1], [4], [5], [2], [3]]
    assert both.columns["solution"] == ["a", "a", "c", "c", "b", "b"]
