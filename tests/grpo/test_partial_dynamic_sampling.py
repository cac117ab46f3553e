"""Dynamic sampling (rl_config.dynamic_sampling) with partial rollouts (generate_config.partial_rollout) in one
process: a step's rollout is rounds, each a partial rollout of the groups still needed; the groups without a spread
of rewards are dropped (their prompts spent), the carried samples go on. A scripted engine and reward stand in for
the model (test_dynamic_sampling.py's), so the rounds, the carried samples and the prompts can be followed exactly;
the run is stopped and resumed through a checkpoint folder's in_flight.json."""

import numpy as np

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.grpo.partial import PartialRollouts
from mindgrpo.grpo.trainer import GRPOTrainer, rollout_seed
from mindgrpo.inference.engine import Completion
from mindgrpo.memory.swap import SwapManager
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.utils.progress import Progress
from mindgrpo.grpo.prompts import PromptSource
from test_dynamic_sampling import G, Log, Rewards, Tok

BATCH, STEPS, STOP = 3, 6, 1


def right(k: int) -> list:
    """Prompt k's samples: right (answer k) or wrong (k + 1). Multiples of 4 and k = 2 mod 4 (even): one right of G,
    a spread; odd prompts: all wrong, no spread (dropped)."""
    return [j == 0 and k % 2 == 0 for j in range(G)]


class PartialScriptedEngine:
    """A fresh sample's first token is its answer; in a call with min_groups (a partial rollout's fresh prompts)
    the last sample of every prompt k = 0 mod 3 stops after that token ("partial"), the others end with STOP. A
    continuation (n = 1) ends its sample with STOP. Records each call's (first tokens of its prompts, n, seed)."""

    def __init__(self):
        self.calls, self.version, self.last_stats = [], 0, {"new_tokens": 0, "tokens_per_s": 1.0}

    def next_round(self, count):
        return count

    def generate(self, prompts, params, max_tokens=None, prompt_index=None, min_groups=None):
        self.calls.append(([p[0] for p in prompts], params.n, params.seed))
        out = []
        for i, p in enumerate(prompts):
            for j in range(params.n):
                if params.n == 1:
                    toks, reason = [STOP], "stop"
                else:
                    first = p[0] if right(p[0])[j] else p[0] + 1
                    cut = min_groups is not None and p[0] % 3 == 0 and j == params.n - 1
                    toks, reason = ([first], "partial") if cut else ([first, STOP], "stop")
                out.append(Completion(i, toks, reason, np.zeros(len(toks), np.float32),
                                      np.zeros(len(toks), np.float32), None, 0,
                                      np.full(len(toks), self.version, np.int64)))
        self.last_stats = {"new_tokens": sum(len(c.token_ids) for c in out), "tokens_per_s": 1.0}
        return out


def prompts(n: int = 200) -> PromptSource:
    """Prompts 10, 11, ... in order (more than the run draws: no second epoch), prompt k's solution "k"."""
    data = {"prompt_ids": [np.array([k]) for k in range(10, 10 + n)], "prompt_length": [1] * n,
            "solution": [str(k) for k in range(10, 10 + n)], "answer": [""] * n, "prompt": [""] * n}
    return PromptSource(data, seed=0, shuffle=False)


def make_trainer(dynamic_sampling=True):
    cfg = from_dict(GRPOConfig, {"rl_config": dict(batch_size=BATCH, num_generations=G, off_policy_steps=1,
                                                   dynamic_sampling=dynamic_sampling, max_resample_times=3),
                                 "generate_config": {"partial_rollout": True, "max_tokens": 5},
                                 "actor_config": {"micro_batch_size": 4}})
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    engine = PartialScriptedEngine()
    trainer = GRPOTrainer(cfg, policy=lm, inference=object(), reference=None, engine=engine, sync=None,
                          ref_sync=None, memory=SwapManager(enabled=False), rewards=Rewards(), tokenizer=Tok(),
                          train_prompts=prompts(), val_prompts=None, metrics_log=Log(), progress=Progress(1),
                          output_dir="unused")
    return trainer, engine


