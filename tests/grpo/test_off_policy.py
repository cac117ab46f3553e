"""Off-policy steps (rl_config.off_policy_steps, mindgrpo/grpo/off_policy.py): the engine's weights lag the policy's
by k updates. A run of three steps with k = 1 against a replay: a fresh engine given the weights of update s - 2
(saved here before each step, not by the code under test) draws exactly step s's samples, with the same seeds and
the same call history; each token is stamped with the version that sampled it; the staleness metrics count the
updates between sampling and training; tis_token weighs each token by the current policy's log-prob (the update's
own, computed here by transformers from the weights before the update) against the sampling version's (the
engine's). Staleness past the bound drops samples from the loss."""

import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.grpo import builder
from mindgrpo.grpo.off_policy import LaggedSync, sample_versions, staleness
from mindgrpo.models.convert import ms_to_hf_name
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.parallel.weight_sync import named_parameters
from mindgrpo.utils.progress import Progress

from fakes import RecordingLog, StepRecorder, one_layer_micro  # tests/grpo is on sys.path under pytest
from test_one_copy import assert_same_completions

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3
THRESHOLD = 2.0
# as test_one_copy.py (a dense reward: every group has a spread, so every step moves the weights), one micro-batch
CONFIG = ["rl_config.batch_size=2", "rl_config.num_generations=4", "actor_config.micro_batch_size=8",
          "generate_config.max_tokens=8", "generate_config.max_prompt_length=32", "generate_config.max_num_seqs=8",
          "synthetic_config.template=raw", "actor_config.lr=1e-2", "rl_config.val_interval=0",
          "rl_config.completions_interval=0", f"rl_config.max_steps={STEPS}", "reward_config.num_workers=0",
          f"reward_config.reward_plugin={os.path.join(HERE, 'text_length_reward.py')}",
          "reward_config.verifier_function=[test_text_length]", "reward_config.verifier_weight=[1.0]",
          "rl_config.memory=speed", "rl_config.off_policy_steps=1", "rl_config.rollout_correction=tis_token",
          f"rl_config.rollout_correction_threshold={THRESHOLD}"]


# ---------------------------------------------------------------------------------------------- by hand
def test_staleness_by_hand():
    oldest = sample_versions([np.array([3, 3]), np.array([1, 2, 3]), np.array([], np.int64), np.array([0])])
    assert oldest[:2].tolist() == [3, 1] and oldest[3] == 0  # the empty sample: never stale
    keep, m = staleness(oldest, current=3, bound=2)
    assert keep.tolist() == [True, True, True, False]  # 0, 2, 0 and 3 updates stale
    assert m == {"staleness/mean": 5 / 4, "staleness/max": 3.0, "staleness/dropped": 1.0}
    assert sample_versions([np.array([0]), None]) is None  # an engine that stamps nothing: no staleness


class CountingSync:
    def __init__(self, param):
        self.param, self.seen = param, []

    def __call__(self):
        self.seen.append(float(self.param.asnumpy()[0]))
        return {"sync/seconds": 0.0}


class OneParam:
    def __init__(self):
        self.p = ms.Parameter(Tensor(np.zeros(2, np.float32)), name="w")
        self.frozen = ms.Parameter(Tensor(np.zeros(1, np.float32)), name="f", requires_grad=False)

    def get_parameters(self):
        return iter([self.p, self.frozen])


@pytest.mark.parametrize("lag", [1, 2])
def test_lagged_sync_gives_the_version_lag_updates_back_and_leaves_the_policy_as_it_was(lag):
    model = OneParam()
    sync = CountingSync(model.p)
    lagged = LaggedSync(sync, model, lag)
    assert [p.name for p in lagged.params] == ["w"]  # trained parameters only
    synced = []
    for version in range(1, 6):
        model.p.set_data(Tensor(np.full(2, version, np.float32)))  # update `version`: the weights hold its number
        _, v = lagged(version)
        synced.append(v)
        assert model.p.asnumpy().tolist() == [version, version]  # the policy back as the update left it
        assert len(lagged.copies) <= lag + 1
    assert synced == [max(0, v - lag) for v in range(1, 6)]
    assert sync.seen == [float(v) for v in synced]  # what the sync read from the policy: that version's weights
    model.p.set_data(Tensor(np.full(2, 9, np.float32)))
    lagged.restart(9)  # a resume: the restored weights are the oldest at hand
    model.p.set_data(Tensor(np.full(2, 10, np.float32)))
    assert lagged(10)[1] == 9 and sync.seen[-1] == 9.0


