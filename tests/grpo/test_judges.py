"""Generative judges (`reward_config.judges`, `mindgrpo/grpo/judges.py`): the parsers on literal answers; a GRPO step
on the micro model with a judge beside a rule reward (the swap on): the judge's answers are the ones
`scripts/generate.py` gives for the same questions (greedy), its scores those answers' numbers read by a regex of
this file (None where there is none or it lies outside the range, counted), the total the weighted sum, the judge
resident in the phase "reward_model" only, its answers in completions.jsonl; the config's checks."""

import json
import math
import os
import re

import numpy as np
import pytest

import mindspore as ms

from mindgrpo.config import ConfigError, GRPOConfig, load_config
from mindgrpo.grpo import builder
from mindgrpo.models.config import Qwen2Config
from mindgrpo.rewards.judge_parsers import JUDGE_PARSERS
from mindgrpo.utils.progress import Progress

from fakes import keep_rollouts, one_layer_micro, save_judge, watch_ledger
from test_reward_models import MICRO

TEMPLATE = "Question: {{ prompt }} Answer: {{ completion }} Solution: {{ solution }} Score:"
SCORE_RANGE = (0.0, 50.0)


@pytest.mark.parametrize("parser, answer, score", [
    ("number", "I would say 7.", 7.0), ("number", "Score: 8/10", 10.0), ("number", "-2.5 points", -2.5),
    ("number", "seven", None), ("number", "", None),
    ("score_tag", "thinking 3 ... <score> 9 </score>", 9.0), ("score_tag", "<score>4</score> then <SCORE>6</SCORE>", 6.0),
    ("score_tag", "<score>high</score>", None), ("score_tag", "9", None),
    ("yes_no", "Yes, it is right.", 1.0), ("yes_no", "Well... NO.", 0.0), ("yes_no", "yesterday, nothing", None),
])
def test_parsers_read_their_formats_and_nothing_else(parser, answer, score):
    assert JUDGE_PARSERS.get(parser)(answer) == score


class Rows:
    """A metrics log that keeps the completions' rows."""

    def __init__(self):
        self.rows = []

    def log_completions(self, step, rows):
        self.rows.extend(rows)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    out = tmp_path_factory.mktemp("judges")
    model = one_layer_micro(out)
    judge_path = save_judge(str(out / "judge"), model)
    template = TEMPLATE.replace('"', '\\"')
    cfg = load_config(GRPOConfig, None, [x for x in MICRO if "completions_interval" not in x] + [
        f"actor_config.model={model}", f"rl_config.output_dir={out}", "rl_config.completions_interval=1",
        f'reward_config.judges=[{{path: {judge_path}, name: critic, weight: 0.25, max_tokens: 6, max_model_len: 256, '
        f'score_range: [{SCORE_RANGE[0]}, {SCORE_RANGE[1]}], template: "{template}"}}]'])
    parts = builder.build(cfg, builder.Paths(output_dir=str(out)))
    log = Rows()
    trainer = builder.make_trainer(cfg, parts, log, Progress(1), str(out))
    seen = watch_ledger(parts.memory)
    kept = keep_rollouts(trainer)
    metrics = trainer.train_step()
    yield dict(cfg=cfg, parts=parts, metrics=metrics, seen=seen, r=kept["r"], rows=log.rows, out=out,
               judge_path=judge_path, tokenizer=trainer.tokenizer)
    ms.set_context(mode=previous)


def last_number(text):
    found = re.findall(r"-?\d+(?:\.\d+)?", text)
    if not found:
        return math.nan
    value = float(found[-1])
    return value if SCORE_RANGE[0] <= value <= SCORE_RANGE[1] else math.nan


