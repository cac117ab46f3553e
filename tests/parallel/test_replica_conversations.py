"""Conversations on colocated data-parallel inference replicas (grpo/conversations.ReplicaConversations): two threads
stand in for the ranks (test_separate_value.ThreadWorld: host_sum in float32, as Comm.host_sum), each with the real
DataParallelEngine over a scripted engine and conversations built as the builder builds them (its own tool workers).
Each replica runs the conversations of its share of the prompts only, and every rank gets what one process running
the whole batch gets: the prompts as generated, the trajectories with their model masks and turns, the reward
columns in prompt order and the metrics (counts summed, means over the whole batch). Tools, and an environment,
whose resets write the prompts (keyed by their index in the whole batch) and whose finish steps the last turns. The
rollout ranks of a separate placement (grpo/rollout_worker.RolloutWorker, three threads: one training rank, two
rollout ranks) the same way, the training rank merging their values (RemoteConversations)."""

import threading
from pathlib import Path

import numpy as np
import pytest

from mindgrpo.config import GRPOConfig
from mindgrpo.config.loader import from_dict
from mindgrpo.data.synthetic import ensure_tiny_tokenizer
from mindgrpo.grpo.conversations import COMBINED, build_conversations, merge_replicas, replica_conversations
from mindgrpo.inference.engine import Completion
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.parallel.comm import Group
from mindgrpo.parallel.data_parallel import DataParallelEngine
from test_separate_value import ThreadWorld  # this folder, on the path as msrun_util is

TESTS = Path(__file__).resolve().parents[1]
TOOLS_TEMPLATE = str(TESTS.parent / "model_configs" / "qwen_grpo" / "tiny_tools" / "tokenizer_config.json")
QWEN3 = str(TESTS / "data" / "qwen3_template" / "tokenizer_config.json")
G = 4
# three prompts over two replicas: two and one (the first replica one more)
QUESTIONS = ["123 + 456 + 789", "500 + 321 + 99", "111 + 222 + 333"]


def call(expression, name="calculator"):
    return '<tool_call>\n{"name": "%s", "arguments": {"expression": "%s"}}\n</tool_call>' % (name, expression)


def tool_script(prompt, j, k):
    """Sample j's turn k: a right call, bad JSON, an unknown tool, no call; then an answer."""
    question = prompt.split("What is ")[1].split("?")[0] if "What is " in prompt else "1+1"
    if k:
        return "\\boxed{%d}" % eval(question)  # the test's own sum
    return [call(question), "<tool_call>\n{oops}\n</tool_call>", call(question, "search"), "\\boxed{0}"][j]


def guess_script(prompt, j, k):
    """Sample j's guess k in guess_number (1 .. 8)."""
    return "I guess %d" % ((3 * j + 5 * k + len(prompt)) % 8 + 1)


class ScriptedEngine:
    """Each sample's turns as RolloutEngine.generate runs them: end_turn with the prompt's key (prompt_index) after a
    turn's stop token, the next turn from poll (empty: the conversation ended), up to max_turns; tool turns False in
    model_mask, their log-probs 0. `calls`: the prompt keys of each call."""

    def __init__(self, tokenizer, script):
        self.tok, self.script, self.calls = tokenizer, script, []
        self.stop = tokenizer.stop_token_ids[0]
        self.last_stats = {}

    def generate(self, prompts, params, prompt_index=None, return_logits=False, turns=None):
        keys = list(range(len(prompts))) if prompt_index is None else [int(k) for k in prompt_index]
        self.calls.append(keys)
        out = []
        for i, prompt in enumerate(prompts):
            text = self.tok.decode(prompt)
            for j in range(params.n):
                request, ids, mask, k = i * params.n + j, [], [], 0
                while True:
                    turn = self.tok.encode(self.script(text, j, k)) + [self.stop]
                    ids, mask = ids + turn, mask + [True] * len(turn)
                    if k == turns.max_turns or not turns.end_turn(request, keys[i], turn):
                        break
                    ready = []
                    while not ready:
                        ready = [t for r, t in turns.poll(True) if r == request]
                    if not ready[0]:  # the conversation ended (an environment's done)
                        break
                    ids, mask, k = ids + ready[0], mask + [False] * len(ready[0]), k + 1
                mask = np.array(mask)
                logp = np.where(mask, -0.5, 0.0).astype(np.float32)
                out.append(Completion(i, ids, "stop", logp, logp, mask, k))
        self.last_stats = {"new_tokens": sum(int(c.model_mask.sum()) for c in out), "tokens_per_s": 1.0,
                           "turns_cut": 0}
        return out


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return ensure_tiny_tokenizer(str(tmp_path_factory.mktemp("tiny") / "tokenizer"))


KINDS = {
    "tools": ({"tools": ["calculator"], "max_turns": 1, "tool_response_max_tokens": 16}, TOOLS_TEMPLATE, tool_script),
    "environment": ({"environment": "guess_number", "environment_settings": {"low": 1, "high": 8}, "max_turns": 2,
                     "tool_response_max_tokens": 16, "max_prompt_length": 128}, QWEN3, guess_script),
}


