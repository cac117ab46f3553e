"""mindgrpo/models/checkpoint.py: a weights path that does not exist is named as such."""

import pytest

from mindgrpo.models.checkpoint import find_config, load_model, read_model_state
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import WeightError


@pytest.mark.parametrize("load", [lambda p: load_model(p), lambda p: find_config(p),
                                  lambda p: read_model_state(p, Qwen2Config())])
def test_a_missing_weights_path_says_it_does_not_exist(tmp_path, load):
    for missing in (tmp_path / "policy.ckpt", tmp_path / "hf_dir"):
        with pytest.raises(WeightError, match=rf"^{missing}: no such file or folder \(the weights path does not exist\)$"):
            load(str(missing))


def test_an_existing_folder_without_a_config_still_says_so(tmp_path):
    with pytest.raises(WeightError, match="no config.json or config.yaml beside the weights"):
        find_config(str(tmp_path))