@pytest.mark.slow
def test_the_judges_answers_and_scores_are_those_generate_py_gives(run, capsys):
    from scripts import generate

    r, tok = run["r"], run["tokenizer"]
    prompts = tok.decode_batch(r.prompt_ids, skip_special_tokens=True)
    questions = [f"Question: {p} Answer: {t} Solution: {s} Score:"
                 for p, t, s in zip(prompts, r.texts, r.columns["solution"])]
    capsys.readouterr()
    assert generate.main(["--model", run["judge_path"], "--greedy", "--max_tokens", "6", "--tokenizer_dir",
                          str(run["out"] / "cache" / "tiny_tokenizer"), *(x for q in questions for x in ("--prompt", q))]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    answers = {q: [] for q in questions}
    for line in lines:
        answers[line["prompt"]].append(line["completion"])
    expected_answers = [answers[q][0] for q in questions]
    assert r.columns["judge/critic"] == expected_answers
    expected = np.array([last_number(a) for a in expected_answers], np.float32)
    got = r.per_function["critic"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got[~np.isnan(got)], expected[~np.isnan(expected)])
    assert 0 < np.isfinite(expected).sum() < len(expected)  # both kinds of answer occur in this run
    assert run["metrics"]["reward/critic/none"] == float(np.isnan(expected).sum())
    assert run["metrics"]["reward/critic/too_long"] == 0.0


@pytest.mark.slow
def test_the_total_adds_the_judges_weighted_scores_and_none_counts_zero(run):
    r = run["r"]
    rule = np.array([len(t) / 32 for t in r.texts], np.float32)
    np.testing.assert_allclose(r.rewards, rule + 0.25 * np.nan_to_num(r.per_function["critic"]), rtol=1e-6, atol=1e-6)
    rows = run["rows"]
    assert rows and [row["judge/critic"] for row in rows] == r.columns["judge/critic"][:len(rows)]


@pytest.mark.slow
def test_the_judge_is_resident_in_its_own_phase_only(run):
    memory, seen = run["parts"].memory, run["seen"]
    assert "reward_model" in memory.groups
    for phase, resident in seen:
        assert len(resident) <= 1, (phase, resident)
        if phase == "reward_model":
            assert resident == ["reward_model"]
        elif phase is not None:
            assert "reward_model" not in resident, phase
    judge = run["parts"].reward_models.models[0]
    weights = sum(p.asnumpy().nbytes for p in judge.engine.lm.get_parameters())
    assert memory.groups["reward_model"].size() >= weights + judge.engine.cache_bytes() > weights
    m = judge.engine.lm.config  # max_model_len 256 fixes the cache: 64 slots + the trash slot, fp32 k and v
    assert judge.engine.cache_bytes() == 2 * m.num_hidden_layers * 65 * m.num_key_value_heads * 256 * m.d * 4


@pytest.mark.parametrize("entry, message", [
    ("{name: x}", "judges\\[0\\].path"),
    ("{path: a, parser: stars}", "unknown judge parser 'stars'"),
    ("{path: a, name: test_text_length}", "names must differ"),
    ("{path: a, score_range: [3, 1]}", "judges\\[0\\].score_range"),
    ("{path: a, max_tokens: 0}", "judges\\[0\\].max_tokens"),
    ("{path: a, max_tokens: 8, max_model_len: 8}", "judges\\[0\\].max_model_len"),
])
def test_config_refuses_bad_judges(entry, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, None, MICRO + [f"reward_config.judges=[{entry}]"])


def test_the_plan_counts_a_judges_weights_and_fused_copies(tmp_path):
    from mindgrpo.memory.plan import plan

    model = one_layer_micro(tmp_path)
    m = Qwen2Config.load(model)  # tied embeddings: no lm_head of its own
    h, i, q, kv = m.hidden_size, m.intermediate_size, m.num_attention_heads * m.d, m.num_key_value_heads * m.d
    layer = h * q + q + 2 * (h * kv + kv) + q * h + 3 * h * i + 2 * h  # q/k/v with biases, o, SwiGLU, two norms
    weights = 4 * (m.vocab_size * h + m.num_hidden_layers * layer + h)
    fused = 4 * m.num_hidden_layers * (layer - 2 * h)  # the engine's copies: every layer tensor but the norms
    cfg = load_config(GRPOConfig, None, MICRO + [f"actor_config.model={model}", "reward_config.judges=[{path: j}]"])
    p = plan(cfg, m, reward_models=[m])
    assert p.groups["reward_model"] == weights + fused and p.phases["reward_model"] == ["reward_model"]
    fixed = load_config(GRPOConfig, None, MICRO + [f"actor_config.model={model}",
                                                   "reward_config.judges=[{path: j, max_model_len: 100, max_num_seqs: 6}]"])
    cache = 2 * m.num_hidden_layers * (6 + 1) * m.num_key_value_heads * 100 * m.d * 4  # 6 slots + the trash slot
    assert plan(fixed, m, reward_models=[m]).groups["reward_model"] == weights + fused + cache
    with pytest.raises(ValueError, match="1 reward_config.judges"):
        plan(cfg, m, reward_models=[])