def steps(trainer, engine, last, trained, metrics):
    """Steps up to `last` (counted from 1): each one's trained prompts (by their solution column) and metrics."""
    while trainer.step < last:
        engine.version = trainer.step
        r, m = trainer.collect()
        trainer.step += 1
        trained[trainer.step] = ([int(s) for s in r.batch.columns["solution"]], r.rewards.reshape(-1, G))
        metrics[trainer.step] = m


def test_rounds_of_partial_rollouts_keep_groups_with_a_spread_and_spend_the_others(tmp_path):
    trainer, engine = make_trainer()
    trained, metrics = {}, {}
    steps(trainer, engine, 2, trained, metrics)
    saved_prompts = trainer.train_prompts.state()
    trainer.partial.write(str(tmp_path))  # the checkpoint's in_flight.json
    saved_calls = len(engine.calls)
    steps(trainer, engine, STEPS, trained, metrics)
    in_flight_end = {int(g.columns["solution"]) for g in trainer.partial.groups}
    drawn = trainer.partial.drawn
    assert trainer.train_prompts.state() == {"epoch": 0, "index": drawn}

    # what the run did, from its metrics: several rounds in a step, samples carried and continued
    assert any(m["dynamic_sampling/rounds"] > 1 for m in metrics.values())
    assert any(m["partial/continued_samples"] > 0 for m in metrics.values())
    assert any(m["partial/carried_samples"] > 0 for m in metrics.values())
    for step, (ks, rewards) in trained.items():
        m = metrics[step]
        assert len(ks) == BATCH, step  # every step trains batch_size groups
        kept = int(m["dynamic_sampling/kept_groups"])
        assert kept == BATCH, step  # the rounds always found enough here
        assert (rewards[:kept].std(-1) > 0).all(), step  # kept groups have a spread
        assert all(k % 2 == 0 for k in ks), step
    # the seeds: round r's fresh prompts rollout_seed(.., 2r), its continuations (.., 2r + 1); the first round's
    # those of a run without dynamic sampling
    seeds = {rollout_seed(trainer.sample_seed, s, r): (s, r) for s in range(STEPS) for r in range(8)}
    rounds_seen = [(n, seeds[seed]) for _, n, seed in engine.calls]  # KeyError: a seed of no step's round
    assert all((n == G) == (r % 2 == 0) for n, (_, r) in rounds_seen)
    assert max(r for _, (_, r) in rounds_seen) >= 2  # a further round's fresh prompts
    # every prompt drawn (10, 11, ...: the data's order) trained once, spent (no spread) or still in flight
    whole = [k for step in sorted(trained) for k in trained[step][0]]
    assert len(set(whole)) == len(whole)
    spent = set(range(10, 10 + drawn)) - set(whole) - in_flight_end
    assert all(k % 2 for k in spent) and not (set(whole) & in_flight_end)
    assert set(whole) | spent | in_flight_end == set(range(10, 10 + drawn))

    # stopped after step 2 and resumed from its checkpoint: the same steps (prompts, rewards, metrics, calls)
    again, engine2 = make_trainer()
    again.train_prompts.load_state(saved_prompts)
    again.partial = PartialRollouts(G, 5)
    again.partial.read(str(tmp_path))
    assert again.partial.groups  # groups in flight across the stop
    again.step = 2
    resumed, resumed_metrics = {}, {}
    steps(again, engine2, STEPS, resumed, resumed_metrics)
    for step in range(3, STEPS + 1):
        assert resumed[step][0] == trained[step][0], step
        np.testing.assert_array_equal(resumed[step][1], trained[step][1])
        assert resumed_metrics[step] == metrics[step], step
    assert engine2.calls == engine.calls[saved_calls:]
    assert again.partial.drawn == drawn


def test_without_dynamic_sampling_a_step_is_one_partial_rollout():
    trainer, engine = make_trainer(dynamic_sampling=False)
    r, m = trainer.collect()
    # 3 groups needed, 6 prompts admitted; 12 and 15 leave a sample unfinished: one call, round 0's seed
    assert engine.calls == [([10, 11, 12, 13, 14, 15], G, rollout_seed(trainer.sample_seed, 0, 0))]
    assert [int(s) for s in r.batch.columns["solution"]] == [10, 11, 13]
    assert "dynamic_sampling/rounds" not in m and m["partial/carried_groups"] == 3.0
