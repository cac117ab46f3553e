"""grpo.experience.pack: row lengths rounded up to a step, and cut back to the caller's caps."""

import numpy as np

from mindgrpo.grpo.experience import pack

PROMPTS = [[5] * 12, [6] * 10]
RESPONSES = [[7] * 36, [8] * 33]


def test_rows_round_up_to_the_step():
    exp = pack(PROMPTS, RESPONSES, np.ones(2))
    assert exp.input_ids.shape == (2, 64) and exp.labels.shape == (2, 64)


def test_caps_cut_the_padding_and_keep_every_token():
    full, capped = pack(PROMPTS, RESPONSES, np.ones(2)), pack(PROMPTS, RESPONSES, np.ones(2), caps=(56, 40))
    assert capped.input_ids.shape == (2, 56) and capped.labels.shape == (2, 40)
    np.testing.assert_array_equal(capped.input_ids, full.input_ids[:, :56])
    for name in ("labels", "mask", "score_pos"):
        np.testing.assert_array_equal(getattr(capped, name), getattr(full, name)[:, :40])
    assert not full.mask[:, 40:].any() and (full.input_ids[:, 56:] == 0).all()


def test_a_batch_longer_than_its_caps_gets_the_length_it_needs():
    exp = pack([[5] * 30, [6] * 10], RESPONSES, np.ones(2), caps=(56, 32))
    assert exp.input_ids.shape == (2, 66) and exp.labels.shape == (2, 36)
    assert exp.mask.sum() == 36 + 33
