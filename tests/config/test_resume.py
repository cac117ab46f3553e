"""A resumed run's config against its checkpoint's (mindgrpo/config/resume.py)."""

import json

from mindgrpo.config import GRPOConfig, load_config, to_dict
from mindgrpo.config.resume import changed_keys, resume_changes

BASE = ["rl_config.num_generations=8", "generate_config.stop_token_ids=[1, 2]"]


def saved(*overrides):
    """state.json's "config" of a run with these overrides, through JSON as the checkpoint holds it."""
    return json.loads(json.dumps(to_dict(load_config(GRPOConfig, overrides=[*BASE, *overrides]))))


def test_every_changed_key_is_listed_and_nothing_else():
    now = load_config(GRPOConfig, overrides=[
        *BASE, "rl_config.num_generations=4", "actor_config.micro_batch_size=2", "reward_config.cosine.max_len=0",
        "reward_config.verifier_function=[cosine]", "reward_config.verifier_weight=[1]"])
    assert changed_keys(saved(), load_config(GRPOConfig, overrides=BASE)) == {}  # through JSON as saved
    assert changed_keys(saved(), now) == {
        "rl_config.num_generations": (8, 4), "actor_config.micro_batch_size": (4, 2),
        "reward_config.verifier_function": (["accuracy", "format"], ["cosine"]),
        "reward_config.verifier_weight": ([1.0, 1.0], [1.0]), "reward_config.cosine.max_len": (None, 0)}
    # a key the checkpoint has and this version does not (or the reverse) counts as changed
    old = saved()
    old["rl_config"]["gone_key"] = 3
    del old["rl_config"]["swap"]
    assert changed_keys(old, load_config(GRPOConfig, overrides=BASE)) == {"rl_config.swap": (None, True),
                                                                          "rl_config.gone_key": (3, None)}


def test_keys_that_break_exactness_or_the_data_order_are_refused_unless_allowed():
    now = load_config(GRPOConfig, overrides=[*BASE, "rl_config.num_generations=4", "rl_config.seed=7",
                                             "actor_config.micro_batch_size=2"])
    lines, error = resume_changes(saved(), now, allow=False)
    assert error == ("--resume: the checkpoint was written with another config: 'rl_config.seed' 42 -> 7, "
                     "'rl_config.num_generations' 8 -> 4; changing these keys breaks the run's exactness or its data "
                     "order: set back, or pass --allow_config_change")
    assert lines == ["--resume: config key 'actor_config.micro_batch_size' changed from 4 to 2 (accepted)"]
    lines, error = resume_changes(saved(), now, allow=True)
    assert error is None and lines == [
        "--resume: config key 'rl_config.seed' changed from 42 to 7 (accepted with --allow_config_change)",
        "--resume: config key 'rl_config.num_generations' changed from 8 to 4 (accepted with --allow_config_change)",
        "--resume: config key 'actor_config.micro_batch_size' changed from 4 to 2 (accepted)"]


def test_layout_and_length_keys_are_accepted_and_the_algorithm_keys_refused():
    for key in ("rl_config.max_steps=50", "rl_config.output_dir=/tmp/x", "generate_config.max_num_seqs=16",
                "actor_config.parallel_config.data_parallel=2", "rl_config.save_interval=3", "sft_config={steps: 0}"):
        assert resume_changes(saved(), load_config(GRPOConfig, overrides=[*BASE, key]), allow=False)[1] is None, key
    for key in ("rl_config.batch_size=4", "rl_config.dataset_path=x.mindrecord", "rl_config.policy_loss=cispo",
                "actor_config.lr=1e-5", "actor_config.adam_beta2=0.99", "generate_config.temperature=0.7",
                "reward_config.verifier_weight=[1, 2]", "synthetic_config.task.seed=3",
                "rl_config.sapo_temperature_neg=1.5"):
        if key == "rl_config.sapo_temperature_neg=1.5":
            key_set = ["rl_config.policy_loss=sapo", key]
            old = saved("rl_config.policy_loss=sapo")
        else:
            key_set, old = [key], saved()
        error = resume_changes(old, load_config(GRPOConfig, overrides=[*BASE, *key_set]), allow=False)[1]
        assert error is not None and f"'{key.split('=')[0]}'" in error, key


def test_a_checkpoint_without_a_config_is_said_in_one_line():
    lines, error = resume_changes(None, load_config(GRPOConfig), allow=False)
    assert error is None and len(lines) == 1 and "holds no config" in lines[0]
