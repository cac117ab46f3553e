"""benchmarks.packing's workload, result layout and --keep (no run: its sides compile for minutes)."""

import json

import numpy as np
import pytest

from benchmarks.packing import SIDES, kept, markdown, padded_len, summary, workload


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


def _details(value):
    side = {"step_s": value, "peak_rss_gb": value, "vs_padded": 1.0, "shapes": [[4, 576, 4]]}
    work = {"samples": 32, "response_mean": 165.0, "response_max": 512, "padded_len": 576, "tokens": 7900}
    return {"longtail": dict({s: dict(side) for s in SIDES}, workload=work)}


def test_keep_carries_the_workloads_this_run_does_not_measure_with_their_own_stamps(tmp_path):
    old_stamp = {"command": "python -m benchmarks.packing --configs a", "date": "2026-11-25", "machine": "m",
                 "load_average": "0.1 0.2 0.3"}
    stored = {"stamp": old_stamp, "repeats": 3,  # the layout before per-config stamps
              "configs": {"a": {"longtail": summary(_details(1.0)["longtail"])},
                          "b": {"longtail": summary(_details(2.0)["longtail"])}},
              "details": {"a": _details(1.0), "b": _details(2.0)}}
    path = tmp_path / "update.json"
    path.write_text(json.dumps(stored))
    new_stamp = dict(old_stamp, command="python -m benchmarks.packing --configs b", date="2026-11-26", repeats=2)
    res = kept(str(path), {"stamp": new_stamp, "configs": {}, "details": {}, "stamps": {}}, ["b"], ["longtail"])
    assert list(res["configs"]) == ["a"] and res["details"]["a"] == stored["details"]["a"]
    assert res["stamps"] == {"a": {"longtail": dict(old_stamp, repeats=3)}}
    res["configs"]["b"], res["details"]["b"], res["stamps"]["b"] = {"longtail": summary(_details(5.0)["longtail"])}, \
        _details(5.0), {"longtail": new_stamp}
    table = markdown(res)
    assert "a longtail: `python -m benchmarks.packing --configs a` on 2026-11-25" in table and "3 rounds" in table
    assert "b longtail: `python -m benchmarks.packing --configs b` on 2026-11-26" in table and "2 rounds" in table
    assert "| a | longtail | 1.00 |" in table and "| b | longtail | 5.00 |" in table
    # a file of the current layout: a workload of a measured config that this run does not measure
    # stays (b's longtail beside a run of b's equal), with its own stamp
    path.write_text(json.dumps(res))
    again = kept(str(path), {"configs": {}, "details": {}, "stamps": {}}, ["a", "b"], ["equal"])
    assert again["stamps"] == {"a": {"longtail": dict(old_stamp, repeats=3)}, "b": {"longtail": new_stamp}}
    assert again["configs"]["b"] == res["configs"]["b"]
    assert kept(str(path), {"configs": {}, "details": {}, "stamps": {}}, ["a"], ["longtail"])["stamps"] == {
        "b": {"longtail": new_stamp}}
    # the layout of one stamp per config (2026-11-26): that stamp for each of its workloads
    per_config = dict(res, stamps={"a": dict(old_stamp, repeats=3), "b": new_stamp})
    path.write_text(json.dumps(per_config))
    assert kept(str(path), {"configs": {}, "details": {}, "stamps": {}}, ["a"], ["longtail"])["stamps"] == {
        "b": {"longtail": new_stamp}}


def test_keep_refuses_a_file_that_is_not_a_results_file_naming_it(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"configs": {"a": {}}}))
    with pytest.raises(SystemExit, match=f"--keep {path}: not a benchmarks.packing results file"):
        kept(str(path), {"configs": {}, "details": {}, "stamps": {}}, [], [])


def test_packing_memory_splits_a_sides_readings_by_phase_and_new_shape():
    from benchmarks.packing_memory import split

    a, b = [4, 576, 4, 2048], [3, 128, 3, 160]
    readings = [("models", 0, None, 1.0),
                ("reference", 1, a, 1.5), ("reference", 1, b, 1.75), ("reference done", 1, None, 1.75),
                ("update", 1, a, 2.5), ("update", 1, a, 2.5), ("update", 1, b, 3.0), ("update done", 1, None, 3.25),
                ("reference", 2, a, 3.25), ("reference done", 2, None, 3.25), ("update", 2, a, 3.25),
                ("update done", 2, None, 3.5)]
    got = split(readings)
    assert (got["models_gb"], got["reference_gb"], got["update_gb"], got["step2_gb"]) == (1.0, 0.75, 1.5, 0.25)
    assert got["per_shape"] == [{"phase": "reference", "shape": a, "added_gb": 0.5},
                                {"phase": "reference", "shape": b, "added_gb": 0.25},
                                {"phase": "update", "shape": a, "added_gb": 0.75},
                                {"phase": "update", "shape": b, "added_gb": 0.5}]
