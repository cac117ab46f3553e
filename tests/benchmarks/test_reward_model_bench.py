"""benchmarks.reward_model's workload and report (no run: a 0.5B-shaped model compiles and scores for minutes)."""

import numpy as np

from benchmarks.reward_model import SIDES, markdown, workload


def test_the_work_is_prompts_of_32_to_128_and_completions_of_100_to_1000_tokens():
    seqs = workload(256, 100, 1000, 151936)
    lengths = np.array([len(q) for q in seqs])
    assert len(seqs) == 256 and lengths.min() >= 132 and lengths.max() <= 1128
    assert lengths.max() - lengths.min() > 800  # the whole range is drawn, not one length
    assert all(10 <= t < 151936 for q in seqs for t in q)
    assert workload(256, 100, 1000, 151936) == seqs  # the same for every side


def test_the_report_sets_each_side_against_transformers():
    sides = {s: {"seconds": t, "tokens_per_s": 1000 / t, "gflops_per_s": 10 / t, "max_abs_vs_transformers": 1e-5}
             for s, t in zip(SIDES, (4.0, 2.0, 8.0))}
    res = {"sides": sides, "matmul_gflops": {"mindspore": {"peak": 50.0}, "torch": {"peak": 60.0}},
           "peak_rss_gb": {"ours": 3.0, "transformers": 2.5}, "load_average_end": "1.0 1.0 1.0",
           "stamp": {"date": "2026-01-01", "command": "python -m benchmarks.reward_model", "machine": "m",
                     "load_average": "1.0", "code": "commit x", "repeats": 1},
           "workload": {"count": 256, "layers": 24, "tokens": 1000, "length_mean": 600.0, "length_max": 1128,
                        "decoder_params": 358_000_000, "micro": 8, "max_tokens": 8192}}
    text = markdown(res)
    assert "| packed | 2.0 | 500 | 5.0 | 4.00x |" in text and "| padded | 4.0 | 250 | 2.5 | 2.00x |" in text
    assert "MindSpore 50.0 GFLOP/s, PyTorch 60.0 GFLOP/s" in text
