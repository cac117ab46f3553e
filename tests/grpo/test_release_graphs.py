"""rl_config.release_graphs: each phase's compiled graphs (the engine's, the reference and old-log-prob
scorers', the update's) are dropped when the phase ends and compiled again at the next step, and the gradient
accumulators are shrunk between updates; the run's
metrics, weights and optimizer state are those of a run that keeps them, bit for bit. A tiny model
with a stand-in engine, so the graphs are the trainer's scoring and training graphs."""

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.grpo.prompts import PromptSource
from mindgrpo.grpo.trainer import GRPOTrainer
from mindgrpo.inference.engine import Completion
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.progress import Progress
from fakes import RecordingLog

pytestmark = pytest.mark.usefixtures("graph_mode")  # tests/grpo/conftest.py

CFG = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64)
G, STEPS = 4, 2
# what differs between two runs of the same work: wall-clock figures and the host process's memory
TIMING = ("time/", "perf/", "seconds", "tokens_per_s", "memory/host_")


class Engine:
    """Random completions of a seeded length; counts its releases."""

    last_stats = {"new_tokens": 0, "tokens_per_s": 0.0}

    def __init__(self):
        self.releases = 0

    def generate(self, prompts, params):
        rng = np.random.default_rng(params.seed)
        return [Completion(i, list(rng.integers(2, 64, 2 + (i + j) % 4)), "stop")
                for i in range(len(prompts)) for j in range(G)]

    def release(self):
        self.releases += 1


class Tok:
    pad_token_id, stop_token_ids = 0, [1]

    def decode_batch(self, ids, skip_special_tokens=True):
        return [" ".join(map(str, t)) for t in ids]


def rewards(completions, **columns):
    r = np.array([len(c) % 5 for c in completions], np.float32)  # a spread within groups: non-zero advantages
    return r, {"length": r}, {}


class Saves:
    root = "unused"

    def save(self, step, groups, state, model_config):
        pass


def run(release: bool, layerwise: bool = False):
    """STEPS steps with beta > 0 (reference scoring) and two updates per rollout (old log-probs scored);
    layerwise: actor_config.layerwise_update and ref_config.layerwise on."""
    cfg = from_dict(GRPOConfig, {"rl_config": dict(batch_size=2, num_generations=G, max_steps=STEPS, beta=0.04,
                                                   num_iterations=2, release_graphs=release,
                                                   # in-process: no restart in a fresh process (grpo/recycle.py)
                                                   **({"restart_on_memory_growth": 0.0} if release else {})),
                                 "actor_config": {"micro_batch_size": 4, "lr": 1e-2, "layerwise_update": layerwise},
                                 "ref_config": {"layerwise": layerwise}})
    data = {"prompt_ids": [np.array([k, k + 1]) for k in range(10, 30)], "prompt_length": [2] * 20,
            "solution": [""] * 20, "answer": [""] * 20, "prompt": [""] * 20}
    lm, ref = Qwen2ForCausalLM(CFG, seed=1), Qwen2ForCausalLM(CFG, seed=1)
    for p in ref.get_parameters():
        p.requires_grad = False
    log, engine = RecordingLog(), Engine()
    t = GRPOTrainer(cfg, policy=lm, inference=lm, reference=ref, engine=engine, sync=lambda: {}, ref_sync=None,
                    memory=SwapManager(enabled=False), rewards=rewards, tokenizer=Tok(),
                    train_prompts=PromptSource(data, seed=0), val_prompts=None, metrics_log=log,
                    progress=Progress(STEPS), output_dir="unused", checkpoints=Saves())
    t.fit()
    weights = {p.name: p.asnumpy().copy() for p in lm.get_parameters()}
    moments = {p.name: p.asnumpy().copy() for p in t.updater.state_parameters()}
    return t, log.rows, weights, moments


@pytest.mark.slow  # issue 18: over 30 s under -n 2 at load 6 (the -m "not slow" loop of 2026-11-26)
@pytest.mark.parametrize("layerwise", [False, True], ids=["whole", "layerwise"])
def test_released_graphs_give_the_same_run(layerwise):
    """With the layerwise switches (actor_config.layerwise_update, ref_config.layerwise) too: the layerwise
    optimizer's group graphs are released with the updater's."""
    kept, released = run(False, layerwise), run(True, layerwise)
    t_kept, t_released = kept[0], released[0]
    # the switch reached every phase: released after each step (and compiled again for the next one)
    assert t_released.engine.releases == STEPS and t_kept.engine.releases == 0
    assert t_released.updater.step_graph is None and t_kept.updater.step_graph is not None
    if layerwise:  # the layerwise optimizer's group graphs go with the updater's
        assert not t_released.updater.adamw.adam_graphs and t_kept.updater.adamw.adam_graphs
    assert t_released.ref_scorer.graph is None and t_kept.ref_scorer.graph is not None
    # the gradient accumulators shrink to one element after a step's updates (remade as zeros by the next step's
    # first update; the run's numbers above are the kept run's bit for bit)
    bufs_released, bufs_kept = t_released.updater.buffer.bufs, t_kept.updater.buffer.bufs
    assert all(b.size == 1 for b in bufs_released) and all(b.shape == p.shape for b, p in
                                                           zip(bufs_kept, t_kept.updater.params))
    assert t_released.old_scorer.graph is None and t_kept.old_scorer.graph is not None
    rows_kept, rows_released = kept[1], released[1]
    assert sorted(rows_kept) == sorted(rows_released) == list(range(1, STEPS + 1))
    for step in rows_kept:
        a, b = rows_kept[step], rows_released[step]
        assert a.keys() == b.keys()
        same = {k: a[k] for k in a if not any(s in k for s in TIMING)}
        assert same == {k: b[k] for k in same}, step
        assert a["grad_norm"] > 0 and a["kl"] != 0  # the comparison covers a real update and the reference
    for name, w in kept[2].items():
        np.testing.assert_array_equal(released[2][name], w, err_msg=name)
    start = {p.name: p.asnumpy() for p in Qwen2ForCausalLM(CFG, seed=1).get_parameters()}
    assert any(not np.array_equal(w, start[name]) for name, w in kept[2].items())  # the weights moved
    for name, m in kept[3].items():
        np.testing.assert_array_equal(released[3][name], m, err_msg=name)
