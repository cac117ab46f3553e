"""The GRPO config schema: defaults, a YAML that sets every key, CLI overrides, cross-field rules."""

import dataclasses
import typing
from pathlib import Path

import pytest

from mindgrpo.config import (
    ActorConfig,
    ConfigError,
    CosineRewardConfig,
    GenerateConfig,
    JudgeConfig,
    GRPOConfig,
    ParallelConfig,
    RefConfig,
    RewardConfig,
    RewardModelConfig,
    RLConfig,
    SFTConfig,
    SoftOverlongConfig,
    SyntheticConfig,
    load_config,
    to_dict,
    to_yaml,
)
from mindgrpo.data.synthetic import ArithmeticTask
from mindgrpo.grpo import algos

FULL_YAML = Path(__file__).with_name("full_grpo.yaml")

# full_grpo.yaml, written out by hand
FULL = GRPOConfig(
    rl_config=RLConfig(
        seed=7, max_steps=20, batch_size=4, num_generations=6, num_iterations=2, num_mini_batches=3, beta=0.04,
        kl_kind="k3", clip_low=0.1, clip_high=0.28, dual_clip=3.0, loss_agg_mode="seq-mean-token-sum-norm",
        advantage_scale="batch", advantage_eps=1e-4, policy_loss="gspo", top_entropy_quantile=0.2,
        rollout_correction="tis_sequence", rollout_correction_threshold=3.0, old_logprobs_from_rollout=True,
        off_policy_steps=2, max_staleness=3, ref_model_sync_steps=5, dynamic_sampling=True,
        max_resample_times=2, overlong_filtering=True, val_interval=10, val_size=32, val_n=4, val_temperature=0.6,
        val_before_train=False, save_best="val/pass@2", save_interval=5, keep_last_k=3,
        log_interval=2, max_bad_steps=5, completions_interval=4, swap=False, memory="low", release_graphs=True, restart_on_memory_growth=0.05,
        weight_sync_bucket_mb=64.5, collective_timeout_s=600.0, compile_timeout_s=1200.5, device_peak_tflops=280.5, dataset_path="data/train.jsonl",
        val_dataset_path="data/val.jsonl", output_dir="/tmp/mindgrpo-run"),
    actor_config=ActorConfig(
        model="configs/qwen2_tiny.json", load_checkpoint="/models/Qwen2.5-0.5B-Instruct", checkpoint_dir="/tmp/ckpt",
        dtype="bfloat16", lr=3e-6, lr_schedule="cosine", warmup_steps=3, min_lr=1e-7, adam_beta1=0.8, adam_beta2=0.95,
        adam_eps=1e-6, weight_decay=0.01, grad_clip=None, micro_batch_size=2, logprob_chunk_size=512,
        max_tokens_per_micro_batch=4096, packing=True, packed_attention="flash",
        parallel_config=ParallelConfig(2, 2, 2, optimizer_shard=True)),
    ref_config=RefConfig(load_checkpoint="/models/ref", max_tokens_per_micro_batch=8192, parallel_config=ParallelConfig(4, 2, 3)),
    generate_config=GenerateConfig(
        max_prompt_length=256, max_tokens=1024, temperature=0.7, top_k=50, top_p=0.95, min_p=0.05,
        stop_token_ids=(151643, 151645), seed=123, max_num_seqs=64, max_num_batched_tokens=40960,
        inference_weights="copy", max_prefill_tokens=8192,
        parallel_config=ParallelConfig(3, 4, 5)),
    reward_config=RewardConfig(
        verifier_function=("accuracy", "format", "soft_overlong", "cosine"), verifier_weight=(1.0, 0.5, 2.0, 0.25),
        reward_plugin="plugins/my_rewards.py", num_workers=4, timeout_s=2.5,
        cosine=CosineRewardConfig(-2.0, -1.0, 0.25, 2.0, 800),
        soft_overlong=SoftOverlongConfig(buffer_len=256, max_len=900),
        reward_models=(RewardModelConfig(path="models/rm", name="helpful", weight=0.5, template="completion",
                                         config="models/rm/config.yaml", micro_batch_size=4,
                                         max_tokens_per_micro_batch=4096, kept_row_lengths=2,
                                         normalize=True, model_parallel=4),),
        judges=(JudgeConfig(path="models/judge", name="critic", weight=0.25, config="models/judge/config.yaml",
                            template="Is this answer right? {{ completion }} Answer yes or no.",
                            chat_template="models/judge/tokenizer_config.json", parser="yes_no", score_range=(0.0, 1.0),
                            max_tokens=4, temperature=0.5, max_num_seqs=16, seed=3, normalize=True),)),
    sft_config=SFTConfig(steps=12, lr=5e-4, batch_size=8, teacher_carry_error=0.0),
)
SYNTHETIC = SyntheticConfig(template="qwen_chat", task=ArithmeticTask(
    seed=3, num_train=100, num_val=20, max_operand=30, max_mul_operand=9, operators=("+", "-"), num_operands=3))


def leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_defaults_are_valid():
    cfg = load_config(GRPOConfig)
    assert cfg == GRPOConfig()
    assert cfg.rl_config.beta == 0.0 and cfg.rl_config.kl_kind == "low_var_kl"
    assert cfg.rl_config.loss_agg_mode == "token-mean" and cfg.rl_config.advantage_scale == "group"
    assert cfg.rl_config.rollout_rows == cfg.rl_config.batch_size * cfg.rl_config.num_generations
    assert cfg.reward_config.verifier_function == ("accuracy", "format")


