"""The recipe's config (scripts/grpo_one_stage.py reads it once and folds the flags into their config keys):
conflicts and missing paths refused at start-up, and actor_config.load_checkpoint reaching the models; the
builder's start-up checks come before any model is built."""

import argparse
import json
import os

import numpy as np
import pytest
import mindspore as ms

from mindgrpo.grpo import builder
from mindgrpo.grpo.run import SetupError
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.parallel.one_device import OneDevice
from mindgrpo.rewards import RewardError, register_reward
from scripts.grpo_one_stage import load_run_config, run_options

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MICRO = os.path.join(REPO, "tests", "grpo", "micro_qwen2.yaml")
FITS = "generate_config.max_prompt_length=128"  # with a short max_tokens, within the micro model's 256 positions


def args(*overrides, **flags):
    """What scripts/grpo_one_stage.py parses, with its defaults."""
    base = dict(config=None, output_dir=None, sft_path_train=None, sft_path_infer=None, ref_path=None,
                vocab_path=None, merges_file_path=None, tokenizer_config=None, mind_dataset_dir=None,
                val_dataset=None, save_data_file=None, save_ckpt_dir=None, use_parallel=False,
                load_sft_checkpoint_train=True, load_sft_checkpoint_infer=True, load_ref_checkpoint=True,
                enable_compile_cache=False, only_save_strategy=False, resume=False, resume_from=None,
                reward_plugin=None, swap=None, allow_config_change=False, overrides=list(overrides))
    return argparse.Namespace(**{**base, **flags})


def save_model(folder, seed):
    """A MindSpore checkpoint of the micro model with its config.json beside it."""
    folder.mkdir()
    cfg = Qwen2Config.load(MICRO)
    lm = Qwen2ForCausalLM(cfg, seed=seed)
    ms.save_checkpoint([{"name": n, "data": p} for n, p in lm.parameters_and_names()], str(folder / "model.ckpt"))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return str(folder / "model.ckpt")


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("weights") / "start", 123)


def test_flags_set_their_keys(start, tmp_path):
    data = tmp_path / "train.mindrecord"
    data.write_text("")
    cfg = load_run_config(args("rl_config.beta=0.1", sft_path_train=start, ref_path=start,
                               mind_dataset_dir=str(data)))
    assert cfg.actor_config.load_checkpoint == start and cfg.ref_config.load_checkpoint == start
    assert cfg.rl_config.dataset_path == str(data)
    # the same file given both ways (spelled differently) is fine
    same = os.path.join(os.path.dirname(start), ".", "model.ckpt")
    cfg = load_run_config(args(f"actor_config.load_checkpoint={same}", sft_path_train=start))
    assert cfg.actor_config.load_checkpoint == start
    # a key set to null on the command line names no file: the flag sets it
    cfg = load_run_config(args("actor_config.load_checkpoint=null", sft_path_train=start))
    assert cfg.actor_config.load_checkpoint == start


