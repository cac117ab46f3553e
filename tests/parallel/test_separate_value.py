"""The meetings of generate_config.placement separate (parallel/separate.Meeting) between threads that stand in for the
ranks, summing through a host-side stand-in for the world's AllReduce (float32 on the wire, as Comm.host_sum): the
value meeting (what each rollout rank's conversations give besides the tokens: the prompts, the reward columns, the
metrics) arrives whole on the training rank, in rollout rank order; the samples meeting of a rollout group of
several ranks brings the training rank every rank's share at its rows, in prompt order, and the group's figures."""

import functools
import threading
from types import SimpleNamespace
from typing import Optional

import numpy as np
import pytest

from mindgrpo.inference.engine import Completion
from mindgrpo.parallel.comm import Group
from mindgrpo.parallel.layout import ParallelLayout
from mindgrpo.parallel.separate import FIGURES, Meeting, check_prompts, group_figures, prompt_check


class ThreadWorld:
    """Comm's world of `size` ranks for as many threads, the first `trainers` of them training: host_sum adds the
    arrays of the threads of its group (comm.Group: the world's, or the training group's, `train_dp`) in float32;
    `rank(r)` is rank r's view (its Comm)."""

    def __init__(self, size: int = 2, trainers: int = 1, train: Optional[ParallelLayout] = None, rollout_tp: int = 1):
        """train: the training layout (default: `trainers` data-parallel replicas); rollout_tp: the rollout replicas'
        tensor-parallel pieces."""
        self.train = train or ParallelLayout(dp=trainers)
        self.world, self.trainers = size, self.train.world_size
        self.infer = ParallelLayout(dp=max(1, (size - self.trainers) // rollout_tp), tp=rollout_tp)
        self.lock = threading.Lock()
        self.barriers, self.parts = {}, {}

    def rank(self, r: int):
        return SimpleNamespace(rank=r, world=self.world, train=self.train, infer=self.infer,
                               group=lambda ranks: Group(tuple(ranks), r, "world", True),
                               train_dp=Group(tuple(range(self.trainers)), r, "train"), host_sum=self.host_sum)

    def host_sum(self, values, group):
        values = np.asarray(values)
        with self.lock:
            barrier = self.barriers.setdefault(group.ranks, threading.Barrier(group.size))
            self.parts.setdefault(group.ranks, {})[threading.get_ident()] = values.astype(np.float32)
        barrier.wait()
        total = functools.reduce(np.add, self.parts[group.ranks].values())  # not sum(): 0 + -0.0 is +0.0
        barrier.wait()
        return total.reshape(values.shape).astype(values.dtype)


def meet(world: ThreadWorld, call):
    """call(rank, meeting) on every rank (rank 0 in this thread); each rank's result."""
    got = {}
    threads = [threading.Thread(target=lambda r=r: got.setdefault(r, call(r, Meeting(world.rank(r), 1 << 20))))
               for r in range(1, world.world)]
    for t in threads:
        t.start()
    got[0] = call(0, Meeting(world.rank(0), 1 << 20))
    for t in threads:
        t.join()
    return got


@pytest.mark.parametrize("trainers, replicas", [(1, 1), (1, 3), (2, 1)])
def test_the_value_meeting_brings_every_rollout_ranks_conversation_values_whole(trainers, replicas):
    """Each rollout rank's value in rollout rank order (None where a rank had no prompts: the second of three), on
    every rank (each training rank of a training group too); what a training rank passes is not given."""
    value = ([[1, 2, 3], [4, 5]],
             {"tool_calls": [[{"name": "calculator", "arguments": {"expression": "1+2"}, "status": "ok",
                               "response": "3"}], []],
              "messages": [[{"role": "assistant", "content": "é ü \x00 " + "x" * 5000}], []]},
             {"tool/calls_mean": 0.5, "tool/seconds": 0.1 + 0.2, "turns/masked_fraction": 1 / 3})
    world = trainers + replicas
    given = {r: None if r == trainers + 1 else (r, *value) for r in range(trainers, world)}
    given.update({r: ("a training rank's", value) for r in range(trainers)})
    got = meet(ThreadWorld(world, trainers), lambda rank, meeting: meeting.values(given[rank]))
    want = [given[r] for r in range(trainers, world)]
    assert sorted(got) == list(range(world)) and all(got[r] == want for r in range(world))
    assert got[0][0][3]["tool/seconds"] == 0.1 + 0.2  # floats bit for bit, tuples stay tuples
    assert isinstance(got[0][0], tuple)


def sample(prompt: int, k: int, length: int) -> Completion:
    """Sample k of prompt `prompt`: distinct tokens, log-probs and versions, `length` tokens."""
    tokens = [100 * prompt + 10 * k + t for t in range(length)]
    steps = np.arange(1, length + 1, dtype=np.float32)
    return Completion(prompt, tokens, "stop" if length % 2 else "length", np.float32(-0.1) * steps,
                      np.float32(-0.2) * steps, versions=np.full(length, prompt % 3, np.int64))


@pytest.mark.parametrize("replicas, groups, tp", [(2, 3, 1), (3, 3, 1), (3, 4, 1), (2, 3, 2)])
def test_the_samples_meeting_of_several_rollout_ranks_gives_every_share_at_its_rows(replicas, groups, tp):
    """Rollout replica i (ranks 1 + i tp .. 1 + (i + 1) tp - 1) generates share i of the groups (contiguous, the first
    replicas one more when uneven) and hands its rows over at their offset: the training rank gets every group's
    samples in prompt order, as one rollout rank would give them, each replica's figures (the group's: tokens summed,
    seconds the slowest's) and its prompt check. With tp = 2 both pieces of a replica hold its samples and figures,
    and only the first gives them (counted twice they would arrive doubled)."""
    n, width = 2, 6
    prompts = [[7 + g, 3 * g + 1] for g in range(groups)]
    whole = [sample(g, k, 2 + (g + k) % 4) for g in range(groups) for k in range(n)]

    def call(rank, meeting):
        if rank == 0:
            return meeting.samples(None, groups * n, n, width)
        mine = meeting.share(groups)
        comps = [c for c in whole if c.prompt_index in set(mine)]
        figures = dict.fromkeys(FIGURES, 0.0)
        i = meeting.index + 1  # the replica's number from 1
        figures.update(new_tokens=float(sum(len(c.token_ids) for c in comps)), generate_seconds=float(i),
                       wait_seconds=0.5 * i, version=4.0, prompt_check=prompt_check([prompts[g] for g in mine]),
                       useful_fraction=0.25 * i)
        return meeting.samples(comps, groups * n, n, width, figures, first=int(mine[0]) * n if len(mine) else 0)

    world = 1 + replicas * tp
    got = meet(ThreadWorld(world, rollout_tp=tp), call)
    shares = [list(Meeting(ThreadWorld(world, rollout_tp=tp).rank(r), 1).share(groups)) for r in range(1, world, tp)]
    assert all(list(Meeting(ThreadWorld(world, rollout_tp=tp).rank(r), 1).share(groups)) == shares[(r - 1) // tp]
               for r in range(1, world))  # a replica's pieces generate the same share
    assert sorted(g for s in shares for g in s) == list(range(groups))  # every group once, whole
    assert [len(s) for s in shares] == sorted((len(s) for s in shares), reverse=True)  # uneven: the first ranks more
    for rank in range(world):  # every rank gets the whole step (the rollout ranks ignore it)
        comps, numbers, ranks = got[rank]
        assert numbers == list(range(groups))
        assert [(c.prompt_index, c.token_ids, c.finish_reason, c.turns, c.model_mask) for c in comps] == \
            [(k // n, c.token_ids, c.finish_reason, 0, None) for k, c in enumerate(whole)]
        for a, b in zip(comps, whole):
            assert a.logprobs.tobytes() == b.logprobs.tobytes() and a.versions.tolist() == b.versions.tolist()
            assert a.sampling_logprobs.tobytes() == b.sampling_logprobs.tobytes()
        assert [r["generate_seconds"] for r in ranks] == [float(r) for r in range(1, 1 + replicas)]
    figures = group_figures(got[0][2])
    assert figures["new_tokens"] == sum(len(c.token_ids) for c in whole)
    assert figures["generate_seconds"] == replicas and figures["wait_seconds"] == 0.5 * replicas
    assert figures["wait_seconds_sum"] == 0.5 * replicas * (replicas + 1) / 2 and figures["version"] == 4.0
    assert figures["useful_fraction"] == pytest.approx(0.25 * (replicas + 1) / 2)
    assert sorted(figures["replicas"]) == sorted(f"rollout{i}/{k}" for i in range(replicas)
                                                 for k in ("tokens_per_s", "wait_seconds"))
    first = sum(len(whole[k].token_ids) for k in range(len(shares[0]) * n))
    assert figures["replicas"]["rollout0/tokens_per_s"] == first  # its tokens in its 1 s
    check_prompts(figures, prompts, 1, tp)  # each replica generated its share of these prompts
    with pytest.raises(RuntimeError, match=f"rollout rank {1 + (replicas - 1) * tp} generated other prompts"):
        check_prompts(figures, prompts[:-1] + [[1]], 1, tp)  # the last prompt is the last replica's (its first rank)
    with pytest.raises(RuntimeError, match=f"rollout rank {2 + (replicas - 1) * tp} generated other prompts"):
        check_prompts(figures, prompts[:-1] + [[1]], 2, tp)  # after two training ranks


@pytest.mark.parametrize("apart", [0.0, 0.25])
def test_two_training_ranks_give_rank_0s_weights_and_rank_1_checks_its_own_against_them(apart):
    """Training ranks 0 and 1 (actor_config.parallel_config.data_parallel 2) and one rollout rank: the weights meeting
    sets the rollout rank's copy to rank 0's weights (rank 1 gives zeros: counted twice they would arrive doubled);
    rank 1 keeps its own and both training ranks learn their largest difference (0.0 when the data-parallel updates
    kept them equal); the start meeting takes rank 0's position only."""
    from mindspore import Parameter, Tensor

    rng = np.random.default_rng(0)
    values = {"a.weight": rng.standard_normal((3, 4)).astype(np.float32),
              "b.bias": rng.standard_normal(5).astype(np.float32)}
    moved = {0: 0.0, 1: apart, 2: -1.0}  # rank 1 `apart` from rank 0 at one value; the rollout rank's copy stale

    def call(rank, meeting):
        params = {n: Parameter(Tensor(v.copy()), name=n) for n, v in values.items()}
        params["b.bias"].set_data(Tensor(values["b.bias"] + np.float32(moved[rank]) * (np.arange(5) == 2)))
        figures = meeting.weights(params)
        start = meeting.start((3, 1, 7 + rank, 0) if rank < 2 else None)
        return figures, {n: p.asnumpy() for n, p in params.items()}, start

    got = meet(ThreadWorld(3, trainers=2), call)
    for rank in (0, 2):  # rank 0 kept its weights, the rollout rank received them bit for bit
        assert all(got[rank][1][n].tobytes() == values[n].tobytes() for n in values)
    assert got[1][1]["b.bias"][2] == values["b.bias"][2] + np.float32(apart)  # rank 1 keeps its own
    assert got[0][0]["sync/train_weights_max_diff"] == got[1][0]["sync/train_weights_max_diff"] == \
        pytest.approx(apart)
    assert "sync/train_weights_max_diff" not in got[2][0]  # the rollout rank is not in the training group
    assert all(got[r][2] == ((3, 1, 7, 0), []) for r in range(3))  # rank 0's resume position, not rank 1's added


@pytest.mark.parametrize("train, rollout_tp", [(ParallelLayout(tp=2), 2), (ParallelLayout(dp=2, tp=2), 1),
                                               (ParallelLayout(pp=2), 2), (ParallelLayout(tp=2, pp=2), 1)])
def test_the_weights_meeting_makes_the_whole_weights_of_the_pieces_and_gives_each_rollout_rank_its_own(train,
                                                                                                      rollout_tp):
    """A training group of replicas in pieces (tensor-parallel pieces, pipeline stages) and a rollout group of replicas
    of `rollout_tp` pieces: each rank of the first training replica gives its pieces in their places, and every
    rollout rank ends with its piece of the whole weights, bit for bit (-0.0 and a subnormal-free spread of values
    included); the training ranks keep theirs, a second replica's ranks compare theirs with the first's (0.0)."""
    from mindspore import Parameter, Tensor

    rng = np.random.default_rng(1)
    # one decoder layer per stage: column-, row-parallel and replicated weights, the embedding and lm_head
    shapes = {"model.tok_embeddings.embedding_weight": (8, 4), "lm_head.weight": (8, 4), "model.norm_out.weight": (4,)}
    for layer in range(train.pp):
        shapes.update({f"model.layers.{layer}.attention.wq.weight": (4, 4),
                       f"model.layers.{layer}.attention.wq.bias": (4,),
                       f"model.layers.{layer}.attention.wo.weight": (4, 4),
                       f"model.layers.{layer}.attention_norm.weight": (4,)})
    whole = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}
    whole["model.norm_out.weight"][1] = -0.0
    whole["lm_head.weight"][0, 0] = -0.0
    trainers = train.world_size
    rollout = ParallelLayout(tp=rollout_tp)

    def held(rank: int) -> dict:
        """The training rank's pieces of its stage (layers.s on stage s; the embedding first, the head and norm
        last)."""
        stage, (_, piece) = train.stage(rank), train.coords(rank)
        names = [n for n in shapes if train.param_stage(n, train.pp) == stage]
        return {n: np.ascontiguousarray(train.shard(n, whole[n], piece)) for n in names}

    def call(rank, meeting):
        if rank < trainers:
            mine = held(rank)
            params = {n: Parameter(Tensor(v.copy()), name=n) for n, v in mine.items()}
            figures = meeting.weights(params, shapes if train.pp > 1 else None)  # stages: the whole model's names
        else:
            piece = (rank - trainers) % rollout_tp
            params = {n: Parameter(Tensor(np.zeros(rollout.shard(n, whole[n], piece).shape, np.float32)), name=n)
                      for n in shapes}
            figures = meeting.weights(params)
        return figures, {n: p.asnumpy() for n, p in params.items()}

    world = ThreadWorld(trainers + 2, train=train, rollout_tp=rollout_tp)
    got = meet(world, call)
    for r in range(trainers):  # the training ranks keep their pieces
        assert all(got[r][1][n].tobytes() == v.tobytes() for n, v in held(r).items())
        if train.dp > 1:
            assert got[r][0]["sync/train_weights_max_diff"] == 0.0
    for r in range(trainers, trainers + 2):  # each rollout rank its piece of the whole weights, bit for bit
        piece = (r - trainers) % rollout_tp
        assert all(got[r][1][n].tobytes() == np.ascontiguousarray(rollout.shard(n, whole[n], piece)).tobytes()
                   for n in shapes), r
        assert got[r][0]["sync/bytes"] == 4 * sum(int(np.prod(v)) for v in shapes.values())


@pytest.mark.parametrize("trainers, replicas", [(1, 1), (2, 2)])
def test_dynamic_samplings_count_of_prompts_to_draw_again_is_training_rank_0s_on_every_rank(trainers, replicas):
    """Meeting.more_prompts after each rollout of a step (rl_config.dynamic_sampling): training rank 0's count reaches
    every rank, a training rank beside it giving zeros (it decides the same from the same rewards), the rollout ranks
    nothing: 5 more prompts, then 0 (the step's rollouts are complete)."""
    world = trainers + replicas
    for count in (5, 0):
        got = meet(ThreadWorld(world, trainers),
                   lambda rank, meeting: meeting.more_prompts(count if rank < trainers else None))
        assert got == {r: count for r in range(world)}


@pytest.mark.parametrize("pattern, rl", [
    ("informative", {"max_resample_times": 3}),  # groups kept in rounds 0, 2: a prompt drawn again twice
    ("none", {"max_resample_times": 1}),  # no group ever kept: the rounds run out
])
def test_rollout_ranks_decide_a_steps_rounds_as_the_trainer_does(pattern, rl):
    """RolloutWorker.rounds on a rollout group of two beside one training rank (dynamic sampling decided by the rollout
    ranks): each scores its share of every round with the run's rewards, their counts of groups with a spread meet
    (Meeting.replica_counts), and they draw the rounds the trainer's `collect` draws on one engine (tests/grpo/
    test_dynamic_sampling.py's scripted engine and rewards), each rank its share of each, each round's figure "more"
    the count the trainer's next round draws."""
    from grpo.test_dynamic_sampling import Rewards, ScriptedEngine, Tok, informative, make_trainer, prompts
    from mindgrpo.grpo.rollout_worker import RolloutWorker
    from mindgrpo.parallel.data_parallel import share

    patterns = {"informative": informative, "none": lambda k: [False] * 4}
    trainer, engine = make_trainer(patterns[pattern], dynamic_sampling=True, **rl)
    trainer.collect()  # the trainer's rounds: engine.calls, and after each the count of prompts it draws next

    class ShareEngine(ScriptedEngine):
        version = 0

        def generate(self, prompts, params, prompt_index=None):
            return super().generate(prompts, params)

    def call(rank, meeting):
        if rank == 0:
            return None
        mine = ShareEngine(patterns[pattern])
        worker = RolloutWorker(trainer.cfg, mine, SimpleNamespace(parameters_and_names=lambda: []), prompts(), meeting,
                               (1,), tokenizer=Tok(), rewards=Rewards())
        return mine.calls, [s.figures["more"] for s in worker.rounds(1)]

    got = meet(ThreadWorld(3, 1), call)
    for i in (0, 1):  # rollout rank 1 + i: its share of every round it had prompts in
        shares = [[call[k] for k in share(len(call), 2, i)] for call in engine.calls]
        assert got[1 + i][0] == [s for s in shares if s]
        assert got[1 + i][1] == engine.told  # e.g. 1, 1, 0: the prompts still wanted, then 0 once the step is full
    assert len(engine.calls) == len(engine.told) > 1


def test_the_training_ranks_follow_the_rollout_ranks_count_of_further_rollouts(caplog):
    """RemoteRollout.next_round: with dynamic sampling decided by the rollout ranks the next rollout draws the count
    their last samples meeting's figures gave ("more"), whatever the training rank's own (a warning names both when
    they differ), and no meeting is held for it; decided by the training rank (reward models or judges), its count goes
    to the rollout ranks (Meeting.more_prompts) and is the one drawn."""
    from mindgrpo.parallel.separate import RemoteRollout

    told = []
    meeting = SimpleNamespace(more_prompts=told.append)
    remote = RemoteRollout(meeting, resamples=True)
    for theirs, mine in ((2, 2), (0, 1), (3, 1)):
        remote.last_stats = {"more": float(theirs)}
        caplog.clear()
        assert remote.next_round(mine) == theirs
        assert ("draw %d prompts again where this rank's rewards say %d" % (theirs, mine) in caplog.text) \
            == (theirs != mine)
    assert told == []
    remote = RemoteRollout(meeting, resamples=False)
    assert remote.next_round(3) == 3 and remote.next_round(0) == 0 and told == [3, 0]


@pytest.mark.parametrize("turns", [None, SimpleNamespace(max_turns=2, max_turn_tokens=5)])
def test_the_training_rank_checks_its_draw_against_the_rollout_ranks_with_conversations_too(turns):
    """RemoteRollout.generate: each rollout rank's prompt check names the prompts it drew (with conversations too: an
    environment writes others from them); the training rank compares its own draw with it, with or without
    conversations (`turns`), and refuses a data order that differs, naming the rollout rank."""
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.parallel.separate import RemoteRollout

    drawn = [[5, 6], [7, 8, 9], [4]]
    params = SamplingParams(max_tokens=3, n=2)

    class OneRolloutRank:  # the samples meeting as the training rank sees it: rank 1's figures
        trainers, tp = 1, 1  # one training rank, a rollout replica of one rank

        def samples(self, comps, rows, n, width):
            assert (rows, n, width) == (6, 2, 3 + (0 if turns is None else 10))
            figures = dict(dict.fromkeys(FIGURES, 0.0), generate_seconds=1.0, prompt_check=prompt_check(drawn))
            return [], list(range(3)), [figures]

    engine = RemoteRollout(OneRolloutRank())
    assert engine.generate(drawn, params, turns=turns) == []
    with pytest.raises(RuntimeError, match="rollout rank 1 generated other prompts than the training rank trains on"):
        engine.generate(drawn[:2] + [[3]], params, turns=turns)  # the last prompt drawn differs