def test_yaml_that_sets_every_key():
    cfg = load_config(GRPOConfig, FULL_YAML)
    assert cfg == FULL
    # the file really covers every key: each leaf differs from its default
    defaults = dict(leaves(to_dict(GRPOConfig())))
    loaded = dict(leaves(to_dict(cfg)))
    assert loaded.keys() == defaults.keys()
    # teacher_carry_error and synthetic_config need the synthetic task, and this file names a dataset:
    # the file leaves them at their defaults, test_synthetic_config_from_yaml sets them
    # (and only the actor's parallel_config may shard an optimizer; actor_config.recompute and layerwise_update,
    # generate_config.layerwise and ref_config.layerwise are refused with this file's tensor and pipeline
    # parallelism, tests/grpo/test_recompute.py, test_layerwise.py and tests/inference/test_engine.py set them,
    # and with them actor_config.head_rows_per_graph, recompute_num_layers and generate_config.decode_layers_per_graph,
    # which act only
    # with those switches; rl_config.memory_budget_gb is refused with this file's memory: low,
    # tests/memory/test_auto.py sets it)
    exempt = {"rl_config.memory_budget_gb", "sft_config.teacher_carry_error", "actor_config.head_rows_per_graph",
              "actor_config.recompute_num_layers",
              "generate_config.decode_layers_per_graph", "ref_config.parallel_config.optimizer_shard",
              "generate_config.parallel_config.optimizer_shard", "actor_config.recompute",
              "actor_config.layerwise_update", "generate_config.layerwise", "ref_config.layerwise",
              # LoRA runs on one device (this file's parallelism refuses it): tests/config/test_lora_config.py
              "actor_config.lora_rank", "actor_config.lora_alpha", "actor_config.lora_dropout",
              "actor_config.lora_target_modules",
              # conversations run on whole inference replicas (this file's generate model_parallel refuses them):
              # tests/config/test_tools_config.py sets them
              *(f"generate_config.{k}" for k in ("tools", "max_turns", "tool_response_max_tokens", "tool_timeout_s",
                                                 "tool_num_workers", "tool_plugin", "chat_template", "environment",
                                                 "environment_plugin", "environment_settings")),
              "sft_config.teacher_tool_call_rate",
              # the separate placement runs data-parallel training ranks and whole rollout replicas for now (this
              # file's parallelism refuses it): test_separate_placement_rules sets it
              "generate_config.placement", "generate_config.partial_rollout",
              # needs packed_attention mask (this file's is flash): test_the_same_keys_where_they_take_effect sets it
              "actor_config.shared_prefix"} \
        | set(VARIANT_SETTINGS)
    same = [k for k in loaded if loaded[k] == defaults[k] and k not in exempt and not k.startswith("synthetic_config.")]
    assert same == [], f"full_grpo.yaml leaves these at their defaults: {same}"


def test_synthetic_config_from_yaml(tmp_path):
    path = tmp_path / "synthetic.yaml"
    path.write_text("synthetic_config:\n  template: qwen_chat\n  task:\n    seed: 3\n    num_train: 100\n"
                    "    num_val: 20\n    max_operand: 30\n    max_mul_operand: 9\n    operators: ['+', '-']\n"
                    "    num_operands: 3\nsft_config:\n  steps: 1\n  teacher_carry_error: 0.5\n")
    cfg = load_config(GRPOConfig, path)
    assert cfg.synthetic_config == SYNTHETIC and cfg.sft_config.teacher_carry_error == 0.5
    defaults = dict(leaves(to_dict(GRPOConfig().synthetic_config)))
    same = [k for k, v in leaves(to_dict(cfg.synthetic_config)) if v == defaults[k]]
    assert same == [], f"the synthetic YAML leaves these at their defaults: {same}"


# the settings of the variants full_grpo.yaml does not choose (each refused beside another variant), and
# adv_estimator, whose other values do not read full_grpo.yaml's advantage_scale
VARIANT_SETTINGS = {"rl_config.adv_estimator": "reinforce_plus_plus_baseline",
                    "rl_config.cispo_epsilon_max": 2.5,
                    "rl_config.sapo_temperature_pos": 0.5, "rl_config.sapo_temperature_neg": 2.0,
                    "rl_config.gmpo_epsilon": 0.3}


def test_variant_settings_from_yaml(tmp_path):
    for loss, keys in (("cispo", ["cispo_epsilon_max"]), ("sapo", ["sapo_temperature_pos", "sapo_temperature_neg"]),
                       ("gmpo", ["gmpo_epsilon"])):
        path = tmp_path / f"{loss}.yaml"
        path.write_text(f"rl_config:\n  policy_loss: {loss}\n  adv_estimator: reinforce_plus_plus_baseline\n"
                        + "".join(f"  {k}: {VARIANT_SETTINGS['rl_config.' + k]}\n" for k in keys))
        rl = load_config(GRPOConfig, path).rl_config
        assert rl.policy_loss == loss and rl.adv_estimator == "reinforce_plus_plus_baseline"
        for k in keys:
            assert getattr(rl, k) == VARIANT_SETTINGS["rl_config." + k] != getattr(RLConfig(), k)
    with pytest.raises(ConfigError, match="'rl_config.advantage_scale': is a setting of adv_estimator grpo"):
        load_config(GRPOConfig, FULL_YAML, ["rl_config.adv_estimator=rloo"])
    with pytest.raises(ConfigError, match="'rl_config.sapo_temperature_neg'.*policy_loss is 'gspo'"):
        load_config(GRPOConfig, FULL_YAML, ["rl_config.sapo_temperature_neg=2"])


def test_cli_after_yaml():
    cfg = load_config(GRPOConfig, FULL_YAML, ["rl_config.max_steps=1", "rl_config.seed=11", "actor_config.lr=2e-6",
                                              "actor_config.parallel_config.data_parallel=1",
                                              "reward_config.verifier_weight=[1, 1, 0.5, 1]", "rl_config.dual_clip=null"])
    assert (cfg.rl_config.max_steps, cfg.rl_config.seed, cfg.actor_config.lr) == (1, 11, 2e-6)
    assert cfg.actor_config.parallel_config == ParallelConfig(1, 2, 2, optimizer_shard=True)
    assert cfg.reward_config.verifier_weight == (1.0, 1.0, 0.5, 1.0) and cfg.rl_config.dual_clip is None
    assert cfg.rl_config.batch_size == 4  # from the YAML


def test_nested_unknown_key():
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=["actor_config.parallel_config.foo=1"])
    assert str(info.value) == ("config key 'actor_config.parallel_config.foo': unknown key; valid keys under "
                               "'actor_config.parallel_config': data_parallel, model_parallel, pipeline_stage, "
                               "optimizer_shard")


