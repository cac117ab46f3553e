"""The host side of the rollout engine, simulated with random sample lengths: every request decodes
once, each prompt is prefilled once, a copy's source holds the same prompt's rows, no slot idles
while requests wait."""

import numpy as np
import pytest

from mindgrpo.inference.scheduler import SlotScheduler, halving_bucket, halving_buckets, pow2_bucket


def simulate(prompts, group, slots, seed):
    """Runs the scheduler against random sample lengths, checking each step; returns the trace."""
    rng = np.random.default_rng(seed)
    length = rng.geometric(0.15, prompts * group)  # tokens of each request
    sched = SlotScheduler(prompts, group, slots)
    holds = np.full(slots, -1)  # which prompt's rows each slot's cache holds (positions before the last prompt token)
    count = np.zeros(slots, np.int64)
    started, prefilled, decoded = [], [], np.zeros(prompts * group, np.int64)
    copies = idle_while_waiting = 0
    while True:
        adm = sched.admit()
        for p, s in zip(adm.prefill_prompts, adm.prefill_slots):
            assert sched.request[s] // group == p
            holds[s] = p
        prefilled += adm.prefill_prompts
        for s, d in zip(adm.copy_src, adm.copy_dst):
            assert holds[s] == sched.request[d] // group  # the source has the destination's prompt
            assert sched.request[s] // group == holds[s]  # and is decoding one of its samples
        for s, d in zip(adm.copy_src, adm.copy_dst):
            holds[d] = holds[s]
        copies += len(adm.copy_dst)
        for s in adm.started:
            assert holds[s] == sched.request[s] // group  # every started sample finds its prompt's rows
            started.append(int(sched.request[s]))
            count[s] = 0
        live = sched.live()
        if live.size == 0:
            assert not sched.pending()
            break
        if live.size < slots and sched.pending():
            idle_while_waiting += 1
        count[live] += 1
        decoded[sched.request[live]] += 1
        sched.finish(live[count[live] >= length[sched.request[live]]])
    return started, prefilled, decoded, length, copies, idle_while_waiting


@pytest.mark.parametrize("prompts, group, slots", [(9, 4, 6), (5, 8, 64), (12, 1, 5), (7, 3, 1), (16, 8, 8)])
def test_every_request_once_every_prompt_prefilled_once_and_no_idle_slot_while_waiting(prompts, group, slots):
    for seed in range(5):
        started, prefilled, decoded, length, copies, idle = simulate(prompts, group, slots, seed)
        assert sorted(started) == list(range(prompts * group))
        assert started == sorted(started)  # admitted in order, prompt by prompt
        assert prefilled == list(range(prompts))
        np.testing.assert_array_equal(decoded, length)
        assert idle == 0
        assert copies <= prompts * (group - 1)  # handed-over slots need no copy


def test_a_finished_sample_hands_its_slot_to_its_prompts_next_sample():
    sched = SlotScheduler(prompts=2, group=3, slots=2)
    adm = sched.admit()
    assert adm.prefill_prompts == [0] and adm.prefill_slots == [0] and (adm.copy_src, adm.copy_dst) == ([0], [1])
    sched.finish(np.array([1]))  # request 1 ends; request 2 (prompt 0) takes slot 1 without a copy
    adm = sched.admit()
    assert adm.started == [1] and not adm.copy_dst and not adm.prefill_prompts and sched.request[1] == 2
    sched.finish(np.array([0, 1]))  # prompt 0 is done: prompt 1 is prefilled into slot 0, copied to 1
    adm = sched.admit()
    assert adm.prefill_prompts == [1] and adm.prefill_slots == [0] and (adm.copy_src, adm.copy_dst) == ([0], [1])


@pytest.mark.parametrize("n, low, high, expected", [(1, 1, 64, 1), (5, 1, 64, 8), (33, 8, 64, 64), (3, 8, 64, 8),
                                                    (70, 8, 100, 100), (0, 32, 544, 32), (300, 32, 544, 512)])
def test_pow2_bucket(n, low, high, expected):
    assert pow2_bucket(n, low, high) == expected


@pytest.mark.parametrize("n, cap, low, expected", [(1, 544, 32, 34), (35, 544, 32, 68), (300, 544, 32, 544),
                                                   (272, 544, 32, 272), (5, 64, 8, 8), (9, 64, 8, 16), (3, 5, 8, 5),
                                                   (1, 100, 8, 13), (14, 100, 8, 25)])
def test_halving_bucket(n, cap, low, expected):
    assert halving_bucket(n, cap, low) == expected


@pytest.mark.parametrize("cap, low, expected", [(64, 8, [64, 32, 16, 8]), (100, 8, [100, 50, 25, 13]),
                                                (544, 32, [544, 272, 136, 68, 34]), (3, 8, [3]), (5, 1, [5, 3, 2, 1])])
def test_halving_buckets_are_every_bucket_halving_bucket_returns(cap, low, expected):
    assert halving_buckets(cap, low) == expected
    assert sorted({halving_bucket(n, cap, low) for n in range(cap + 1)}, reverse=True) == expected
