"""RolloutEngine behaviour on a tiny random model: stops, n samples, seeds, buckets compile once."""

import numpy as np
import pytest

from mindgrpo.inference.engine import RolloutEngine
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.models.qwen2 import Qwen2Config, Qwen2ForCausalLM

CFG = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  param_init_std=0.3)
PROMPTS = [[3, 4, 5], [7], [9, 10, 11, 12, 13, 14]]


@pytest.fixture(scope="module")
def engine():
    return RolloutEngine(Qwen2ForCausalLM(CFG, seed=1), pad_token_id=0)


def test_seeded_sampling_is_reproducible_and_seed_dependent(engine):
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=5)
    a = [c.token_ids for c in engine.generate(PROMPTS, p)]
    b = [c.token_ids for c in engine.generate(PROMPTS, p)]
    c = [c.token_ids for c in engine.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=1.0, seed=6))]
    assert a == b and a != c


def test_n_samples_are_adjacent_and_differ(engine):
    out = engine.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=1.0, n=3, seed=0))
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len({tuple(c.token_ids) for c in out[:3]}) > 1


def test_stop_ids_end_each_row_and_are_kept(engine):
    free = engine.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=1.0, seed=3))
    # stop on two ids that the unconstrained run produced mid-way (any later tokens are cut)
    stops = (free[0].token_ids[4], free[2].token_ids[6])
    out = engine.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=1.0, seed=3, stop_token_ids=stops))
    for f, c in zip(free, out):
        hits = [i for i, t in enumerate(f.token_ids) if t in stops]
        if hits:
            assert c.token_ids == f.token_ids[:hits[0] + 1] and c.finish_reason == "stop"
        else:
            assert c.token_ids == f.token_ids and c.finish_reason == "length"
    forced = engine.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=1.0, seed=3,
                                                     stop_token_ids=stops, ignore_stop=True))
    assert [c.token_ids for c in forced] == [c.token_ids for c in free]


def test_one_compile_per_bucket(engine):
    p = SamplingParams(max_tokens=8, temperature=0.0)
    engine.generate(PROMPTS, p)
    bucket = engine._buckets[next(reversed(engine._buckets))]
    before = engine.compiled_buckets
    for prompts in ([[1, 2]], [[5] * 20, [6] * 3], PROMPTS):  # all fit bucket B=8, P=32, C=64
        engine.generate(prompts, p)
    assert engine.compiled_buckets == before
    assert len(bucket.prefill.compile_cache) == 1 and len(bucket.decode.compile_cache) == 1


def test_greedy_batch_equals_one_by_one(engine):
    p = SamplingParams(max_tokens=10, temperature=0.0)
    together = [c.token_ids for c in engine.generate(PROMPTS, p)]
    alone = [engine.generate([q], p)[0].token_ids for q in PROMPTS]
    assert together == alone


def test_rejects_empty_prompt(engine):
    with pytest.raises(ValueError):
        engine.generate([[]], SamplingParams(max_tokens=2))


def test_decode_logits_equal_full_reforward_with_inexact_scale(engine):
    """d = 8: 1/sqrt(d) is not a power of two, so folding it into the fused wq rounds differently
    from the training graph's scaling of the scores; the logits must still agree."""
    import mindspore as ms

    from mindgrpo.models.scoring import SequenceLogits

    out = engine.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=1.0, seed=2), return_logits=True)
    full = SequenceLogits(engine.lm)
    for i, (p, c) in enumerate(zip(PROMPTS, out)):
        seq = np.array([p + c.token_ids], np.int32)
        ref = full(ms.Tensor(seq), ms.Tensor(np.ones_like(seq))).asnumpy()[0]
        for t in range(len(c.token_ids)):
            np.testing.assert_allclose(engine.last_logits[t][i], ref[len(p) - 1 + t], atol=1e-5, rtol=0)


def test_generate_sees_updated_weights():
    """The engine's fused weight copies are remade from the model's parameters at every call."""
    from mindgrpo.models.checkpoint import load_state, model_state

    lm = Qwen2ForCausalLM(CFG, seed=1)
    eng = RolloutEngine(lm, pad_token_id=0)
    p = SamplingParams(max_tokens=10, temperature=0.0)
    before = [c.token_ids for c in eng.generate(PROMPTS, p)]
    other = Qwen2ForCausalLM(CFG, seed=2)
    load_state(lm, model_state(other))
    after = [c.token_ids for c in eng.generate(PROMPTS, p)]
    assert after == [c.token_ids for c in RolloutEngine(other, pad_token_id=0).generate(PROMPTS, p)]
    assert after != before


def test_the_limit_is_the_models_context_not_the_cache_bucket(engine):
    import dataclasses

    # 40 positions: a 30-token prompt + 10 new tokens fits, though its cache bucket has 32 + 32 slots
    short = RolloutEngine(Qwen2ForCausalLM(dataclasses.replace(CFG, max_position_embeddings=40), seed=1))
    assert short.max_positions == 40
    p = SamplingParams(max_tokens=10, temperature=0.0)
    prompt = [[(7 * i) % 60 + 1 for i in range(30)]]
    assert [c.token_ids for c in short.generate(prompt, p)] == [c.token_ids for c in engine.generate(prompt, p)]
    with pytest.raises(ValueError, match=r"a prompt of 31 tokens \+ max_tokens 10 = 41 positions, more than the "
                                         r"model's 40"):
        short.generate([[5] * 31], p)