@pytest.mark.parametrize("overrides,key,expected", [
    (["reward_config.verifier_weight=[1.0]"], "reward_config.verifier_weight", "has 1 weights for 2"),
    (["reward_config.verifier_function=[]", "reward_config.verifier_weight=[]"], "reward_config.verifier_function",
     "at least one"),
    (["reward_config.verifier_function=[a, a]"], "reward_config.verifier_function", "duplicates"),
    (["rl_config.num_mini_batches=3"], "rl_config.num_mini_batches", "must divide batch_size * num_generations = 64"),
    (["actor_config.micro_batch_size=3"], "actor_config.micro_batch_size", "must divide the 64 rows"),
    (["actor_config.parallel_config.data_parallel=3"], "actor_config.micro_batch_size", "4 * 3"),
    (["rl_config.clip_low=0"], "rl_config.clip_low", "must be in (0, 1)"),
    (["rl_config.clip_high=-0.1"], "rl_config.clip_high", "must be > 0"),
    (["rl_config.dual_clip=1"], "rl_config.dual_clip", "must be > 1"),
    (["rl_config.num_generations=1"], "rl_config.num_generations", "must be >= 2"),
    (["rl_config.beta=-1"], "rl_config.beta", "must be >= 0"),
    (["rl_config.off_policy_steps=-1"], "rl_config.off_policy_steps", "must be >= 0"),
    (["rl_config.off_policy_steps=2", "rl_config.max_staleness=1"], "rl_config.max_staleness", "must be >= off_policy"),
    (["rl_config.max_staleness=1"], "rl_config.max_staleness", "has no effect with rl_config.off_policy_steps 0"),
    (["rl_config.kl_kind=kl"], "rl_config.kl_kind", "valid names: k1, k2, k3, low_var_kl"),
    (["rl_config.loss_agg_mode=sum"], "rl_config.loss_agg_mode",
     "valid names: seq-mean-token-mean, seq-mean-token-sum-norm, token-mean"),
    (["rl_config.advantage_scale=std"], "rl_config.advantage_scale", "valid names: batch, group, none"),
    (["rl_config.adv_estimator=ppo"], "rl_config.adv_estimator",
     "valid names: dr_grpo, grpo, reinforce_plus_plus_baseline, rloo"),
    (["rl_config.policy_loss=clip"], "rl_config.policy_loss", "valid names: cispo, gmpo, gspo, ppo_clip, sapo"),
    (["rl_config.rollout_correction=is"], "rl_config.rollout_correction",
     "valid names: mask_sequence, mask_token, none, tis_sequence, tis_token"),
    (["rl_config.policy_loss=cispo", "rl_config.clip_high=0.28"], "rl_config.clip_high",
     "is a setting of policy_loss gspo / ppo_clip, and policy_loss is 'cispo'"),
    (["rl_config.gmpo_epsilon=0.2"], "rl_config.gmpo_epsilon", "is a setting of policy_loss gmpo"),
    (["rl_config.adv_estimator=rloo", "rl_config.advantage_eps=1e-4"], "rl_config.advantage_eps",
     "is a setting of adv_estimator grpo / reinforce_plus_plus_baseline, and adv_estimator is 'rloo'"),
    (["rl_config.policy_loss=gmpo", "rl_config.gmpo_epsilon=0"], "rl_config.gmpo_epsilon", "must be > 0"),
    (["rl_config.top_entropy_quantile=1.5"], "rl_config.top_entropy_quantile", "must be in [0, 1]"),
    (["rl_config.val_interval=5", "rl_config.val_size=0"], "rl_config.val_size", "must be >= 1 when val_interval"),
    (["rl_config.val_interval=5", "rl_config.val_n=4"], "rl_config.val_n", "must be 1 with val_temperature 0"),
    (["rl_config.val_interval=5", "rl_config.val_n=4", "rl_config.val_temperature=1", "rl_config.save_best=val/pass@3"],
     "rl_config.save_best", "must be a validation metric (val/accuracy, val/pass@1, val/pass@2, val/pass@4, "
     "val/mean@4, val/maj@4), got 'val/pass@3'"),
    (["rl_config.save_best=val/accuracy"], "rl_config.save_best", "has no effect with rl_config.val_interval = 0"),
    (["rl_config.val_before_train=false"], "rl_config.val_before_train", "has no effect with rl_config.val_interval"),
    (["rl_config.device_peak_tflops=0"], "rl_config.device_peak_tflops", "must be > 0 or null"),
    (["actor_config.lr=0"], "actor_config.lr", "must be > 0"),
    (["actor_config.min_lr=1e-3"], "actor_config.min_lr", "must be in [0, lr=1e-06]"),
    (["actor_config.adam_beta2=1"], "actor_config.adam_beta2", "must be in [0, 1)"),
    (["actor_config.lr_schedule=linear"], "actor_config.lr_schedule", "expected one of 'constant', 'cosine'"),
    (["actor_config.dtype=int8"], "actor_config.dtype", "expected one of 'float32', 'bfloat16', 'float16'"),
    (["actor_config.head_rows_per_graph=-1"], "actor_config.head_rows_per_graph", "must be >= 0"),
    (["actor_config.recompute_num_layers=-1"], "actor_config.recompute_num_layers", "must be an integer >= 0 or null"),
    (["ref_config.parallel_config.pipeline_stage=0"], "ref_config.parallel_config.pipeline_stage", "must be >= 1"),
    (["generate_config.top_p=0"], "generate_config.top_p", "must be in (0, 1]"),
    (["generate_config.stop_token_ids=[1, eos]"], "generate_config.stop_token_ids[1]", "expected int"),
    (["generate_config.max_num_seqs=0"], "generate_config.max_num_seqs", "must be >= 1"),
    (["generate_config.decode_layers_per_graph=0"], "generate_config.decode_layers_per_graph", "must be >= 1"),
    (["generate_config.max_prefill_tokens=0"], "generate_config.max_prefill_tokens", "must be >= 1 or null"),
    (["generate_config.inference_weights=shared"], "generate_config.inference_weights",
     "expected one of 'auto', 'copy', got 'shared'"),
    (["generate_config.max_num_batched_tokens=1000"], "generate_config.max_num_batched_tokens",
     "must hold one sequence of max_prompt_length + max_tokens = 1024 tokens, got 1000"),
    (["generate_config.max_tokens=100", "reward_config.verifier_function=[accuracy, soft_overlong]",
      "reward_config.verifier_weight=[1, 1]"], "reward_config.soft_overlong.buffer_len",
     "must be < the overlong max_len 100"),
    (["reward_config.soft_overlong.buffer_len=0"], "reward_config.soft_overlong.buffer_len", "must be >= 1"),
    (["generate_config.parallel_config.optimizer_shard=true"], "generate_config.parallel_config.optimizer_shard",
     "only the training layout"),
    (["sft_config.teacher_carry_error=1.5"], "sft_config.teacher_carry_error", "must be in [0, 1]"),
    (["reward_config.num_workers=-1"], "reward_config.num_workers", "must be >= 0"),
    (["reward_config.timeout_s=0"], "reward_config.timeout_s", "must be > 0"),
    (["rl_config.collective_timeout_s=-5"], "rl_config.collective_timeout_s", "must be >= 0"),
    (["rl_config.weight_sync_bucket_mb=-1"], "rl_config.weight_sync_bucket_mb", "must be >= 0"),
    (["rl_config.collective_timeout_s=600", "rl_config.compile_timeout_s=60"], "rl_config.compile_timeout_s",
     "must be >= collective_timeout_s = 600"),
    (["sft_config.steps=1", "sft_config.teacher_carry_error=0.5", "rl_config.dataset_path=data/train.mindrecord"],
     "sft_config.teacher_carry_error", "built-in synthetic task only"),
])
def test_cross_field_and_range_errors_name_the_key(overrides, key, expected):
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=overrides)
    assert info.value.key == key and expected in info.value.message, str(info.value)


