"""scripts/grpo_one_stage.py: a weights flag naming a missing path stops at once, naming the flag;
--enable_compile_cache True is refused the same way."""

import os

import pytest


@pytest.fixture(scope="module")
def cli():
    from scripts import grpo_one_stage

    return grpo_one_stage


@pytest.mark.parametrize("flag", ["--sft_path_train", "--sft_path_infer", "--ref_path"])
def test_missing_weights_path_names_the_flag(cli, tmp_path, capsys, flag):
    missing = tmp_path / "qwen2_5_7b.ckpt"
    assert cli.main([flag, str(missing), "--output_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"grpo_one_stage: error: {flag} {missing}: no such file or folder"]
    assert os.listdir(tmp_path) == []  # nothing made, not even the output folder


def test_a_path_that_is_not_loaded_is_not_checked(cli, tmp_path):
    args = cli.parse_args(["--sft_path_train", str(tmp_path / "nope"), "--load_sft_checkpoint_train", "False"])
    cli.check_weight_paths(args)  # raises nothing: the weights are not read


def test_the_compile_cache_is_refused_before_anything_is_made(cli, tmp_path, capsys):
    assert cli.main(["--enable_compile_cache", "True", "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grpo_one_stage: error: --enable_compile_cache is refused")
    assert os.listdir(tmp_path) == []
