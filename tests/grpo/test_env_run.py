"""GRPO with an environment through the trainer, in process: generate_config.environment=guess_number on a one-layer
micro Qwen2 with the builder's parts, one step. The environment writes the prompts (its resets of the rows' prompt
text), each model turn that ends with a stop id gets the game's answer appended as a user turn, the last turns are
stepped after generate; the `environment` reward (weighted) is the env_reward column, which the game's rules,
replayed here on the model's turns, give, and which reaches the update's advantages; the observation tokens are out
of the loss mask; env/* and turns/* are logged, validation runs the environment too, and the workers' folder is
gone after close. Then the start-up refusals of the new keys, one line each."""

import hashlib
import os
import re

import mindspore as ms
import numpy as np
import pytest

from mindgrpo.config import ConfigError, GRPOConfig, load_config
from mindgrpo.grpo import builder
from mindgrpo.grpo.conversations import ENVIRONMENT_COLUMNS, build_conversations
from mindgrpo.rewards import RewardError
from mindgrpo.utils.progress import Progress

from fakes import RecordingLog, one_layer_micro  # tests/grpo is on sys.path under pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(REPO, "model_configs", "qwen_grpo", "tiny_tools", "tokenizer_config.json")
G, LOW, HIGH, INVALID, WEIGHT = 4, 1, 3, -1.0, 2.0
# many stop ids, so that the micro model's random turns end early and the game answers them
STOPS = list(range(3, 200))
ENV = ["generate_config.environment=guess_number", "generate_config.tool_num_workers=1",
       f"generate_config.environment_settings={{low: {LOW}, high: {HIGH}, invalid_reward: {INVALID}}}",
       f"generate_config.chat_template={TEMPLATE}", "generate_config.max_turns=2",
       "generate_config.tool_response_max_tokens=32"]
MICRO = ["rl_config.batch_size=2", f"rl_config.num_generations={G}", "actor_config.micro_batch_size=8",
         "generate_config.max_tokens=8", "generate_config.max_prompt_length=160", "generate_config.max_num_seqs=8",
         f"generate_config.stop_token_ids={STOPS}", "synthetic_config.template=raw", "rl_config.val_interval=0",
         "rl_config.val_size=2", "rl_config.completions_interval=0", "rl_config.max_steps=1",
         "reward_config.num_workers=0", "rl_config.adv_estimator=dr_grpo",
         "reward_config.verifier_function=[environment]", f"reward_config.verifier_weight=[{WEIGHT}]", *ENV]
NUMBER = re.compile(r"-?\d+")