@pytest.mark.parametrize("kind", algos.KL_ESTIMATORS.names())
def test_every_registered_kl_estimator_is_accepted(kind):
    assert load_config(GRPOConfig, overrides=["rl_config.beta=0.04", f"rl_config.kl_kind={kind}"]).rl_config.kl_kind \
        == kind


def test_round_trip_and_frozen(tmp_path):
    path = tmp_path / "resolved.yaml"
    path.write_text(to_yaml(FULL))
    assert load_config(GRPOConfig, path) == FULL
    with pytest.raises(dataclasses.FrozenInstanceError):
        FULL.actor_config.parallel_config.data_parallel = 8


@pytest.mark.parametrize("overrides", [
    ["generate_config.temperature=inf"], ["generate_config.temperature=nan"], ["actor_config.lr=-inf"],
    ["rl_config.beta=nan"], ["reward_config.verifier_weight=[1, .nan]"], ["rl_config.dual_clip=inf"],
])
def test_non_finite_numbers_are_refused_naming_the_key(overrides):
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=overrides)
    assert info.value.key == overrides[0].split("=")[0].replace("verifier_weight", "verifier_weight[1]")
    assert "finite" in info.value.message


def test_non_finite_numbers_in_yaml_are_refused(tmp_path):
    path = tmp_path / "nan.yaml"
    path.write_text("generate_config:\n  temperature: .inf\n")
    with pytest.raises(ConfigError, match="generate_config.temperature': must be a finite number"):
        load_config(GRPOConfig, path)


@pytest.mark.parametrize("key", ["ref_config.model", "reward_config.soft_overlong.penalty_factor"])
def test_removed_keys_are_unknown(key):
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=[f"{key}=1"])
    assert info.value.key == key and "unknown key" in info.value.message


@pytest.mark.parametrize("overrides,key,expected", [
    (["ref_config.load_checkpoint=/models/ref"], "ref_config.load_checkpoint", "rl_config.beta = 0"),
    (["ref_config.parallel_config.model_parallel=2"], "ref_config.parallel_config.model_parallel", "beta = 0"),
    (["rl_config.ref_model_sync_steps=10"], "rl_config.ref_model_sync_steps", "beta = 0"),
    (["rl_config.max_resample_times=5"], "rl_config.max_resample_times", "without rl_config.dynamic_sampling"),
    (["actor_config.min_lr=1e-7"], "actor_config.min_lr", "lr_schedule 'constant'"),
    (["reward_config.cosine.max_len=100"], "reward_config.cosine.max_len", "lists cosine"),
    (["reward_config.soft_overlong.buffer_len=16"], "reward_config.soft_overlong.buffer_len", "lists soft_overlong"),
    (["rl_config.kl_kind=k3"], "rl_config.kl_kind", "rl_config.beta = 0"),
    (["actor_config.layerwise_update=false", "actor_config.head_rows_per_graph=2"],
     "actor_config.head_rows_per_graph", "without actor_config.layerwise_update"),
    (["actor_config.layerwise_update=false", "actor_config.recompute_num_layers=0"],
     "actor_config.recompute_num_layers", "without actor_config.layerwise_update"),
    (["generate_config.decode_layers_per_graph=2", "rl_config.memory=speed"],
     "generate_config.decode_layers_per_graph", "without generate_config.layerwise"),
    (["sft_config.lr=1e-4"], "sft_config.lr", "sft_config.steps = 0"),
    (["sft_config.batch_size=4"], "sft_config.batch_size", "sft_config.steps = 0"),
    (["sft_config={steps: 0}"], None, None),  # how a recipe's warm start is switched off: the section set whole
    (["rl_config.dataset_path=train.mindrecord", "synthetic_config.template=qwen_chat"], "synthetic_config.template",
     "built-in synthetic task only"),
    (["rl_config.dataset_path=train.mindrecord", "synthetic_config.task.num_train=10"],
     "synthetic_config.task.num_train", "built-in synthetic task only"),
])
def test_keys_that_cannot_take_effect_are_refused(overrides, key, expected):
    if key is None:
        assert load_config(GRPOConfig, FULL_YAML, overrides).sft_config == SFTConfig(steps=0)
        return
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=overrides)
    assert info.value.key == key and expected in info.value.message, str(info.value)


@pytest.mark.parametrize("overrides", [
    ["rl_config.beta=0.04", "ref_config.load_checkpoint=/models/ref", "rl_config.ref_model_sync_steps=10",
     "ref_config.parallel_config.model_parallel=2"],
    ["rl_config.dynamic_sampling=true", "rl_config.max_resample_times=5"],
    ["actor_config.lr_schedule=cosine", "actor_config.min_lr=1e-7"],
    ["reward_config.verifier_function=[accuracy, cosine]", "reward_config.verifier_weight=[1, 1]",
     "reward_config.cosine.max_len=100"],
    ["synthetic_config.template=qwen_chat"],
    ["actor_config.max_tokens_per_micro_batch=1024", "actor_config.packing=true", "actor_config.packed_attention=flash"],
    ["actor_config.max_tokens_per_micro_batch=1024", "actor_config.packing=true", "actor_config.shared_prefix=true"],
])
def test_the_same_keys_where_they_take_effect(overrides):
    load_config(GRPOConfig, overrides=overrides)


