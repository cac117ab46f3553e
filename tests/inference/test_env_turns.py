"""Environments through the real engine (a micro Qwen2 and the tiny tokenizer, Qwen3's chat template): each
observation is appended to its sample's cache as the template's user turn and the sample decodes on (greedy
continuation equals a fresh prefill of the whole conversation), the model_mask covers the model's turns only,
the environment sees every model turn (the last one through finish) and its rewards are summed; an environment
that ends the game stops the sample; hostile environments (sleeps, crashes, raises, wrong types) are counted and
the generate call finishes."""

from pathlib import Path

import numpy as np
import pytest

from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.inference.env_turns import EnvTurns
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM

QWEN3 = str(Path(__file__).resolve().parents[1] / "data" / "qwen3_template" / "tokenizer_config.json")
HOSTILE = str(Path(__file__).resolve().parents[1] / "envs" / "hostile_envs.py")
CFG = Qwen2Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, param_init_std=0.3)
QUESTIONS = ["alpha", "b", "gamma delta"]
HOSTILE_PROMPTS = ["sleep", "crash", "raise", "types", "fine", "sleep_reset"]


@pytest.fixture(scope="module")
def engine():
    return RolloutEngine(Qwen2ForCausalLM(CFG, seed=1), pad_token_id=0, max_num_seqs=4)


def stops_for(engine, prompt_ids, tokenizer):
    """Stop ids the greedy model writes early (the third token of each prompt's answer), and the real ones."""
    out = engine.generate(prompt_ids, SamplingParams(max_tokens=3, temperature=0.0))
    return tuple(sorted({c.token_ids[2] for c in out} | set(tokenizer.stop_token_ids)))


def runs_of(c):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], c.model_mask.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2]))


