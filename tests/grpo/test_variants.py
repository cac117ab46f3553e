"""One GRPO step of every policy loss and advantage estimator on a micro model, in one process: the
parts (models, engine, rewards, prompts) are built once by the trainer's builder, and each policy
loss gets its own trainer (its own loss graph, about 8 CPU-seconds to compile) over them; the
advantage estimators, computed on the host before the graph, share one of those trainers. gspo runs
with top_entropy_quantile (one graph for both); ppo_clip, the default, is the loss of every other
trainer test (test_trainer_run.py, test_bad_steps.py, ...). A dense reward (the text's length)
gives every group a spread, so the advantages and the gradient are not zero."""

import math
import os
from dataclasses import replace

import mindspore as ms
import pytest

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.grpo import algos, builder
from mindgrpo.utils.progress import Progress

HERE = os.path.dirname(os.path.abspath(__file__))
MICRO = ["rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=4",
         "generate_config.max_tokens=8", "synthetic_config.template=raw", "actor_config.lr=1e-3",
         "rl_config.val_interval=0", "rl_config.completions_interval=0", "rl_config.swap=false",
         "rl_config.max_steps=1", "reward_config.num_workers=0",
         f"reward_config.reward_plugin={os.path.join(HERE, 'text_length_reward.py')}",
         "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]"]

LOSSES = [{"policy_loss": "gspo", "top_entropy_quantile": 0.5}] \
    + [{"policy_loss": name} for name in algos.POLICY_LOSSES.names() if name not in ("ppo_clip", "gspo")]
VARIANTS = LOSSES + [{"policy_loss": "sapo", "adv_estimator": name} for name in algos.ADVANTAGES.names()
                     if name != "grpo"]


class NoLog:
    def log_completions(self, step, rows):
        pass


@pytest.fixture(scope="module")
def trainer_for(tmp_path_factory):
    """variant -> a trainer built for it, over the same parts; one per loss graph."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    out = tmp_path_factory.mktemp("variants")
    # micro_qwen2.yaml with one layer: each loss graph compiles in 0.6x the CPU time of two layers
    with open(os.path.join(HERE, "micro_qwen2.yaml")) as f:
        text = f.read().replace("num_hidden_layers: 2", "num_hidden_layers: 1")
    assert "num_hidden_layers: 1" in text
    model = out / "micro_one_layer.yaml"
    model.write_text(text)
    base = load_config(GRPOConfig, None, MICRO + [f"actor_config.model={model}", f"rl_config.output_dir={out}"])
    parts = builder.build(base, builder.Paths(output_dir=str(out)))
    trainers = {}

    def get(variant):
        cfg = replace(base, rl_config=replace(base.rl_config, **variant))
        graph = (cfg.rl_config.policy_loss, cfg.rl_config.top_entropy_quantile)
        if graph not in trainers:
            trainers[graph] = builder.make_trainer(cfg, parts, NoLog(), Progress(1), str(out))
        trainers[graph].cfg = cfg  # the advantage estimator is read at each step
        return trainers[graph]

    yield get
    ms.set_context(mode=previous)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v}" for k, v in v.items()))
def test_one_step(trainer_for, variant):
    m = trainer_for(variant).train_step()
    for key in ("loss", "pg_loss", "entropy", "clipfrac", "nll", "grad_norm", "reward_mean",
                "advantage/advantage_abs_mean"):
        assert key in m and math.isfinite(m[key]), key
    assert m["grad_norm"] > 0 and m["advantage/advantage_abs_mean"] > 0
    # this engine gives no rollout log-probs: no mismatch metrics, no correction
    assert not any(k.startswith(("mismatch/", "rollout_correction/")) for k in m)