def test_every_rule_names_a_real_key():
    from mindgrpo.config.grpo import INERT_UNLESS

    keys = {k for k, _ in leaves(to_dict(GRPOConfig()))}
    for path, _, _ in INERT_UNLESS:
        assert path in keys or any(k.startswith(path + ".") for k in keys), path


def test_the_default_model_is_a_preset_of_qwen2_5_0_5b():
    import numpy as np

    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.presets import resolve_model_config
    from mindgrpo.models.convert import expected_shapes

    cfg = Qwen2Config.load(resolve_model_config(GRPOConfig().actor_config.model))
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings) == (896, 24, 14, 2, 4864, 151936, True)
    assert (cfg.rope_theta, cfg.rms_norm_eps) == (1e6, 1e-6)
    # the parameter count Hugging Face publishes for Qwen/Qwen2.5-0.5B
    assert sum(int(np.prod(s)) for s in expected_shapes(cfg).values()) == 494_032_768


def test_max_bad_steps_must_be_positive():
    with pytest.raises(ConfigError, match="rl_config.max_bad_steps': must be >= 1"):
        load_config(GRPOConfig, overrides=["rl_config.max_bad_steps=0"])


@pytest.mark.parametrize("overrides, message", [
    (["actor_config.max_tokens_per_micro_batch=-1"], "actor_config.max_tokens_per_micro_batch': must be >= 0"),
    (["actor_config.max_tokens_per_micro_batch=1000"],  # 512 + 512 tokens
     "actor_config.max_tokens_per_micro_batch': must hold the longest sample, .* = 1024 tokens, got 1000"),
    (["actor_config.max_tokens_per_micro_batch=1024", "rl_config.beta=0.04", "ref_config.max_tokens_per_micro_batch=512"],
     "ref_config.max_tokens_per_micro_batch': must hold the longest sample"),
    (["actor_config.packing=true"], "actor_config.packing': needs max_tokens_per_micro_batch > 0"),
    (["actor_config.max_tokens_per_micro_batch=1024", "actor_config.packing=true", "rl_config.beta=0.04",
      "ref_config.max_tokens_per_micro_batch=0"], "ref_config.max_tokens_per_micro_batch': must be > 0 .* packs too"),
    (["actor_config.packed_attention=flash"], "actor_config.packed_attention': applies to packed rows only"),
    (["actor_config.shared_prefix=true"], "actor_config.shared_prefix': applies to packed rows only"),
    (["actor_config.max_tokens_per_micro_batch=1024", "actor_config.packing=true", "actor_config.packed_attention=flash",
      "actor_config.shared_prefix=true"], "actor_config.shared_prefix': needs packed_attention mask"),
])
def test_token_budget_and_packing_keys_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, overrides=overrides)


def test_with_a_token_budget_the_micro_batch_size_need_not_divide_a_replicas_rows():
    budget = ["actor_config.max_tokens_per_micro_batch=1024", "actor_config.micro_batch_size=3"]
    with pytest.raises(ConfigError, match="actor_config.micro_batch_size'"):
        load_config(GRPOConfig, overrides=budget[1:])
    load_config(GRPOConfig, overrides=budget)


# ------------------------------------------------------------------ greedy groups (issue 42, item 1)
@pytest.mark.parametrize("overrides, key", [
    (["generate_config.temperature=0"], "generate_config.temperature"),
    (["generate_config.temperature=1e-6"], "generate_config.temperature"),
    (["generate_config.top_p=1e-9"], "generate_config.top_p"),
    (["generate_config.min_p=0.99"], "generate_config.min_p"),
    (["generate_config.temperature=0.5", "generate_config.min_p=0.85"], "generate_config.min_p"),  # e^-0.2 = 0.82
    (["generate_config.top_k=1"], "generate_config.top_k"),
])
def test_greedy_groups_are_refused_naming_the_keys(overrides, key):
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=overrides)
    assert info.value.key == key and "rl_config.num_generations = 8" in info.value.message, str(info.value)


@pytest.mark.parametrize("overrides", [
    ["generate_config.temperature=0.01"], ["generate_config.top_p=0.01"], ["generate_config.min_p=0.9"],
    ["generate_config.top_k=2"], ["generate_config.temperature=0.5", "generate_config.min_p=0.8"],
])
def test_sampling_that_still_spreads_a_group_is_accepted(overrides):
    load_config(GRPOConfig, overrides=overrides)


def test_nearly_greedy_validation_with_several_samples_is_refused():
    val = ["rl_config.val_interval=5", "rl_config.val_n=4"]
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=[*val, "rl_config.val_temperature=1e-6"])
    assert info.value.key == "rl_config.val_temperature" and "val_n = 4 samples" in info.value.message
    load_config(GRPOConfig, overrides=[*val, "rl_config.val_temperature=0.6"])
    load_config(GRPOConfig, overrides=["rl_config.val_interval=5", "rl_config.val_temperature=1e-6"])  # one sample