def on_threads(ranks, rank, got):
    """rank(r) for r in range(ranks), each on a thread of its own (a rank's result goes into `got`); `got` once every
    rank has given one."""
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(got) == ranks, "a rank failed (its thread's error is above)"
    return got


def one_call(kind, tokenizer, replicas, questions):
    """The conversations' generate call of `questions` on `replicas` ranks (1: one process, Conversations.generate):
    each rank's (result, the prompt keys of its engine's calls, its tool calls or environment steps by request)."""
    gen, template, script = KINDS[kind]
    cfg = from_dict(GRPOConfig, {"generate_config": dict(gen, tool_num_workers=1)})
    prompts = [tokenizer.encode(f"What is {q}?") for q in questions]
    params = SamplingParams(max_tokens=96, n=G, stop_token_ids=tuple(tokenizer.stop_token_ids), seed=3)
    world, got = ThreadWorld(replicas), {}

    def rank(r):
        conv = build_conversations(cfg, tokenizer, template)
        engine = ScriptedEngine(tokenizer, script)
        conv.start()
        try:
            if replicas == 1:
                result = conv.generate(engine, prompts, questions, params, tokenizer)
            else:
                conv = replica_conversations(conv)
                group = Group(tuple(range(replicas)), r, "world", True)
                result = conv.generate(DataParallelEngine(engine, world.rank(r), group), prompts, questions, params,
                                       tokenizer)
            got[r] = (result, engine.calls, dict(getattr(conv.turns, "calls", getattr(conv.turns, "steps", {}))))
        finally:
            conv.close()

    return on_threads(replicas, rank, got)


