"""mindgrpo/models/checkpoint.py: a weights path that does not exist is named as such; weights of another shape or
name are refused naming the parameter, the model's weights left as they were."""

import numpy as np
import pytest

from mindgrpo.models.checkpoint import find_config, load_model, load_state, model_state, read_model_state
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import WeightError
from mindgrpo.models.qwen2 import Qwen2ForCausalLM


@pytest.mark.parametrize("load", [lambda p: load_model(p), lambda p: find_config(p),
                                  lambda p: read_model_state(p, Qwen2Config())])
def test_a_missing_weights_path_says_it_does_not_exist(tmp_path, load):
    for missing in (tmp_path / "policy.ckpt", tmp_path / "hf_dir"):
        with pytest.raises(WeightError, match=rf"^{missing}: no such file or folder \(the weights path does not exist\)$"):
            load(str(missing))


def test_an_existing_folder_without_a_config_still_says_so(tmp_path):
    with pytest.raises(WeightError, match="no config.json or config.yaml beside the weights"):
        find_config(str(tmp_path))


def test_weights_of_another_shape_or_name_are_refused_naming_the_parameter():
    cfg = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=False)
    lm = Qwen2ForCausalLM(cfg, seed=0)
    before = model_state(lm)
    name = next(n for n in before if n.endswith("attention.wk.weight"))  # (8, 16)
    wrong = before[name].reshape(-1)  # the same number of values, another shape: set_data alone would take it
    with pytest.raises(WeightError, match=rf"^{name}: shape \({wrong.size},\) where the model's parameter is "
                                          rf"\({before[name].shape[0]}, {before[name].shape[1]}\)$"):
        load_state(lm, {name: wrong})
    with pytest.raises(WeightError, match=r"^model.no_such.weight: no such parameter in the model$"):
        load_state(lm, {"model.no_such.weight": wrong})
    first = next(iter(before))  # a good entry before a bad one is not copied either
    with pytest.raises(WeightError, match=rf"^{name}: shape"):
        load_state(lm, {first: before[first] + 1.0, name: wrong})
    after = model_state(lm)
    assert all(np.array_equal(before[n], after[n]) for n in before)
    load_state(lm, {name: before[name] + 1.0})  # the right shape still loads
    assert np.array_equal(model_state(lm)[name], before[name] + 1.0)