# ---------------------------------------------------------------------------------------------- a run
def hf_token_logprobs(weights, config, exp, temperature):
    """(B, R) log-probs of the labels under softmax(logits / T) by transformers, given our weights by name."""
    import torch
    import transformers

    hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config.to_hf_dict())).eval()
    state = {ms_to_hf_name(n): torch.tensor(w) for n, w in weights.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    lengths = exp.prompt_lens + exp.response_lens
    attention = (np.arange(exp.input_ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor(exp.input_ids, dtype=torch.long),
                    attention_mask=torch.tensor(attention)).logits.double() / temperature
    logp = torch.log_softmax(logits, -1).numpy()  # (B, S, V)
    rows = np.arange(len(exp))[:, None]
    return logp[rows, exp.score_pos, exp.labels] * exp.mask


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three steps with off_policy_steps 1, recording before each step the policy's weights (version = steps done)
    and in it the rollouts (prompts, seed, samples), the experience trained on and the metrics."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    out = tmp_path_factory.mktemp("off_policy")
    cfg = load_config(GRPOConfig, None, CONFIG + [f"actor_config.model={one_layer_micro(out)}",
                                                  f"rl_config.output_dir={out}"])
    parts = builder.build(cfg, builder.Paths(output_dir=str(out)))
    trainer = builder.make_trainer(cfg, parts, RecordingLog(), Progress(1), str(out))
    rec = {"weights": [], "rollouts": [], "exps": [], "metrics": [], "engine_version": []}
    rollout, update = trainer.rollout, trainer.update

    def recorded_rollout(batch, seed):
        r = rollout(batch, seed)
        rec["rollouts"].append((batch.ids, seed, r))
        return r

    def recorded_update(exp):
        rec["exps"].append(exp)
        return update(exp)

    trainer.rollout, trainer.update = recorded_rollout, recorded_update
    for _ in range(STEPS):
        rec["weights"].append({n: p.asnumpy().copy() for n, p in named_parameters(parts.policy).items()})
        rec["metrics"].append(trainer.train_step())
        trainer.step += 1
        rec["engine_version"].append(parts.engine.version)
    yield dict(cfg=cfg, parts=parts, trainer=trainer, **rec)
    ms.set_context(mode=previous)


@pytest.mark.slow  # a run and a replay engine: about a minute of compiling under load
def test_the_samples_of_step_s_are_those_of_update_s_minus_2_replayed(run):
    parts, cfg = run["parts"], run["cfg"]
    assert parts.inference is not parts.policy  # the lag needs a copy of its own
    assert run["engine_version"] == [0, 1, 2]  # after update s: version s - 1
    policy = parts.policy
    model = Qwen2ForCausalLM(policy.config, seed=cfg.rl_config.seed + 7, max_positions=int(policy.rope_cos.shape[0]))
    params = named_parameters(model)
    engine = builder.build_engine(cfg, model, parts.tokenizer.pad_token_id)
    trainer = run["trainer"]

    def replay(version, step):
        for name, w in run["weights"][version].items():
            params[name].set_data(Tensor(w))
        prompts, seed, _ = run["rollouts"][step]
        return engine.generate(prompts, trainer.sampling(cfg.rl_config.num_generations, seed))

    # the same calls in the same order as the run's engine made (bit-for-bit engines: DEVELOPERS.md)
    for step, version in enumerate([0, 0, 1]):  # step s + 1 samples with update max(0, s - 1)
        samples = run["rollouts"][step][2].completions
        assert_same_completions(samples, replay(version, step), f"step {step + 1}")
        assert all(c.versions.tolist() == [version] * len(c.token_ids) for c in samples)
    # the latest weights would have drawn other samples: the replay tells the versions apart
    fresh = replay(2, 2)
    assert any(a.token_ids != b.token_ids or a.logprobs.tobytes() != b.logprobs.tobytes()
               for a, b in zip(run["rollouts"][2][2].completions, fresh))


@pytest.mark.slow
def test_staleness_metrics_and_tis_token_against_the_sampling_version(run):
    m = run["metrics"]
    assert [x["staleness/mean"] for x in m] == [0.0, 1.0, 1.0]
    assert [x["staleness/max"] for x in m] == [0.0, 1.0, 1.0]
    assert [x["staleness/dropped"] for x in m] == [0.0, 0.0, 0.0]
    exp, cfg, policy = run["exps"][2], run["cfg"], run["parts"].policy
    temperature = cfg.generate_config.temperature
    # step 3 trains update 3 on samples of version 1; the policy before it is version 2 (the weights before step 3)
    current = hf_token_logprobs(run["weights"][2], policy.config, exp, temperature)
    sampled_by = hf_token_logprobs(run["weights"][1], policy.config, exp, temperature)
    mask = exp.mask > 0

    def weights(old):
        return np.minimum(np.exp((old - exp.sampling_logp) * exp.mask), THRESHOLD)[mask]

    # the engine's log-probs are the sampling version's (top-k / top-p off: the sampled distribution is softmax/T)
    np.testing.assert_allclose(exp.sampling_logp[mask], sampled_by[mask], atol=2e-5)
    w = weights(current)
    assert abs(w.mean() - weights(sampled_by).mean()) > 1e-3  # the two versions' weights differ: the check can fail
    assert m[2]["rollout_correction/weight_mean"] == pytest.approx(w.mean(), rel=1e-4)
    assert m[2]["rollout_correction/weight_max"] == pytest.approx(w.max(), rel=1e-4)


@pytest.mark.slow
def test_a_sample_staler_than_the_bound_is_dropped_from_the_loss(run):
    from dataclasses import replace

    trainer = run["trainer"]
    r = run["rollouts"][2][2]
    assert trainer.step == STEPS
    # before update 4 the policy is version 3: version 2 is one update stale (kept), version 1 two (dropped)
    old = [replace(c, versions=np.full(len(c.versions), STEPS - 1 if i != 5 else STEPS - 2))
           for i, c in enumerate(r.completions)]
    r.completions, kept = old, r.completions
    try:
        fresh, metrics = trainer.stale(r)
        exp = trainer.build_experience(r, np.ones(len(r), np.float32), fresh)
    finally:
        r.completions = kept
    assert fresh.tolist() == [i != 5 for i in range(len(r))]
    assert metrics["staleness/dropped"] == 1.0 and metrics["staleness/max"] == 2.0
    assert exp.mask[5].sum() == 0 and all(exp.mask[i].sum() > 0 for i in range(len(r)) if i != 5)


# ---------------------------------------------------------------------------------------------- partial rollouts
class RemoteSide:
    """The training rank's engine under a separate placement (parallel/separate.RemoteRollout) as the tests below
    fake it: its prompt check, one training rank before the rollout ranks, replicas of one rank."""

    def check_prompts(self, figures, prompts):
        from mindgrpo.parallel.separate import check_prompts

        check_prompts(figures, prompts, 1, 1)


class PartialEngine:
    """Prompt k's samples answer `k`; with min_groups, odd prompts' last sample stops after one token ("partial");
    a continuation (n = 1) ends its sample with its answer. Tokens are stamped with `version`."""

    def __init__(self):
        self.calls, self.version, self.last_stats = [], 0, {"new_tokens": 0}
        self.keys = []  # each call's random-stream keys (prompt_index; None: 0, 1, ...)

    def generate(self, prompts, params, max_tokens=None, prompt_index=None, min_groups=None):
        from mindgrpo.inference.engine import Completion

        self.calls.append(([list(p) for p in prompts], params.n, None if max_tokens is None else list(max_tokens),
                           min_groups))
        self.keys.append(list(range(len(prompts))) if prompt_index is None else [int(k) for k in prompt_index])
        out = []
        for i, p in enumerate(prompts):
            for j in range(params.n):
                if params.n == 1:  # a carried sample goes on: prompt = [k, its token]
                    toks, reason = [p[0]], "stop"
                elif p[0] % 2 and j == params.n - 1:
                    toks, reason = [p[0]], "partial"
                else:
                    toks, reason = [p[0], 1], "stop"
                out.append(Completion(i, toks, reason, np.zeros(len(toks), np.float32),
                                      np.zeros(len(toks), np.float32), None, 0,
                                      np.full(len(toks), self.version, np.int64)))
        self.last_stats = {"new_tokens": sum(len(c.token_ids) for c in out), "tokens_per_s": 1.0}
        return out


def test_partial_rollouts_carry_unfinished_samples_into_the_next_step():
    from mindgrpo.config.loader import from_dict
    from mindgrpo.grpo.prompts import PromptSource
    from mindgrpo.grpo.trainer import GRPOTrainer
    from mindgrpo.memory.swap import SwapManager
    from mindgrpo.models.config import Qwen2Config
    from test_dynamic_sampling import G, Log, Rewards, Tok

    cfg = from_dict(GRPOConfig, {"rl_config": dict(batch_size=2, num_generations=G, off_policy_steps=1),
                                 "generate_config": {"partial_rollout": True, "max_tokens": 5},
                                 "actor_config": {"micro_batch_size": 4}})
    data = {"prompt_ids": [np.array([k]) for k in range(10, 40)], "prompt_length": [1] * 30,
            "solution": [str(k) for k in range(10, 40)], "answer": [""] * 30, "prompt": [""] * 30}
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    engine = PartialEngine()
    trainer = GRPOTrainer(cfg, policy=lm, inference=object(), reference=None, engine=engine, sync=None,
                          ref_sync=None, memory=SwapManager(enabled=False), rewards=Rewards(), tokenizer=Tok(),
                          train_prompts=PromptSource(data, seed=0, shuffle=False), val_prompts=None,
                          metrics_log=Log(), progress=Progress(1), output_dir="unused")
    # step 1: 2 groups needed, 4 prompts admitted (10, 11, 12, 13); 11 and 13 leave a sample unfinished
    r, m = trainer.collect()
    assert [(c[1], c[3]) for c in engine.calls] == [(G, 2)] and [p[0] for p in engine.calls[0][0]] == [10, 11, 12, 13]
    assert r.batch.columns["solution"] == ["10", "12"] and len(r) == 2 * G
    assert m["partial/carried_groups"] == 2 and m["partial/carried_samples"] == 2
    assert m["partial/continued_samples"] == 0
    # step 2, weights of version 1: the two carried samples go on from their tokens, their groups complete: no
    # fresh prompt; their versions say which token came from which weights
    trainer.step, engine.version = 1, 1
    r, m = trainer.collect()
    prompts, n, left, _ = engine.calls[1]
    assert n == 1 and prompts == [[11, 11], [13, 13]] and left == [4, 4] and len(engine.calls) == 2
    assert r.batch.columns["solution"] == ["11", "13"] and m["partial/carried_groups"] == 0
    last = [c for c in r.completions if len(c.token_ids) == 2 and c.finish_reason == "stop"]
    assert [c.versions.tolist() for c in r.completions[G - 1::G]] == [[0, 1], [0, 1]]
    assert all(c.versions.tolist() == [0, 0] for c in r.completions if c not in r.completions[G - 1::G])
    assert len(last) == 2 * G
    fresh, stale = trainer.stale(r)
    assert fresh.all() and stale["staleness/max"] == 1.0  # the oldest token is one update old
    assert m["partial/continued_samples"] == 2
    # one update later (the engine one update behind, as off_policy_steps 1 runs it) these groups, begun in step 1's
    # rollout, are 2 updates stale: the default bound with partial rollouts (off_policy_steps + 1) trains them;
    # rl_config.max_staleness 1 drops every one of them
    from dataclasses import replace

    trainer.step = 2
    fresh, stale = trainer.stale(r)
    assert fresh.all() and stale["staleness/max"] == 2.0 and stale["staleness/dropped"] == 0.0
    trainer.cfg = replace(cfg, rl_config=replace(cfg.rl_config, max_staleness=1))
    fresh, stale = trainer.stale(r)
    assert not fresh.any() and stale["staleness/dropped"] == 2 * G


# ------------------------------------------------------------------------------- partial rollouts across a resume
@pytest.fixture(scope="module")
def partial_runs(run, tmp_path_factory):
    """Three steps with off_policy_steps 1 and partial rollouts, a checkpoint saved after step 1, then steps 2 and 3
    again from that checkpoint in a trainer whose groups in flight are a fresh process's (none). Each step's trained
    prompts and samples are recorded. A quarter of the vocabulary stops a sample and a slot freed takes the next
    sample (8 slots), so step 1 stops with samples part-way; the models and the engine are the `run` fixture's
    (its compiled engine graphs reused), the weights what its run left. lr 1e-12 moves the weights by about fp32's
    resolution, so the resumed run, whose engine gets the restored weights rather than the one-update-older ones the
    straight run's had (the lag starts again after a resume: docs/async.md), draws the straight run's tokens."""
    from mindgrpo.grpo.partial import PartialRollouts

    out = tmp_path_factory.mktemp("partial_resume")
    cfg = load_config(GRPOConfig, None, CONFIG + [
        f"actor_config.model={run['cfg'].actor_config.model}", f"rl_config.output_dir={out}",
        "actor_config.lr=1e-12", "generate_config.partial_rollout=true",
        f"generate_config.stop_token_ids=[{','.join(map(str, range(384, 512)))}]"])
    trainer = builder.make_trainer(cfg, run["parts"], RecordingLog(), Progress(3), str(out))
    trainer.sync_now()  # the engine from the policy as the `run` fixture left it, version 0
    recorder = StepRecorder(trainer, lambda r, m: (
        [tuple(p) for p in r.batch.ids],
        [(tuple(c.token_ids), c.finish_reason, c.logprobs.tolist(), c.versions.tolist()) for c in r.completions]))
    trained, steps = recorder.trained, recorder.steps
    steps(1)
    in_flight = [(tuple(g.prompt), [(list(c.token_ids), c.finish_reason, c.versions.tolist()) for c in g.samples])
                 for g in trainer.partial.groups]
    saved = trainer.save()
    steps(2)
    recorder.name = "resumed"
    trainer.partial = PartialRollouts(cfg.rl_config.num_generations, cfg.generate_config.max_tokens)
    trainer.resume(saved)
    steps(2)
    return dict(trained=trained, in_flight=in_flight, G=cfg.rl_config.num_generations, saved=saved)


@pytest.mark.slow  # three steps and two more on the `run` fixture's parts: its update graphs compiled again
def test_a_resumed_partial_run_trains_every_prompt_once_as_the_straight_run(partial_runs):
    straight, resumed, G = partial_runs["trained"]["straight"], partial_runs["trained"]["resumed"], partial_runs["G"]
    in_flight = partial_runs["in_flight"]
    # the checkpoint holds groups in flight, among them a sample part-way (tokens, not finished)
    assert in_flight and any(reason == "partial" and tokens for _, samples in in_flight
                             for tokens, reason, _ in samples)
    assert sorted(resumed) == [2, 3]
    for step in (2, 3):
        # the same prompts, the same samples (tokens, finish; log-probs within the weights' 1e-12 updates) as the
        # straight run
        assert resumed[step][0] == straight[step][0], step
        assert [s[:2] for s in resumed[step][1]] == [s[:2] for s in straight[step][1]], step
        for a, b in zip(resumed[step][1], straight[step][1]):
            np.testing.assert_allclose(a[2], b[2], atol=1e-4)
    # the carried groups train after the resume: step 2's groups start with those in flight at the save, their
    # samples' first tokens and versions those saved
    assert resumed[2][0] == [prompt for prompt, _ in in_flight][:2]
    for (prompt, samples), got in zip(in_flight, [resumed[2][1][k * G:(k + 1) * G] for k in range(2)]):
        for (before, _, versions_before), (tokens, _, _, versions) in zip(samples, got):
            assert list(tokens[:len(before)]) == before and versions[:len(before)] == versions_before
    assert os.path.isfile(os.path.join(partial_runs["saved"], "in_flight.json"))  # beside state.json
    # no prompt lost, none trained twice: step 1 of the straight run then the resumed 2-3 train what the straight
    # run trains, each prompt once
    whole = straight[1][0] + resumed[2][0] + resumed[3][0]
    assert whole == straight[1][0] + straight[2][0] + straight[3][0] and len(set(whole)) == len(whole)


def test_the_groups_in_flight_round_trip_through_a_checkpoint_folder(tmp_path):
    """PartialRollouts.write / read: prompts, columns and every sample field back as they were (fp32 log-probs bit
    for bit); a folder without the file has nothing in flight; a garbled file is refused naming it."""
    from mindgrpo.grpo.partial import IN_FLIGHT, PartialRollouts
    from mindgrpo.grpo.prompts import PromptBatch
    from mindgrpo.inference.engine import Completion
    from mindgrpo.parallel.checkpoint_folders import CheckpointError

    rng = np.random.default_rng(0)

    def sample(k, reason):
        return Completion(k, list(range(k + 1)), reason, rng.standard_normal(k + 1).astype(np.float32),
                          rng.standard_normal(k + 1).astype(np.float32), None, 0, np.arange(k + 1, dtype=np.int64))

    carry = PartialRollouts(2, 8)
    carry.add(PromptBatch([[5, 6], [7]], {"solution": ["a", "b"], "answer": [np.str_("1"), np.str_("2")]}),
              [sample(0, "stop"), sample(1, "partial"), sample(2, "length"), sample(0, "partial")])
    assert carry.write(str(tmp_path)) == [IN_FLIGHT]
    back = PartialRollouts(2, 8)
    back.read(str(tmp_path))
    assert [(g.prompt, g.columns) for g in back.groups] == [(g.prompt, g.columns) for g in carry.groups]
    for g, h in zip(carry.groups, back.groups):
        for a, b in zip(g.samples, h.samples):
            assert (a.prompt_index, a.token_ids, a.finish_reason, a.turns, a.model_mask) == \
                (b.prompt_index, b.token_ids, b.finish_reason, b.turns, b.model_mask)
            for x, y in ((a.logprobs, b.logprobs), (a.sampling_logprobs, b.sampling_logprobs),
                         (a.versions, b.versions)):
                assert x.dtype == y.dtype and np.array_equal(x, y)
    assert back.continuations() == carry.continuations()
    empty = tmp_path / "empty"
    empty.mkdir()
    back.read(str(empty))
    assert back.groups == []
    (tmp_path / IN_FLIGHT).write_text('{"groups": [{"prompt": [1]}]}')
    with pytest.raises(CheckpointError, match=IN_FLIGHT):
        back.read(str(tmp_path))
def test_the_training_rank_takes_the_rollout_ranks_groups_by_their_draw_numbers():
    """generate_config.placement separate: the rollout rank runs PartialRollouts.step; the training rank's
    DrawnPrompts, given what the samples meeting carries (the samples, each group's draw number, the figures), gives
    the same batch, draws as many prompts (the same data order) and keeps those still in flight."""
    from mindgrpo.grpo.partial import DrawnPrompts, PartialRollouts
    from mindgrpo.grpo.prompts import PromptSource
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.parallel.separate import prompt_check

    G = 3
    data = {"prompt_ids": [np.array([k]) for k in range(10, 40)], "prompt_length": [1] * 30,
            "solution": [str(k) for k in range(10, 40)]}
    rollout_prompts, train_prompts = PromptSource(data, seed=0), PromptSource(data, seed=0)
    carry, drawn, engine = PartialRollouts(G, 5), DrawnPrompts(G), PartialEngine()

    def sampling(n, seed):
        return SamplingParams(max_tokens=5, n=n, seed=seed)

    class Meeting(RemoteSide):  # what the samples meeting hands the training rank
        def groups(self, rows, n, width):
            assert (rows, n, width) == (2 * G, G, 5)
            figures = dict(self.figures, prompt_checks=[prompt_check(self.batch.ids)])
            return self.comps, list(carry.taken), figures

    meeting, continued = Meeting(), 0
    for step in range(3):
        meeting.batch, meeting.comps, meeting.figures = carry.step(engine, rollout_prompts, 2, sampling, (step, 0))
        batch, comps, figures = drawn.step(meeting, train_prompts, 2, sampling, (step, 0))
        assert batch == meeting.batch and comps is meeting.comps and figures["drawn"] == meeting.figures["drawn"]
        assert train_prompts.state() == rollout_prompts.state()  # the same prompts drawn
        assert sorted(drawn.rows) == sorted(g.number for g in carry.groups)  # the prompts still in flight
        assert [drawn.rows[g.number][0] for g in carry.groups] == [g.prompt for g in carry.groups]
        continued += figures["continued_samples"]
    assert continued > 0  # carried samples went on in a later step
    # a group this rank never drew (or trained already), prompts out of order: refused, naming the cause
    with pytest.raises(RuntimeError, match="not drawn or already trained"):
        drawn.take([999])
    meeting.batch, meeting.comps, meeting.figures = carry.step(engine, rollout_prompts, 2, sampling, (3, 0))
    meeting.batch = type(meeting.batch)([[1]] * len(meeting.batch.ids), meeting.batch.columns)
    with pytest.raises(RuntimeError, match="other prompts"):
        drawn.step(meeting, train_prompts, 2, sampling, (3, 0))


def test_a_resumed_rollout_rank_draws_the_training_ranks_prompts_in_flight_again(tmp_path):
    """generate_config.placement separate, --resume: the training rank's checkpoint holds the prompts in flight
    (DrawnPrompts.write, no samples); the rollout rank, told how many prompts were drawn and the draw numbers in
    flight, draws those prompts again from the restored position (across an epoch's end) and generates them whole
    in the next step, before fresh prompts: the same groups as the straight run's rollout rank, the same batch."""
    from mindgrpo.grpo.partial import DrawnPrompts, PartialRollouts
    from mindgrpo.grpo.prompts import PromptSource
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.parallel.checkpoint_folders import CheckpointError
    from mindgrpo.parallel.separate import prompt_check

    G, N = 3, 7  # 7 prompts: three steps' draws cross an epoch's end
    data = {"prompt_ids": [np.array([k]) for k in range(10, 10 + N)], "prompt_length": [1] * N,
            "solution": [str(k) for k in range(10, 10 + N)]}
    rollout_prompts, train_prompts = PromptSource(data, seed=0), PromptSource(data, seed=0)
    carry, drawn, engine = PartialRollouts(G, 5), DrawnPrompts(G), PartialEngine()

    def sampling(n, seed):
        return SamplingParams(max_tokens=5, n=n, seed=seed)

    class Meeting(RemoteSide):  # what the samples meeting hands the training rank: the rollout rank's step
        def groups(self, rows, n, width):
            return self.comps, list(self.numbers), dict(self.figures, prompt_checks=[prompt_check(self.batch.ids)])

    def meet(rollout, prompts, k):  # the rollout rank's step k
        meeting = Meeting()
        meeting.batch, meeting.comps, meeting.figures = rollout.step(engine, prompts, 2, sampling, (k, 0))
        meeting.numbers = rollout.taken
        return meeting

    for k in range(3):
        drawn.step(meet(carry, rollout_prompts, k), train_prompts, 2, sampling, (k, 0))
    assert drawn.rows and train_prompts.epoch >= 1
    drawn.write(str(tmp_path))
    # the resumed run: the training rank reads the checkpoint, the rollout rank gets its position and draw numbers
    back = DrawnPrompts(G)
    back.read(str(tmp_path))
    assert (back.rows, back.drawn) == (drawn.rows, drawn.drawn)
    resumed_prompts, again = PromptSource(data, seed=0), PartialRollouts(G, 5)
    resumed_prompts.load_state(train_prompts.state())
    rank1 = PromptSource(data, seed=0)
    rank1.load_state(train_prompts.state())
    again.redraw(rank1, back.drawn, back.in_flight())
    assert [(g.number, g.prompt, g.columns) for g in again.groups] == \
        [(g.number, g.prompt, g.columns) for g in carry.groups]  # the straight run's rollout rank's groups
    assert all(c.token_ids == [] and c.finish_reason == "partial" for g in again.groups for c in g.samples)
    # the next step: the straight run's batch (its groups in flight first), every sample in flight generated whole
    straight = carry.step(engine, rollout_prompts, 2, sampling, (3, 0))
    meeting = meet(again, rank1, 3)
    batch, comps, figures = back.step(meeting, resumed_prompts, 2, sampling, (3, 0))
    assert batch == straight[0] and meeting.numbers == carry.taken
    assert figures["continued_samples"] == G * len(drawn.rows) and all(len(c.token_ids) for c in comps)
    assert rank1.state() == rollout_prompts.state() == resumed_prompts.state()
    with pytest.raises(CheckpointError, match="outside"):  # draw numbers the prompts drawn do not cover
        PartialRollouts(G, 5).redraw(PromptSource(data, seed=0), 2, [5])


def test_rollout_replicas_keep_their_own_groups_in_flight_and_draw_each_prompt_once(tmp_path):
    """generate_config.placement separate with two rollout replicas and partial rollouts: each replica keeps its own
    groups in flight and hands over its share of the step's groups (batch 3: 2 and 1); the counts each still needs
    are exchanged (here through a barrier between two threads, the rollout ranks' meeting), the step's fresh
    prompts drawn once for both, replica 0's first. The training rank, given both hand-overs in replica order, draws
    as many prompts and keeps those in flight. Over the steps and a resume (each replica redrawing its share of the
    prompts in flight): every step trains 3 complete groups, no draw number twice, none skipped, and no random
    stream shared by the two replicas' samples."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from mindgrpo.grpo.partial import DrawnPrompts, PartialRollouts, Replicas
    from mindgrpo.grpo.prompts import PromptSource
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.parallel.data_parallel import share
    from mindgrpo.parallel.separate import prompt_check

    G, R, B, STEPS_BEFORE = 3, 2, 3, 5
    data = {"prompt_ids": [np.array([k]) for k in range(10, 50)], "prompt_length": [1] * 40,
            "solution": [str(k) for k in range(10, 50)]}

    def sampling(n, seed):
        return SamplingParams(max_tokens=5, n=n, seed=seed)

    class Exchange:  # Meeting.needs between the two replicas' threads
        def __init__(self):
            self.values, self.barrier = [0] * R, threading.Barrier(R)

        def of(self, i):
            def needs(n):
                self.values[i] = n
                self.barrier.wait()
                out = list(self.values)
                self.barrier.wait()
                return out
            return needs

    class Meeting(RemoteSide):  # the samples meeting: each replica's groups at its share's rows, their figures summed
        def groups(self, rows, n, width):
            assert (rows, n, width) == (B * G, G, 5)
            comps = [c for out in self.outs for c in out[1]]
            figures = {k: sum(out[2][k] for out in self.outs) for k in ("drawn", "continued_samples")}
            return comps, [k for numbers in self.numbers for k in numbers], dict(
                figures, prompt_checks=[prompt_check(out[0].ids) for out in self.outs])

    def step(replicas, sources, engines, drawn, train_prompts, k):
        exchange, meeting = Exchange(), Meeting()
        with ThreadPoolExecutor(R) as pool:
            futures = [pool.submit(replicas[i].step, engines[i], sources[i], len(share(B, R, i)), sampling, (k, 0),
                                   Replicas(i, R, exchange.of(i))) for i in range(R)]
            meeting.outs = [f.result() for f in futures]
        meeting.numbers = [list(r.taken) for r in replicas]
        assert [len(out[0].ids) for out in meeting.outs] == [2, 1]  # each replica its share, complete groups
        batch, comps, figures = drawn.step(meeting, train_prompts, B, sampling, (k, 0))
        assert len(batch.ids) == B and len(comps) == B * G and all(c.finish_reason != "partial" for c in comps)
        assert all(s.state() == train_prompts.state() for s in sources)  # every rank drew as many prompts
        flying = sorted(g.number for r in replicas for g in r.groups)
        assert sorted(drawn.rows) == flying and all(r.drawn == drawn.drawn for r in replicas)
        assert [drawn.rows[g.number][0] for r in replicas for g in r.groups] == \
            [g.prompt for r in replicas for g in r.groups]
        numbers = [k for numbers in meeting.numbers for k in numbers]
        # the prompts trained are those of their draw numbers (shuffle off: draw k is row k, prompt [10 + k])
        assert [p[0] for p in batch.ids] == [10 + k for k in numbers]
        return numbers, figures

    replicas = [PartialRollouts(G, 5) for _ in range(R)]
    sources = [PromptSource(data, seed=0, shuffle=False) for _ in range(R)]
    engines = [PartialEngine() for _ in range(R)]
    train_prompts, drawn = PromptSource(data, seed=0, shuffle=False), DrawnPrompts(G)
    trained, continued = [], 0
    for k in range(STEPS_BEFORE):
        numbers, figures = step(replicas, sources, engines, drawn, train_prompts, k)
        trained += numbers
        continued += figures["continued_samples"]
        # the two replicas' calls of this step use different random streams (keyed by their places in the draw)
        fresh = [key for e in engines for call, keys in zip(e.calls[-2:], e.keys[-2:]) if call[1] == G for key in keys]
        assert len(fresh) == len(set(fresh))
    assert continued > 0 and any(r.groups for r in replicas)  # samples were carried; some are in flight now
    assert len(trained) == len(set(trained)) and sorted(trained + drawn.in_flight()) == list(range(drawn.drawn))
    # a resume: the training rank's checkpoint, each replica redraws its share of the numbers in flight
    drawn.write(str(tmp_path))
    back, resumed_train = DrawnPrompts(G), PromptSource(data, seed=0, shuffle=False)
    back.read(str(tmp_path))
    resumed_train.load_state(train_prompts.state())
    again, again_sources = [PartialRollouts(G, 5) for _ in range(R)], []
    numbers = sorted(back.in_flight())
    for i in range(R):
        source = PromptSource(data, seed=0, shuffle=False)
        source.load_state(train_prompts.state())
        again[i].redraw(source, back.drawn, [numbers[k] for k in share(len(numbers), R, i)])
        again_sources.append(source)
    assert sorted(g.number for r in again for g in r.groups) == numbers
    for k in range(STEPS_BEFORE, STEPS_BEFORE + 3):
        got, _ = step(again, again_sources, engines, back, resumed_train, k)
        trained += got
    assert len(trained) == len(set(trained)) and sorted(trained + back.in_flight()) == list(range(back.drawn))