@pytest.mark.parametrize("kind", ["tools", "environment"])
@pytest.mark.parametrize("count", [3, 1])  # 1: the second replica has no prompt (a validation of fewer prompts)
def test_replicas_run_their_shares_conversations_and_every_rank_gets_the_one_process_call(kind, count, tokenizer):
    questions = QUESTIONS[:count]
    one = one_call(kind, tokenizer, 1, questions)[0]
    (ids, comps, columns, metrics), _, _ = one
    two = one_call(kind, tokenizer, 2, questions)
    # each replica generated its share only (the prompts' keys: their indices in the batch), ran only its share's
    # conversations (a tool call for 3 of every 4 samples; an environment's steps for each), none without a share
    shares = [[0, 1], [2]] if count == 3 else [[0], []]
    assert [two[r][1] for r in (0, 1)] == [[share] if share else [] for share in shares]
    assert [len(two[r][2]) for r in (0, 1)] == [len(share) * (3 if kind == "tools" else G) for share in shares]
    for r in (0, 1):
        (ids_r, comps_r, columns_r, metrics_r), _, _ = two[r]
        assert ids_r == [list(map(int, p)) for p in ids]  # an environment's: its resets, keyed by the whole batch
        assert [(c.prompt_index, c.token_ids, c.finish_reason, c.turns, list(c.model_mask)) for c in comps_r] == \
            [(c.prompt_index, c.token_ids, c.finish_reason, c.turns, list(c.model_mask)) for c in comps]
        assert columns_r == columns
        assert sorted(metrics_r) == sorted(metrics)
        for key, value in metrics.items():
            if key.endswith("/seconds"):
                assert metrics_r[key] > 0
            else:
                assert metrics_r[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    if kind == "tools":  # calls happened, failed and turned (the figures compared are not all zero)
        assert metrics["tool/errors"] == 2 * count and metrics["tool/calls_mean"] == 0.75
        assert metrics["turns/mean"] == 0.75 and 0 < metrics["turns/masked_fraction"] < 1
        assert columns["tool_calls"][0][0]["response"] == "1368"
    else:
        assert metrics["env/steps_mean"] > 1 and metrics["env/reward_mean"] > 0


def separate_call(kind, tokenizer, questions, rollout_ranks=2):
    """The same call under generate_config.placement separate: rank 0 trains (RemoteConversations over the samples
    meeting, RemoteRollout), ranks 1 .. R each a RolloutWorker running its share's conversations on its own workers
    (run_call, then send: the samples meeting and the value meeting). Rank 0's result; each rollout rank's (the prompt
    keys of its engine's calls, its tool calls or environment steps by request)."""
    from types import SimpleNamespace

    from mindgrpo.grpo.conversations import remote_conversations
    from mindgrpo.grpo.rollout_worker import RolloutWorker
    from mindgrpo.parallel.separate import Meeting, RemoteRollout

    gen, template, script = KINDS[kind]
    cfg = from_dict(GRPOConfig, {"generate_config": dict(gen, tool_num_workers=1), "rl_config": {"num_generations": G}})
    prompts = [tokenizer.encode(f"What is {q}?") for q in questions]
    params = SamplingParams(max_tokens=96, n=G, stop_token_ids=tuple(tokenizer.stop_token_ids), seed=3)
    world, got = ThreadWorld(1 + rollout_ranks), {}

    def rank(r):
        meeting = Meeting(world.rank(r), 1 << 20)
        conv = build_conversations(cfg, tokenizer, template)
        if r == 0:  # no workers: the rollout ranks run them
            try:
                got[r] = remote_conversations(conv, meeting).generate(RemoteRollout(meeting), prompts, questions,
                                                                      params, tokenizer)
            finally:
                conv.close()
            return
        engine = ScriptedEngine(tokenizer, script)
        engine.version = 0
        worker = RolloutWorker(cfg, engine, SimpleNamespace(parameters_and_names=lambda: []), None, meeting, (),
                               conversations=conv, tokenizer=tokenizer)
        conv.start()
        try:
            batch = SimpleNamespace(ids=prompts, columns={"prompt": list(questions)})
            worker.send(worker.run_call(batch, params, 0.0))
            got[r] = (engine.calls, dict(getattr(conv.turns, "calls", getattr(conv.turns, "steps", {}))))
        finally:
            worker.close()

    return on_threads(1 + rollout_ranks, rank, got)


@pytest.mark.parametrize("kind", ["tools", "environment"])
@pytest.mark.parametrize("count, rollout_ranks", [(3, 2), (1, 2), (3, 1)])
def test_separate_rollout_ranks_run_their_shares_and_the_training_rank_gets_the_one_process_call(kind, count,
                                                                                                 rollout_ranks,
                                                                                                 tokenizer):
    """Each rollout rank runs its share's conversations only (count 1: the second has no prompt, as a small
    validation), hands its rows over at its share's and its ReplicaValue after; the training rank merges them into
    the one-process call: the prompts as generated, the trajectories, columns and metrics (one rollout rank: bit for
    bit, as before the merge)."""
    questions = QUESTIONS[:count]
    (ids, comps, columns, metrics), _, _ = one_call(kind, tokenizer, 1, questions)[0]
    got = separate_call(kind, tokenizer, questions, rollout_ranks)
    shares = [[0, 1, 2][:count]] if rollout_ranks == 1 else [[0, 1], [2]] if count == 3 else [[0], []]
    assert [got[r][0] for r in range(1, 1 + rollout_ranks)] == [[share] if share else [] for share in shares]
    assert [len(got[r][1]) for r in range(1, 1 + rollout_ranks)] == \
        [len(share) * (3 if kind == "tools" else G) for share in shares]
    ids_s, comps_s, columns_s, metrics_s = got[0]
    assert ids_s == [list(map(int, p)) for p in ids]
    assert [(c.prompt_index, c.token_ids, c.finish_reason, c.turns, list(c.model_mask)) for c in comps_s] == \
        [(c.prompt_index, c.token_ids, c.finish_reason, c.turns, list(c.model_mask)) for c in comps]
    assert columns_s == columns and sorted(metrics_s) == sorted(metrics)
    for key, value in metrics.items():
        if key.endswith("/seconds"):
            assert metrics_s[key] > 0
        elif len([s for s in shares if s]) == 1:
            assert metrics_s[key] == value, key
        else:
            assert metrics_s[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def test_replica_metrics_combine_by_their_rules():
    """Counts and seconds summed, per-sample means weighted by samples, the masked fraction by trajectory tokens; the
    columns end to end in replica order; a metric without a rule is refused."""
    from mindgrpo.grpo.conversations import ReplicaValue

    a = ReplicaValue([[1], [2]], {"tool_calls": [["x"]] * 8}, {"tool/calls_mean": 0.5, "tool/errors": 2.0,
                                                               "turns/masked_fraction": 0.25}, 8, 100)
    b = ReplicaValue([[3]], {"tool_calls": [["y"]] * 4}, {"tool/calls_mean": 1.0, "tool/errors": 1.0,
                                                          "turns/masked_fraction": 0.5}, 4, 300)
    one = {"tool/calls_mean": 0.1, "turns/masked_fraction": 0.1}
    assert merge_replicas([b._replace(metrics=one, samples=3)], 1)[2] == one  # one value: its own, not 0.1 * 3 / 3
    ids, columns, metrics = merge_replicas([a, b], 3)
    assert ids == [[1], [2], [3]] and columns["tool_calls"] == [["x"]] * 8 + [["y"]] * 4
    assert metrics == {"tool/calls_mean": (4 + 4) / 12, "tool/errors": 3.0, "turns/masked_fraction": (25 + 150) / 400}
    assert {"sum", "samples", "tokens"} == set(COMBINED.values())
    with pytest.raises(KeyError, match="tool/new"):
        merge_replicas([a._replace(metrics={"tool/new": 1.0})], 2)
    with pytest.raises(RuntimeError, match="2 prompts came back of 3"):
        merge_replicas([a], 3)
