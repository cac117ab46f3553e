"""A model config file's floats must be finite, like the GRPO config's."""

import pytest

from mindgrpo.models.qwen2 import Qwen2Config


@pytest.mark.parametrize("line", ["rope_theta: .inf", "rms_norm_eps: .nan", "param_init_std: -.inf"])
def test_non_finite_model_config_values_are_refused(tmp_path, line):
    path = tmp_path / "model.yaml"
    path.write_text(f"vocab_size: 64\nhidden_size: 16\nintermediate_size: 32\nnum_hidden_layers: 1\n"
                    f"num_attention_heads: 2\nnum_key_value_heads: 1\n{line}\n")
    with pytest.raises(ValueError, match=f"{line.split(':')[0]} must be a finite number"):
        Qwen2Config.load(str(path))