# ------------------------------------------------------------------ every key acts or is refused (item 2)
def _config_keys(cls, prefix=""):
    """Every leaf key of a config dataclass, dotted, from its fields (sections recursed into)."""
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _config_keys(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def _covers(path, key):
    return key == path or key.startswith(path + ".")


def test_every_config_key_acts_always_or_has_its_dependency():
    from mindgrpo.config.grpo import ACTS_ALWAYS, INERT_UNLESS, KEPT_WHEN_OFF, variant_settings

    keys = list(_config_keys(GRPOConfig))
    assert len(keys) > 80
    entries = [*ACTS_ALWAYS, *(path for path, _, _ in INERT_UNLESS), *variant_settings(), *KEPT_WHEN_OFF]
    for entry in entries:  # each entry names keys that exist
        assert any(_covers(entry, k) for k in keys), entry
    for key in keys:
        owners = [e for e in entries if _covers(e, key)]
        assert len(owners) == 1, f"config key {key!r} needs exactly one entry in mindgrpo/config/grpo.py " \
                                 f"(ACTS_ALWAYS or INERT_UNLESS, or a variant's setting), has {owners}"


# the overrides under which a dependency's condition is false, for those whose condition holds at the defaults
CONDITION_FALSE = {"synthetic_config": ["rl_config.dataset_path=train.mindrecord"],
                   "reward_config.timeout_s": ["reward_config.num_workers=0"],
                   # a memory saver left unset may be turned on by rl_config.memory: off explicitly
                   "actor_config.head_rows_per_graph": ["actor_config.layerwise_update=false"],
                   "actor_config.recompute_num_layers": ["actor_config.layerwise_update=false"],
                   "generate_config.decode_layers_per_graph": ["generate_config.layerwise=false"],
                   "rl_config.restart_on_memory_growth": ["rl_config.release_graphs=false"],
                   "rl_config.memory_budget_gb": ["rl_config.memory=speed"]}


OWN_CHECK_FIRST = {"rl_config.val_n"}
# keys whose other value needs another key of the same dependency (which the refusal names, the first changed)
COMPANIONS = {"synthetic_config.task.num_operands": (["synthetic_config.task.operators=[+]"],
                                                     "synthetic_config.task.operators")}


def _witness(key):
    """A value other than the default for `key`, valid in its section: full_grpo.yaml's (or the synthetic YAML's)."""
    default, full = dict(leaves(to_dict(GRPOConfig()))), dict(leaves(to_dict(FULL)))
    synthetic = {f"synthetic_config.{k}": v for k, v in leaves(to_dict(SYNTHETIC))}
    others = {"sft_config.teacher_carry_error": 0.5, "actor_config.head_rows_per_graph": 2, "ref_config.layerwise": True,
              "actor_config.recompute_num_layers": 2,
              "rl_config.memory_budget_gb": 16.0, "actor_config.lora_alpha": 32.0, "actor_config.lora_dropout": 0.1,
              "actor_config.lora_target_modules": ["q_proj"],
              "generate_config.decode_layers_per_graph": 2, "rl_config.save_best": "val/accuracy",
              "generate_config.tools": ["calculator"], "generate_config.max_turns": 2,
              "generate_config.tool_response_max_tokens": 64, "generate_config.tool_timeout_s": 5.0,
              "generate_config.tool_num_workers": 1, "generate_config.tool_plugin": "my_tools.py",
              "generate_config.chat_template": "tokenizer_config.json", "sft_config.teacher_tool_call_rate": 0.5,
              "generate_config.environment_plugin": "my_envs.py", "generate_config.environment_settings": {"high": 5}}
    for table in (others, full, synthetic, VARIANT_SETTINGS):
        if key in table and table[key] != default[key]:
            return table[key]
    bool_default = default[key]
    assert isinstance(bool_default, bool), f"no value other than the default known for {key}"
    return not bool_default


def _override(key, value):
    import json

    return f"{key}={json.dumps(value) if not isinstance(value, str) else value}"


def test_each_dependency_refuses_its_keys_by_name():
    from mindgrpo.config.grpo import INERT_UNLESS

    keys = list(_config_keys(GRPOConfig))
    for path, in_effect, why in INERT_UNLESS:
        base = CONDITION_FALSE.get(path, [])
        assert not in_effect(load_config(GRPOConfig, overrides=base)), \
            f"{path}: its condition holds at {base or 'the defaults'}; give CONDITION_FALSE an entry"
        for key in (k for k in keys if _covers(path, k)):
            override = _override(key, _witness(key))
            companion, named = COMPANIONS.get(key, ([], key))
            with pytest.raises(ConfigError) as info:
                load_config(GRPOConfig, overrides=[*base, *companion, override])
            assert info.value.key == named, f"{override}: {info.value}"
            # val_n > 1 is refused by its own section first, beside the default val_temperature 0 (also inert)
            assert info.value.message == why or key in OWN_CHECK_FIRST, f"{override}: {info.value}"


def test_each_variant_setting_is_refused_beside_a_variant_that_does_not_read_it():
    from mindgrpo.config.sections import VARIANTS

    for registry, chooser in VARIANTS:
        for name in registry.names():
            for setting in registry.params(name):
                other = next(n for n in registry.names() if setting not in registry.params(n))
                key = f"rl_config.{setting}"
                with pytest.raises(ConfigError) as info:
                    load_config(GRPOConfig, overrides=[f"rl_config.{chooser}={other}", _override(key, _witness(key))])
                assert info.value.key == key and "does not read it" in info.value.message, str(info.value)


def test_every_shipped_recipe_loads():
    recipes = sorted((Path(__file__).parents[2] / "model_configs" / "qwen_grpo").glob("*/grpo_config*.yaml"))
    assert len(recipes) >= 10 and sum(p.name == "grpo_config_lora.yaml" for p in recipes) >= 3
    for path in recipes:
        load_config(GRPOConfig, path)


def test_a_sections_own_value_error_names_its_section():
    # ArithmeticTask (mindgrpo/data/synthetic.py, below the config layer) raises ValueError, not ConfigError
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=["synthetic_config.task.num_operands=3"])
    assert info.value.key == "synthetic_config.task" and "only supported with num_operands 2" in info.value.message


SEPARATE = ["generate_config.placement=separate"]


