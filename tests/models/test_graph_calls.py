"""A compiled graph's call walks none of the model's cells: MindSpore 2.10 sets `compile_phase` on the called cell
at every call and its setter recurses into every sub-cell (`Qwen2ForCausalLM.compile_phase` stops the walk at the
model). Through a model of many cells that was milliseconds a call, and the layerwise graphs run a thousand calls a
step."""

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM


class _Logits(nn.Cell):
    def __init__(self, lm):
        super().__init__(auto_prefix=False)
        self.lm = lm

    def construct(self, ids, pos, bias):
        return self.lm.logits(self.lm.hidden_states(ids, pos, bias)[:, -1])


def test_a_compiled_graphs_call_sets_no_attribute_on_the_models_cells(monkeypatch):
    cfg = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=6, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32)
    lm = Qwen2ForCausalLM(cfg)
    graph = _Logits(lm)
    ids = Tensor(np.arange(8, dtype=np.int32).reshape(1, 8))
    pos = Tensor(np.arange(8, dtype=np.int32).reshape(1, 8))
    bias = Tensor(np.triu(np.full((8, 8), -1e9, np.float32), 1).reshape(1, 1, 8, 8))
    first = graph(ids, pos, bias).asnumpy()  # compiles
    cells = {id(c) for _, c in lm.cells_and_names()} - {id(lm)}  # the model's own value is set: the cells below it
    assert len(cells) > 100  # the walk would be that many __setattr__ calls or more
    touched = []
    setattr_ = nn.Cell.__setattr__

    def counting(self, name, value):
        if id(self) in cells:
            touched.append((type(self).__name__, name))
        setattr_(self, name, value)

    monkeypatch.setattr(nn.Cell, "__setattr__", counting)
    again = graph(ids, pos, bias).asnumpy()
    monkeypatch.undo()
    assert touched == []
    np.testing.assert_array_equal(first, again)
    assert ms.get_context("mode") == ms.GRAPH_MODE
