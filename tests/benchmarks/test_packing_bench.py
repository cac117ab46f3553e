"""benchmarks.packing's workload and result layout (no run: its sides compile for minutes)."""

import numpy as np

from benchmarks.packing import SIDES, padded_len, summary, workload


def test_the_long_tail_has_mean_about_0_3_of_max_and_reaches_max():
    prompts, responses, adv = workload("longtail", 32, 512, 4096)
    lengths = np.array([len(r) for r in responses])
    assert len(prompts) == len(responses) == len(adv) == 32
    assert 0.25 * 512 <= lengths.mean() <= 0.35 * 512 and lengths.max() == 512 and lengths.min() >= 16
    assert np.median(lengths) < lengths.mean()  # long-tailed: most responses are short
    longest = max(len(p) + len(r) for p, r in zip(prompts, responses))
    assert padded_len(prompts, responses) % 32 == 0 and 0 <= padded_len(prompts, responses) - longest < 32
    assert all(0 <= t < 4096 for r in responses for t in r)


def test_equal_samples_are_one_length_the_long_tails_means():
    long_p, long_r, _ = workload("longtail", 32, 512, 4096)
    prompts, responses, _ = workload("equal", 32, 512, 4096)
    assert {len(p) + len(r) for p, r in zip(prompts, responses)} == {
        round(np.mean([len(p) for p in long_p])) + round(np.mean([len(r) for r in long_r]))}


def test_the_summary_has_the_issues_keys():
    details = {side: {"step_s": float(i + 1), "peak_rss_gb": 10.0 + i} for i, side in enumerate(SIDES)}
    assert summary(details) == {"padded_s": 1.0, "budget_s": 2.0, "packed_s": 3.0, "trl_s": 4.0,
                                "padded_peak_rss_gb": 10.0, "packed_peak_rss_gb": 12.0}
