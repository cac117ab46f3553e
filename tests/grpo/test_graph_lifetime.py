"""A released graph lets its model go: after a Scorer or PolicyUpdater has run and every Python
reference to it and to its model is deleted, the model is freed (a weak reference to it is dead).

MindSpore 2.10 keeps a cell alive, with no referrer Python's gc can see, when the construct it
compiles as a top graph or differentiates has a parameter with a default value or *args (the
note in `mindgrpo/grpo/train_graph.py`): `PolicyLoss` had one, so every updater, and every update
graph `rl_config.release_graphs` dropped, left its PolicyLoss and model alive for good."""

import gc
import weakref

import numpy as np
import pytest

from mindgrpo.grpo.actor import PolicyUpdater, Scorer
from mindgrpo.grpo.experience import pack
from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import AdamWSettings
from mindgrpo.grpo.packing import Batching
from mindgrpo.memory.policy import MemoryPolicy
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM

pytestmark = pytest.mark.usefixtures("graph_mode")  # tests/grpo/conftest.py

CFG = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64)


def experience(with_rollout: bool):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 64, 5) for _ in range(4)]
    responses = [rng.integers(2, 64, 3 + i) for i in range(4)]
    sampling = [rng.normal(-2.0, 0.5, len(r)).astype(np.float32) for r in responses] if with_rollout else None
    return pack(prompts, responses, rng.standard_normal(4).astype(np.float32), step=8, sampling_logp=sampling)


def run_and_forget(make, call) -> weakref.ref:
    """Build a part over a fresh model, call it once, drop both; a weak reference to the model."""
    lm = Qwen2ForCausalLM(CFG, seed=3)
    part = make(lm)
    call(part)
    model = weakref.ref(lm)
    del part, lm
    gc.collect()
    return model


def updater(loss=None, layerwise=False, **batching):
    """A maker of PolicyUpdaters with these settings (GRPOLoss(beta=0) unless given); batching: Batching's."""
    loss = GRPOLoss(beta=0.0) if loss is None else loss
    return lambda lm: PolicyUpdater(lm, loss, Batching(4, **batching), detach_old=True, use_ref=False,
                                    optimizer=AdamWSettings(beta2=0.99), memory=MemoryPolicy(layerwise_update=layerwise))


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
@pytest.mark.parametrize("kind", ["rows", "packed", "layerwise", "rollout_correction"])
def test_an_updated_model_is_freed_with_its_updater(kind):
    make = {"rows": updater(),
            "packed": updater(max_tokens=32, packing=True),
            "layerwise": updater(layerwise=True),
            "rollout_correction": updater(loss=GRPOLoss(beta=0.0, rollout_correction="tis_token"))}[kind]
    exp = experience(with_rollout=kind == "rollout_correction")
    model = run_and_forget(make, lambda up: up.update(exp, lr=1e-3))
    assert model() is None, f"{kind}: the model outlived its PolicyUpdater"


def test_a_scored_model_is_freed_with_its_scorer():
    exp = experience(with_rollout=False)
    model = run_and_forget(lambda lm: Scorer(lm, 4), lambda s: s(exp))
    assert model() is None, "the model outlived its Scorer"


def test_a_pipeline_stages_model_is_freed_with_its_stage_graphs():
    """A stage before the last (`StageHidden` forward, `StageGradStep` backward), called as the pipeline calls
    them on right-padded rows (feed ()), in one process: the graphs msrun's stages compile."""
    from mindspore import Tensor, ops

    from mindgrpo.grpo.optim import GradBuffer
    from mindgrpo.grpo.train_graph import StageGradStep
    from mindgrpo.models.scoring import StageHidden

    ids = Tensor(np.arange(2, 18, dtype=np.int32).reshape(2, 8))

    def stages(lm):
        params = [p for p in lm.trainable_params()]
        return StageHidden(lm), StageGradStep(StageHidden(lm), params, GradBuffer(params), wrt_inputs=False)

    def call(parts):
        forward, backward = parts
        hidden = forward(ids, ())  # (B, S, H)
        backward(ids, ops.ones_like(hidden), ()).asnumpy()

    model = run_and_forget(stages, call)
    assert model() is None, "the model outlived its pipeline stage graphs"