@pytest.mark.parametrize("extra, key", [
    # generation runs without pipeline stages (issue 46)
    (["generate_config.parallel_config.pipeline_stage=2"], "generate_config.parallel_config.pipeline_stage"),
    # a rollout group of R ranks: at least a prompt each
    (["generate_config.parallel_config.data_parallel=3", "rl_config.batch_size=2"], "rl_config.batch_size"),
    # the training rank scores with each reward model whole
    (["reward_config.reward_models=[{path: rm.ckpt, model_parallel: 2}]"], "reward_config.reward_models[0].model_parallel"),
    # dynamic sampling k steps ahead: the rollout ranks decide a step's rounds with the rule rewards; reward models and
    # judges score on training rank 0 only
    (["rl_config.dynamic_sampling=true", "rl_config.off_policy_steps=1",
      "reward_config.reward_models=[{path: rm.ckpt}]"], "reward_config.reward_models"),
    (["rl_config.dynamic_sampling=true", "rl_config.off_policy_steps=2", "reward_config.judges=[{path: models/judge}]"],
     "reward_config.judges"),
])
def test_separate_placement_rules(extra, key):
    # validation, the warm start and LoRA run with it (the rollout rank validates, the training rank warm-starts;
    # each update moves the adapters)
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["rl_config.off_policy_steps=1", "rl_config.val_interval=5",
                                                        "sft_config.steps=3", "actor_config.lora_rank=8"])
    assert cfg.generate_config.placement == "separate" and cfg.rl_config.off_policy_steps == 1
    assert cfg.actor_config.lora_rank == 8
    # LoRA on a training replica in tensor-parallel pieces or pipeline stages
    for pieces in ("model_parallel", "pipeline_stage"):
        cfg = load_config(GRPOConfig, overrides=SEPARATE + [f"actor_config.parallel_config.{pieces}=2",
                                                            "actor_config.lora_rank=8"])
        assert cfg.actor_config.lora_rank == 8 and cfg.actor_config.parallel_config.world_size == 2
    # a rollout group of three replicas (world 4), with LoRA, a reward model and a judge on the training rank, the
    # batch not a multiple of three (uneven shares)
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["generate_config.parallel_config.data_parallel=3",
                                                        "rl_config.batch_size=4", "actor_config.lora_rank=8",
                                                        "reward_config.reward_models=[{path: rm.ckpt}]",
                                                        "reward_config.judges=[{path: models/judge}]"])
    assert cfg.generate_config.parallel_config.data_parallel == 3 and len(cfg.reward_config.judges) == 1
    # rollout replicas of two tensor-parallel pieces each (world 1 + 2 x 2), with a reward model on the training rank
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["generate_config.parallel_config.data_parallel=2",
                                                        "generate_config.parallel_config.model_parallel=2",
                                                        "reward_config.reward_models=[{path: rm.ckpt}]"])
    assert cfg.generate_config.parallel_config.world_size == 4
    # a training group of two replicas of two tensor-parallel pieces (world 4 + 1), with a reward model on rank 0
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["actor_config.parallel_config.data_parallel=2",
                                                        "actor_config.parallel_config.model_parallel=2",
                                                        "reward_config.reward_models=[{path: rm.ckpt}]"])
    assert cfg.actor_config.parallel_config.world_size == 4
    # a training replica of two pipeline stages of two tensor-parallel pieces each
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["actor_config.parallel_config.pipeline_stage=2",
                                                        "actor_config.parallel_config.model_parallel=2"])
    assert cfg.actor_config.parallel_config.world_size == 4
    # LoRA beside rollout replicas of two tensor-parallel pieces (each keeps its slice of the adapters)
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["generate_config.parallel_config.model_parallel=2",
                                                        "actor_config.lora_rank=8"])
    assert cfg.actor_config.lora_rank == 8
    # two training replicas splitting AdamW's moments (ZeRO-1: sharded checkpoints over the training group)
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["actor_config.parallel_config.data_parallel=2",
                                                        "actor_config.parallel_config.optimizer_shard=true"])
    assert cfg.actor_config.parallel_config.optimizer_shard
    # an environment: the rollout ranks run its conversations as tools' (its resets are the prompts), on any group
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["generate_config.environment=guess_number",
                                                        "generate_config.parallel_config.data_parallel=2",
                                                        "actor_config.parallel_config.data_parallel=2"])
    assert cfg.generate_config.environment == "guess_number"
    # dynamic sampling with any off_policy_steps: the rollout ranks decide each step's rounds with the rule rewards
    for lag in (0, 1, 2):
        cfg = load_config(GRPOConfig, overrides=SEPARATE + ["rl_config.dynamic_sampling=true",
                                                            f"rl_config.off_policy_steps={lag}",
                                                            "generate_config.parallel_config.data_parallel=2"])
        assert cfg.rl_config.dynamic_sampling and cfg.rl_config.off_policy_steps == lag
        assert cfg.rollout_ranks_resample()
    # with off_policy_steps 0 a reward model or a judge too: training rank 0 decides after each rollout
    cfg = load_config(GRPOConfig, overrides=SEPARATE + ["rl_config.dynamic_sampling=true",
                                                        "reward_config.reward_models=[{path: rm.ckpt}]",
                                                        "reward_config.judges=[{path: models/judge}]"])
    assert cfg.rl_config.dynamic_sampling and not cfg.rollout_ranks_resample()
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=SEPARATE + extra)
    assert info.value.key == key
    with pytest.raises(ConfigError, match="colocated, separate|'colocated', 'separate'"):
        load_config(GRPOConfig, overrides=["generate_config.placement=apart"])


@pytest.mark.parametrize("extra", [[], ["generate_config.parallel_config.data_parallel=2"],
                                   ["generate_config.partial_rollout=true"], ["generate_config.tools=[calculator]"]])
@pytest.mark.parametrize("lag", [2, 3])
def test_the_separate_placement_runs_k_steps_off_policy(lag, extra):
    # the rollout ranks run up to k steps ahead (a queue of k steps' samples: rollout_worker.StepQueue); the bound
    # is max_staleness's, as in one process
    cfg = load_config(GRPOConfig, overrides=SEPARATE + [f"rl_config.off_policy_steps={lag}", *extra])
    assert cfg.rl_config.off_policy_steps == lag and cfg.generate_config.placement == "separate"
    assert cfg.staleness_bound() == lag + int(cfg.generate_config.partial_rollout)
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=SEPARATE + [f"rl_config.off_policy_steps={lag}",
                                                      f"rl_config.max_staleness={lag - 1}", *extra])
    assert info.value.key == "rl_config.max_staleness"


TRAIN_DP2 = ["actor_config.parallel_config.data_parallel=2", "actor_config.micro_batch_size=1"]


PARTIAL = ["rl_config.off_policy_steps=1", "generate_config.partial_rollout=true"]