@pytest.mark.slow  # an engine's graphs, the append graphs and a fresh prefill (~40 s under load)
def test_observations_continue_in_the_cache_and_rewards_sum(engine, tokenizer):
    with EnvTurns(tokenizer, "counter", QWEN3, plugins=[HOSTILE], max_turns=2, observation_max_tokens=16,
                  max_turn_tokens=24) as turns:
        prompts = turns.prompts(QUESTIONS)
        assert tokenizer.decode(prompts[1]) == "<|im_start|>user\nstart b<|im_end|>\n<|im_start|>assistant\n"
        stops = stops_for(engine, prompts, tokenizer)
        params = SamplingParams(max_tokens=14, temperature=0.0, n=2, stop_token_ids=stops)
        out = engine.generate(prompts, params, turns=turns)
        turns.finish(out)
        assert engine.last_stats["turns"] >= 4  # 6 samples through 4 slots, conversations going on
        fresh_prompts, fresh_limits, expected = [], [], []
        for r, c in enumerate(out):
            runs = runs_of(c)
            assert len(runs) == c.turns + 1 and c.model_mask.sum() <= 14
            assert (c.logprobs[~c.model_mask] == 0).all() and (c.logprobs[c.model_mask] < 0).all()
            texts = []
            for k, (a, b) in enumerate(runs):
                ids = c.token_ids[a:b]
                ended = k < c.turns or c.finish_reason == "stop"
                texts.append(tokenizer.decode(ids[:-1] if ended else ids))
                if k < c.turns:  # the user turn after it: the template's text for "obs k+1", up to the assistant
                    assert ids[-1] in stops
                    assert tokenizer.decode(c.token_ids[b:runs[k + 1][0]]) == \
                        f"\n<|im_start|>user\nobs {k + 1}<|im_end|>\n<|im_start|>assistant\n"
            columns = turns.columns(r)
            assert columns["env_reward"] == pytest.approx(sum(len(t) for t in texts) / 100)  # every turn, the last too
            assert len(turns.steps[r]) == len(runs) and not columns["env_done"]
            assert columns["messages"] == [{"role": "user", "content": f"start {QUESTIONS[r // 2]}"}] + [
                m for k, t in enumerate(texts) for m in [{"role": "assistant", "content": t}]
                + ([{"role": "user", "content": f"obs {k + 1}"}] if k < c.turns else [])]
            for a, b in runs[1:]:  # each model turn after an observation, against the whole history prefilled anew
                fresh_prompts.append(prompts[r // 2] + c.token_ids[:a])
                fresh_limits.append(b - a)
                expected.append((c.token_ids[a:b], c.logprobs[a:b]))
        assert len(expected) >= 4
        stats = turns.stats(len(out))
        assert stats["env/steps_mean"] == pytest.approx(np.mean([len(runs_of(c)) for c in out]))
        assert stats["env/errors"] == stats["env/timeouts"] == stats["env/done_fraction"] == 0
        fresh = engine.generate(fresh_prompts, SamplingParams(max_tokens=14, temperature=0.0, stop_token_ids=stops),
                                max_tokens=fresh_limits)
        for f, (ids, logprobs) in zip(fresh, expected):
            assert f.token_ids == ids
            np.testing.assert_allclose(f.logprobs, logprobs, rtol=0, atol=1e-5)

    # an environment done after the first turn: the conversation stops there ("stop", not cut)
    with EnvTurns(tokenizer, "counter", QWEN3, settings={"done_after": 1}, plugins=[HOSTILE], max_turns=2,
                  observation_max_tokens=16, max_turn_tokens=24) as turns:
        out = engine.generate(turns.prompts(QUESTIONS), params, turns=turns)
        turns.finish(out)
        for r, c in enumerate(out):
            assert c.turns == 0 and len(turns.steps[r]) == 1 and c.model_mask.all()
            if c.token_ids[-1] in stops:
                assert c.finish_reason == "stop" and turns.columns(r)["env_done"]
        assert turns.stats(len(out))["env/done_fraction"] > 0


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_hostile_environments_are_counted_and_generate_finishes(engine, tokenizer):
    with EnvTurns(tokenizer, "hostile", QWEN3, plugins=[HOSTILE], max_turns=2, observation_max_tokens=16,
                  max_turn_tokens=24, timeout_s=2.0) as turns:
        prompts = turns.prompts(HOSTILE_PROMPTS)
        assert tokenizer.decode(prompts[5]) == "<|im_start|>user\nsleep_reset<|im_end|>\n<|im_start|>assistant\n"
        stops = stops_for(engine, prompts, tokenizer)
        out = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=stops),
                              turns=turns)
        turns.finish(out)
        status = [[s["status"] for s in turns.steps[r]] for r in range(len(out))]
        assert status[:4] == [["timeout"], ["error"], ["error"], ["error"]]
        assert status[5] == [] and set(status[4]) == {"ok"} and len(status[4]) == out[4].turns + 1
        assert all(c.turns == 0 for c in out[:4]) and out[4].turns >= 1  # the failures ended their conversations
        assert "crashed" in turns.steps[1][0]["error"] and "KeyError" in turns.steps[2][0]["error"]
        assert [turns.columns(r)["env_reward"] for r in range(6)] == [0, 0, 0, 0, len(status[4]), 0]
        stats = turns.stats(len(out))
        assert stats["env/timeouts"] == 2 and stats["env/errors"] == 3  # the reset that slept is a timeout too


def test_bad_use_fails_in_one_line(tokenizer):
    with pytest.raises(KeyError, match="unknown environment 'chess'"):
        EnvTurns(tokenizer, "chess", QWEN3)
    with pytest.raises(ValueError, match=r"no setting\(s\) \['rounds'\]"):
        EnvTurns(tokenizer, "guess_number", QWEN3, settings={"rounds": 3})
    with EnvTurns(tokenizer, "guess_number", QWEN3) as turns:
        with pytest.raises(ValueError, match="one distinct prompt_index per question"):
            turns.prompts(["a", "b"], index=[0, 0])
        with pytest.raises(KeyError, match="no environment was reset for prompt_index 3"):
            turns.end_turn(0, 3, [5, 6])
        assert turns.observation_text("Higher.") == "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