@pytest.mark.parametrize("overrides, flags, message", [
    (["actor_config.load_checkpoint=/nonexistent/model.ckpt"], {},
     "config key 'actor_config.load_checkpoint': /nonexistent/model.ckpt does not exist"),
    (["rl_config.beta=0.1", "ref_config.load_checkpoint=/nonexistent/ref"], {},
     "config key 'ref_config.load_checkpoint': /nonexistent/ref does not exist"),
    (["rl_config.dataset_path=/nonexistent/train.mindrecord"], {},
     "config key 'rl_config.dataset_path': /nonexistent/train.mindrecord does not exist"),
    (["actor_config.load_checkpoint=/b/model.ckpt"], {"sft_path_train": "/a/model.ckpt"},
     "--sft_path_train /a/model.ckpt and config key 'actor_config.load_checkpoint' /b/model.ckpt name different "
     "files; give one"),
    (["rl_config.beta=0.1", "ref_config.load_checkpoint=/b/ref"], {"ref_path": "/a/ref"},
     "--ref_path /a/ref and config key 'ref_config.load_checkpoint' /b/ref name different files"),
    ([], {"ref_path": "/a/ref"},
     "config key 'ref_config.load_checkpoint': has no effect with rl_config.beta = 0 or actor_config.lora_rank > 0 "
     "(no reference model; with LoRA the reference is the policy with its adapters off) (set by --ref_path)"),
    (["synthetic_config.template=raw"], {"mind_dataset_dir": "/a/train.mindrecord"},
     "config key 'synthetic_config.template': applies to the built-in synthetic task only"),
    # a flag's section that is no mapping: named as such, not a TypeError
    (["actor_config=5"], {"sft_path_train": "/a/model.ckpt"}, "config key 'actor_config': expected a mapping"),
])
def test_start_up_refusals_name_the_key_and_the_path(overrides, flags, message):
    with pytest.raises(SetupError) as info:
        load_run_config(args(*overrides, **flags))
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("policy_from_start, own_reference", [(True, False), (False, True)])
def test_load_checkpoints_are_where_the_policy_the_inference_copy_and_the_reference_start(
        start, tmp_path, policy_from_start, own_reference):
    ref = save_model(tmp_path / "ref", 7) if own_reference else None
    cfg = load_run_config(args(f"actor_config.model={MICRO}", "rl_config.beta=0.05", "generate_config.max_tokens=8",
                               FITS,
                               "synthetic_config.template=raw", "rl_config.batch_size=2",
                               "rl_config.num_generations=4", "actor_config.micro_batch_size=4",
                               *([f"actor_config.load_checkpoint={start}"] if policy_from_start else []),
                               *([f"ref_config.load_checkpoint={ref}"] if ref else []), output_dir=str(tmp_path)))
    parts = builder.build(cfg, run_options(cfg, args(output_dir=str(tmp_path))).paths)
    random_init = {n: p.asnumpy() for n, p in
                   Qwen2ForCausalLM(Qwen2Config.load(MICRO), seed=cfg.rl_config.seed).parameters_and_names()}
    policy = {k: v.asnumpy() for k, v in ms.load_checkpoint(start).items()} if policy_from_start else random_init
    reference = {k: v.asnumpy() for k, v in ms.load_checkpoint(ref).items()} if ref else policy
    for model, expected in ((parts.policy, policy), (parts.inference, policy), (parts.reference, reference)):
        got = dict(model.parameters_and_names())
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name].asnumpy(), value, err_msg=name)
    assert any(not np.array_equal(policy[k], reference[k]) for k in policy) == own_reference


class NoModels(OneDevice):
    """One device that refuses to build a model: what `build` checks must come before."""

    def model(self, role, *args):
        raise AssertionError(f"the {role} model was built before the start-up checks")


def test_the_reward_columns_are_checked_before_any_model_is_built(tmp_path):
    @register_reward("test_run_config_by_difficulty", overwrite=True)
    def by_difficulty(completions, difficulty, **_):
        return [float(d) for d in difficulty]

    cfg = load_run_config(args(f"actor_config.model={MICRO}", "synthetic_config.template=raw", FITS,
                               "generate_config.max_tokens=8",
                               "reward_config.verifier_function=[accuracy, test_run_config_by_difficulty]",
                               "reward_config.verifier_weight=[1, 1]", output_dir=str(tmp_path)))
    with pytest.raises(RewardError) as info:
        builder.build(cfg, run_options(cfg, args(output_dir=str(tmp_path))).paths, NoModels())
    assert str(info.value) == ("reward 'test_run_config_by_difficulty' needs the column(s) ['difficulty'], which the "
                               "training prompts do not have (columns: answer, completion_length, prompt, solution)")