def test_a_separate_training_group_of_several_ranks_runs_what_one_training_rank_runs():  # partial rollouts too
    # two training ranks beside two rollout ranks (world 4), with the warm start, validation and off_policy_steps 1,
    # LoRA (the adapters' gradients summed over the group, rank 0's adapters to the rollout ranks) and a reward model
    # (rank 0 scores for the group: parallel/shared_rewards.SharedModelRewards) and tool calls (the value meeting
    # brings every training rank the conversations' values)
    cfg = load_config(GRPOConfig, overrides=SEPARATE + TRAIN_DP2 + [
        "generate_config.parallel_config.data_parallel=2", "rl_config.off_policy_steps=1", "rl_config.val_interval=5",
        "sft_config.steps=3", "actor_config.lora_rank=8", "reward_config.reward_models=[{path: rm.ckpt}]",
        "generate_config.tools=[calculator]"])
    assert cfg.actor_config.parallel_config.data_parallel == 2 and cfg.actor_config.lora_rank == 8
    assert len(cfg.reward_config.reward_models) == 1 and list(cfg.generate_config.tools) == ["calculator"]
    # partial rollouts on a training group of data-parallel ranks, tensor-parallel pieces or pipeline stages beside
    # one rollout rank: every training rank keeps the same prompts in flight (the samples meeting gives it every group)
    for group in (TRAIN_DP2, ["actor_config.parallel_config.model_parallel=2"],
                  ["actor_config.parallel_config.pipeline_stage=2"]):
        cfg = load_config(GRPOConfig, overrides=SEPARATE + PARTIAL + group)
        assert cfg.generate_config.partial_rollout and cfg.actor_config.parallel_config.world_size == 2
    # beside rollout replicas too, each keeping its groups in flight, whole or in tensor-parallel pieces
    for replicas in (["generate_config.parallel_config.data_parallel=2"],
                     ["generate_config.parallel_config.model_parallel=2"]):
        cfg = load_config(GRPOConfig, overrides=SEPARATE + PARTIAL + TRAIN_DP2 + replicas)
        assert cfg.generate_config.partial_rollout and cfg.generate_config.parallel_config.world_size == 2


@pytest.mark.parametrize("lag", [0, 1])
def test_tools_run_with_the_separate_placement_but_not_with_partial_rollouts(lag):
    tools = ["generate_config.tools=[calculator]", f"rl_config.off_policy_steps={lag}"]
    cfg = load_config(GRPOConfig, overrides=SEPARATE + tools)  # the rollout rank runs the conversations
    assert cfg.generate_config.tools == ("calculator",) or list(cfg.generate_config.tools) == ["calculator"]
    # a rollout group of three, each its share's conversations on its own workers (one training rank)
    cfg = load_config(GRPOConfig, overrides=SEPARATE + tools + ["generate_config.parallel_config.data_parallel=3",
                                                                "rl_config.batch_size=4"])
    assert cfg.generate_config.parallel_config.data_parallel == 3 and list(cfg.generate_config.tools) == ["calculator"]
    if lag:  # with partial rollouts: the rollout ranks carry the conversations
        cfg = load_config(GRPOConfig, overrides=SEPARATE + tools + ["generate_config.partial_rollout=true"])
        assert cfg.generate_config.partial_rollout


@pytest.mark.parametrize("kind", [["generate_config.tools=[calculator]"], ["generate_config.environment=guess_number"]])
def test_partial_rollouts_with_conversations_run_in_one_process_and_on_the_rollout_ranks(kind):
    """Partial rollouts carry conversations in one process (grpo/partial_conversations.py) and on the rollout ranks
    of a separate placement (tools and an environment alike, with dynamic sampling too); colocated inference
    replicas keep no groups in flight: refused, naming its key."""
    partial = ["generate_config.partial_rollout=true", "rl_config.off_policy_steps=1"]
    cfg = load_config(GRPOConfig, overrides=partial + kind)
    assert cfg.generate_config.partial_rollout and cfg.generate_config.conversations
    cfg = load_config(GRPOConfig, overrides=SEPARATE + partial + kind)
    assert cfg.generate_config.partial_rollout and cfg.generate_config.placement == "separate"
    assert cfg.generate_config.conversations
    cfg = load_config(GRPOConfig, overrides=SEPARATE + partial + kind + ["rl_config.dynamic_sampling=true"])
    assert cfg.rollout_ranks_resample()  # the rollout ranks score their rounds with the conversations' columns
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=partial + kind + ["generate_config.parallel_config.data_parallel=2",
                                                            "actor_config.parallel_config.data_parallel=2"])
    assert info.value.key == "generate_config.parallel_config"


@pytest.mark.parametrize("extra, key", [
    ([], "rl_config.off_policy_steps"),
    (["rl_config.off_policy_steps=1", "generate_config.parallel_config.data_parallel=2"],
     "generate_config.parallel_config"),
])
def test_partial_rollout_rules(extra, key):
    cfg = load_config(GRPOConfig, overrides=["generate_config.partial_rollout=true", "rl_config.off_policy_steps=1"])
    assert cfg.generate_config.partial_rollout
    # a carried sample's first tokens are one rollout older: the default bound lets it train
    assert cfg.staleness_bound() == 2
    assert load_config(GRPOConfig, overrides=["rl_config.off_policy_steps=1"]).staleness_bound() == 1
    assert load_config(GRPOConfig, overrides=["generate_config.partial_rollout=true", "rl_config.off_policy_steps=1",
                                              "rl_config.max_staleness=1"]).staleness_bound() == 1
    cfg = load_config(GRPOConfig, overrides=["generate_config.partial_rollout=true", "rl_config.off_policy_steps=1",
                                             *SEPARATE])  # the rollout rank keeps the groups in flight
    assert cfg.generate_config.partial_rollout and cfg.generate_config.placement == "separate"
    # dynamic sampling's rounds are partial rollouts of the groups still needed (one process)
    cfg = load_config(GRPOConfig, overrides=["generate_config.partial_rollout=true", "rl_config.off_policy_steps=1",
                                             "rl_config.dynamic_sampling=true"])
    assert cfg.generate_config.partial_rollout and cfg.rl_config.dynamic_sampling
    cfg = load_config(GRPOConfig, overrides=["generate_config.partial_rollout=true", "rl_config.off_policy_steps=1",
                                             "rl_config.dynamic_sampling=true", *SEPARATE])
    assert cfg.rollout_ranks_resample()  # the rollout ranks decide a step's rounds (rule rewards)
    with pytest.raises(ConfigError) as info:  # they cannot score with the models of training rank 0
        load_config(GRPOConfig, overrides=["generate_config.partial_rollout=true", "rl_config.off_policy_steps=1",
                                           "rl_config.dynamic_sampling=true", *SEPARATE,
                                           "reward_config.judges=[{path: models/judge}]"])
    assert info.value.key == "reward_config.judges"
    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, overrides=["generate_config.partial_rollout=true", *extra])
    assert info.value.key == key
