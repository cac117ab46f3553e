"""One step's samples (mindgrpo/grpo/rollouts.py): groups kept or dropped whole, concatenation, the
figures logged about them, and the experience's MindRecord record (`--save_data_file`)."""

import numpy as np
import pytest

from mindgrpo.grpo.experience import pack
from mindgrpo.grpo.prompts import PromptBatch
from mindgrpo.grpo.rollouts import Rollouts, rollout_metrics, save_experience
from mindgrpo.inference.engine import Completion

G = 2


def rollouts() -> Rollouts:
    """Two prompts x G = 2: responses of 1, 3 | 2, 2 tokens, the second sample cut at max_tokens."""
    batch = PromptBatch([[5, 6], [7, 8, 9]], {"solution": ["11", "24"], "prompt": ["a", "b"]})
    comps = [Completion(0, [10], "stop"), Completion(0, [11, 12, 13], "length"),
             Completion(1, [14, 15], "stop"), Completion(1, [16, 17], "stop")]
    r = Rollouts(batch, comps, ["x", "yyy", "zz", "ww"], G)
    r.rewards = np.array([1.0, 0.0, 0.5, 0.5], np.float32)
    r.per_function = {"accuracy": np.array([1.0, 0.0, np.nan, 1.0], np.float32)}
    return r


def test_rows_carry_their_prompts_columns_and_groups_stay_whole():
    r = rollouts()
    assert r.prompt_ids == [[5, 6], [5, 6], [7, 8, 9], [7, 8, 9]]
    assert r.columns == {"solution": ["11", "11", "24", "24"], "prompt": ["a", "a", "b", "b"],
                         "completion_length": [1, 3, 2, 2]}
    second = r.groups(np.array([False, True]))
    assert second.batch.ids == [[7, 8, 9]] and [c.prompt_index for c in second.completions] == [0, 0]
    assert second.texts == ["zz", "ww"] and second.rewards.tolist() == [0.5, 0.5]
    both = Rollouts.concat([second, r.groups(np.array([True, False]))])
    assert both.batch.ids == [[7, 8, 9], [5, 6]] and [c.prompt_index for c in both.completions] == [0, 0, 1, 1]
    assert both.texts == ["zz", "ww", "x", "yyy"] and both.rewards.tolist() == [0.5, 0.5, 1.0, 0.0]
    assert np.array_equal(both.per_function["accuracy"], [np.nan, 1.0, 1.0, 0.0], equal_nan=True)


def test_rollout_metrics_by_hand():
    stats = {"tokens_per_s": 80.0, "decode_steps": 3, "not_logged": 1.0}
    m = rollout_metrics(rollouts(), stats)
    assert m["reward_mean"] == pytest.approx(0.5)
    assert m["reward_std"] == pytest.approx(np.std([1.0, 0.0, 0.5, 0.5], ddof=1))
    assert m["prompt_length/mean"] == 2.5 and m["response_length/mean"] == 2.0
    assert m["response_length/max"] == 3.0 and m["response_length/clip_ratio"] == 0.25
    assert m["train/accuracy"] == pytest.approx(0.5)  # the unscored (nan) sample counts as 0
    assert m["rollout/tokens_per_s"] == 80.0 and m["rollout/new_tokens"] == 8.0 and m["rollout/decode_steps"] == 3.0
    assert "rollout/nll" not in m and "rollout/not_logged" not in m  # no engine log-probs; not an engine figure


def test_the_experience_record_holds_each_samples_tokens_reward_advantage_and_mask(tmp_path):
    import mindspore.dataset as ds

    r = rollouts()
    adv = np.array([0.7, -0.7, 0.0, 0.0], np.float32)
    exp = pack(r.prompt_ids, [c.token_ids for c in r.completions], adv, pad_id=0,
               loss_mask=np.array([True, False, True, True]))  # overlong filtering drops sample 1
    path = save_experience(str(tmp_path / "exp.mindrecord"), 3, r, exp)  # step 3 of metrics.jsonl
    assert path == str(tmp_path / "exp_step000003.mindrecord")
    assert save_experience(str(tmp_path / "plain"), 1, r, exp) == str(tmp_path / "plain_step000001.mindrecord")
    rows = list(ds.MindDataset(path, shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1))
    assert [row["prompt_ids"].tolist() for row in rows] == r.prompt_ids
    assert [row["response_ids"].tolist() for row in rows] == [[10], [11, 12, 13], [14, 15], [16, 17]]
    assert [float(row["reward"]) for row in rows] == [1.0, 0.0, 0.5, 0.5]
    assert [float(row["advantage"]) for row in rows] == pytest.approx([0.7, -0.7, 0.0, 0.0])
    assert [row["loss_mask"].tolist() for row in rows] == [[1.0], [0.0, 0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    assert [str(row["completion"]) for row in rows] == r.texts
    assert [row["ref_logp"].tolist() for row in rows] == [[0.0], [0.0] * 3, [0.0] * 2, [0.0] * 2]  # beta 0: none