def test_save_best_without_validation_prompts_is_refused_before_any_model_is_built(tmp_path):
    from mindgrpo.config.loader import ConfigError
    from mindgrpo.data.mindrecord import PROMPT_SCHEMA, write_mindrecord

    data = str(tmp_path / "train.mindrecord")
    write_mindrecord(data, PROMPT_SCHEMA, [[{"prompt_ids": np.array([5, 7, 0], np.int32), "prompt_length": np.int32(2),
                                             "prompt": "q", "solution": "1", "answer": "1"}] * 4])
    cfg = load_run_config(args(f"actor_config.model={MICRO}", "rl_config.val_interval=5", FITS,
                               "generate_config.max_tokens=8",
                               "rl_config.save_best=val/accuracy", output_dir=str(tmp_path), mind_dataset_dir=data))
    with pytest.raises(ConfigError) as info:
        builder.build(cfg, run_options(cfg, args(output_dir=str(tmp_path), mind_dataset_dir=data)).paths,
                      NoModels())
    assert str(info.value) == (f"config key 'rl_config.save_best': needs validation prompts, and rl_config.dataset_path "
                               f"{data} comes without any: give rl_config.val_dataset_path (--val_dataset)")


@pytest.mark.parametrize("overrides, key, needle", [
    (["generate_config.max_prompt_length=200", "generate_config.max_tokens=100"], "generate_config.max_tokens",
     "generate_config.max_prompt_length + max_tokens = 200 + 100 = 300 positions, more than the "
     f"max_position_embeddings 256 of {MICRO} (actor_config.model)"),
    ([FITS, "generate_config.max_tokens=8", "generate_config.stop_token_ids=[3, 512]"],
     "generate_config.stop_token_ids",
     f"holds 512, outside the vocabulary of 512 tokens of {MICRO} (actor_config.model)"),
])
def test_generation_beyond_the_model_is_refused_before_any_model_is_built(tmp_path, overrides, key, needle):
    from mindgrpo.config.loader import ConfigError

    cfg = load_run_config(args(f"actor_config.model={MICRO}", *overrides, output_dir=str(tmp_path)))
    with pytest.raises(ConfigError) as info:
        builder.build(cfg, run_options(cfg, args(output_dir=str(tmp_path))).paths, NoModels())
    assert info.value.key == key and needle in info.value.message, str(info.value)


class ResumableTrainer:
    """What start_from_checkpoint uses of a trainer: its config, checkpoint folders, and a resume that returns the
    checkpoint's state.json (written by a run with config `saved_cfg`, or an older one without a config)."""

    def __init__(self, cfg, saved_cfg):
        self.cfg, self.step, self.saved_cfg = cfg, 0, saved_cfg
        self.checkpoints = argparse.Namespace(clean=lambda: [], find=lambda path: "ckpts/step_00000002",
                                              root="ckpts", set_aside_after=lambda step, why: [])

    def resume(self, path):
        self.step = 2
        from dataclasses import asdict

        state = {"step": 2}
        if self.saved_cfg is not None:
            state["config"] = json.loads(json.dumps(asdict(self.saved_cfg)))
        return state


def test_resume_with_a_changed_config_names_the_keys_and_refuses_those_that_break_exactness(caplog):
    from mindgrpo.grpo.run import start_from_checkpoint

    written = load_run_config(args("rl_config.num_generations=8"))
    now = load_run_config(args("rl_config.num_generations=4", "actor_config.micro_batch_size=2"))
    with pytest.raises(SetupError) as info:
        start_from_checkpoint(ResumableTrainer(now, written), None, True)
    assert str(info.value) == ("ckpts/step_00000002: --resume: the checkpoint was written with another config: "
                               "'rl_config.num_generations' 8 -> 4; changing this key breaks the run's exactness or "
                               "its data order: set back, or pass --allow_config_change")
    caplog.clear()
    with caplog.at_level("WARNING", logger="mindgrpo"):
        start_from_checkpoint(ResumableTrainer(now, written), None, True, allow_config_change=True)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "--resume: config key 'rl_config.num_generations' changed from 8 to 4 (accepted with --allow_config_change)",
        "--resume: config key 'actor_config.micro_batch_size' changed from 4 to 2 (accepted)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="mindgrpo"):
        start_from_checkpoint(ResumableTrainer(now, None), None, True)  # an older checkpoint: said, and on it goes
    assert [r.getMessage() for r in caplog.records] == [
        "--resume: this checkpoint holds no config (written before checkpoints kept it): the config is not compared"]