def model_turns(c, stops):
    """The model's turns of a trajectory: ids of each run of model_mask, the stop id that ended it left out."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], c.model_mask.astype(int), [0]])))
    turns = [c.token_ids[a:b] for a, b in zip(edges[::2], edges[1::2])]
    return [t[:-1] if t and t[-1] in stops else t for t in turns]


def game(prompt, texts):
    """guess_number's rules, written again: the secret from sha256 of seed 0 and the prompt; each turn's last whole
    number outside <think> a guess (none: INVALID), the right one scores 1 and ends the game. The summed reward."""
    secret = LOW + int.from_bytes(hashlib.sha256(f"0\0{prompt}".encode()).digest()[:8], "big") % (HIGH - LOW + 1)
    total = 0.0
    for text in texts:
        numbers = NUMBER.findall(re.sub(r"<think>.*?</think>", "", text, flags=re.S))
        if not numbers:
            total += INVALID
        elif int(numbers[-1]) == secret:
            return total + 1.0
    return total


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    out = tmp_path_factory.mktemp("env_run")
    model = one_layer_micro(out)
    with open(model) as f:  # room for the game's prompt, 8 tokens of the model's and two user turns
        text = f.read().replace("max_position_embeddings: 256", "max_position_embeddings: 320")
    with open(model, "w") as f:
        f.write(text)
    cfg = load_config(GRPOConfig, None, MICRO + [f"actor_config.model={model}", f"rl_config.output_dir={out}"])
    parts = builder.build(cfg, builder.Paths(output_dir=str(out)))
    trainer = builder.make_trainer(cfg, parts, RecordingLog(), Progress(1), str(out))
    seen = {}
    collect, update = trainer.collect, trainer.update

    def keep_rollouts():
        seen["rollouts"], metrics = collect()
        return seen["rollouts"], metrics

    def keep_experience(exp):
        seen["experience"] = exp
        return update(exp)

    trainer.collect, trainer.update = keep_rollouts, keep_experience
    conv = parts.conversations
    conv.start()
    try:
        metrics = trainer.train_step()
        val = trainer.validate()
        root = conv.turns.pool.root
    finally:
        conv.close()
        ms.set_context(mode=previous)
    yield dict(parts=parts, trainer=trainer, metrics=metrics, val=val, root=root, **seen)


@pytest.mark.slow  # a build, one step's rollout (append graphs), update and a validation: ~1 min under load
def test_a_step_with_an_environment(step):
    parts, r, exp, metrics = step["parts"], step["rollouts"], step["experience"], step["metrics"]
    tok, stops = parts.tokenizer, step["trainer"].stop_ids
    assert parts.conversations.kind == "environment"
    # the prompts are the environment's: its reset of each row's question, in the chat template's user turn
    for c, ids, question in zip(r.completions, r.prompt_ids, r.columns["prompt"]):
        assert tok.decode(ids) == ("<|im_start|>user\n" + question + f"\nI am thinking of a whole number from {LOW} "
                                   f"to {HIGH}. Guess it: answer with one number; I will say higher or lower."
                                   "<|im_end|>\n<|im_start|>assistant\n")
    # observations: the game's answers as the template's user turns, out of the loss mask; every model turn played
    answers = {"Higher.", "Lower.", "Answer with one whole number."}
    masked = 0
    for i, c in enumerate(r.completions):
        n = len(c.token_ids)
        np.testing.assert_array_equal(exp.mask[i, :n] > 0, c.model_mask)
        assert exp.mask[i, n:].sum() == 0
        others = tok.decode([t for t, own in zip(c.token_ids, c.model_mask) if not own])
        said = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", others)
        assert len(said) == c.turns and set(said) <= answers, others
        masked += int((~c.model_mask).sum())
        texts = [tok.decode(t) for t in model_turns(c, stops)]
        assert r.columns["env_reward"][i] == pytest.approx(game(r.columns["prompt"][i], texts)), texts
        assert len(r.columns["messages"][i]) == 1 + len(texts) + c.turns  # the first user turn, then the turns
    assert masked > 0 and sum(c.turns for c in r.completions) >= 2
    # the environment reward, weighted, is the total; dr_grpo: r - its group's mean, in the update's experience
    env = np.array(r.columns["env_reward"], np.float32)
    np.testing.assert_allclose(r.per_function["environment"], env)
    np.testing.assert_allclose(r.rewards, WEIGHT * env)
    grouped = (WEIGHT * env).reshape(-1, G)
    assert np.ptp(grouped, axis=1).max() > 0  # the step had something to learn from
    np.testing.assert_allclose(exp.advantages, (grouped - grouped.mean(1, keepdims=True)).reshape(-1), atol=1e-6)
    assert metrics["grad_norm"] > 0
    # the metrics: the environment's and the turns'
    assert metrics["env/reward_mean"] == pytest.approx(env.mean())
    assert metrics["env/steps_mean"] == pytest.approx(np.mean([len(model_turns(c, stops)) for c in r.completions]))
    assert metrics["env/errors"] == metrics["env/timeouts"] == 0
    assert metrics["turns/mean"] == pytest.approx(np.mean([c.turns for c in r.completions]))
    assert metrics["turns/masked_fraction"] == pytest.approx(masked / sum(len(c.token_ids) for c in r.completions))
    assert "tool/samples_with_calls" not in metrics
    # validation ran the environment (finish included) and the workers' folder went with close()
    assert "val/env/reward_mean" in step["val"] and step["val"]["val/env/steps_mean"] >= 1
    assert not os.path.exists(step["root"])


# ------------------------------------------------------------------------------------------- start-up refusals


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from mindgrpo.data.synthetic import ensure_tiny_tokenizer

    return ensure_tiny_tokenizer(str(tmp_path_factory.mktemp("tiny") / "tokenizer"))


@pytest.mark.parametrize("extra, key, words", [
    (["generate_config.environment=chess"], "generate_config.environment",
     "names unknown environment 'chess'; registered: "),
    (["generate_config.environment_settings={highest: 5}"], "generate_config.environment_settings",
     "environment 'guess_number' has no setting(s) ['highest']; valid: "),
    (["generate_config.environment_plugin=PLUGIN"], "generate_config.environment_plugin",
     "broken_envs.py: RuntimeError: no environment today"),
])
def test_environment_refusals_name_their_key(tokenizer, tmp_path, extra, key, words):
    plugin = tmp_path / "broken_envs.py"
    plugin.write_text("raise RuntimeError('no environment today')\n")
    cfg = load_config(GRPOConfig, None, ENV + [e.replace("PLUGIN", str(plugin)) for e in extra])
    with pytest.raises(ConfigError) as info:
        build_conversations(cfg, tokenizer, TEMPLATE)
    assert info.value.key == key and words in info.value.message and "\n" not in str(info.value), str(info.value)


def test_the_environment_reward_needs_an_environment():
    """The `environment` reward reads env_reward, which only an environment's conversations give: refused at
    start-up otherwise (the builder checks the reward set's columns)."""
    cfg = load_config(GRPOConfig, None, ["reward_config.verifier_function=[environment]",
                                         "reward_config.verifier_weight=[1.0]", "reward_config.num_workers=0"])
    rewards = builder.build_rewards(cfg)
    dataset = ["prompt", "solution", "answer", "completion_length"]
    with pytest.raises(RewardError, match=r"reward 'environment' needs the column\(s\) \['env_reward'\]"):
        rewards.check_columns(dataset + ["tool_calls", "messages"], "the training prompts")
    rewards.check_columns(dataset + list(ENVIRONMENT_COLUMNS), "the training prompts")


def test_a_token_budget_must_hold_the_longest_conversation():
    """actor_config.max_tokens_per_micro_batch holds the longest trajectory: 160 prompt + 8 + 2 turns of 48 = 264,
    rounded up to 288 (the config's own check counts prompt + max_tokens only: 192)."""
    from mindgrpo.models.config import Qwen2Config

    mcfg = Qwen2Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=320)
    for budget, refused in ((256, True), (288, False)):
        cfg = load_config(GRPOConfig, None, MICRO + [f"actor_config.max_tokens_per_micro_batch={budget}"])
        if refused:
            with pytest.raises(ConfigError) as info:
                builder.check_conversation_limits(cfg, mcfg, "micro", 2 * 48)
            assert info.value.key == "actor_config.max_tokens_per_micro_batch"
            assert "= 288 tokens, got 256" in info.value.message, str(info.value)
        else:
            builder.check_conversation_limits(cfg, mcfg, "micro", 2 * 48)
