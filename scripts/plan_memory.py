"""Per-device memory of a GRPO config, phase by phase, with and without host-memory swap.

    python scripts/plan_memory.py --config model_configs/qwen_grpo/qwen2_5_7b/grpo_config.yaml [--device_gb 64]
    python scripts/plan_memory.py --config CONFIG key.sub=value ...      # dotted overrides, as for training

Groups: weights (policy, inference, reference), gradients, AdamW states, KV cache, the largest
resharding bucket, the reward models of reward_config.reward_models (their configs read beside their
weights), conversations' appended turns (generate_config.tools or environment: longer slots and rows), and an
activation estimate for the update (mindgrpo/memory/plan.py says how each is counted). The model comes from actor_config.model (a preset name or a file). On one device
it adds what MindSpore 2.10's CPU runtime keeps for the compiled graphs of each phase (measured at
the Qwen2.5-0.5B shape, scaled) and the CPU peak with the graphs kept or released
(rl_config.release_graphs).

Last, what rl_config.memory decides for this config (the same block a run logs at start-up: each memory
saver, who set it, the planned peak per phase, fits or not), planned against --device_gb when given, else
rl_config.memory_budget_gb, else this host's available memory now.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="GRPO YAML")
    ap.add_argument("--device_gb", type=float, help="device memory in GiB (default: for the fits lines 64, for "
                    "rl_config.memory the config's memory_budget_gb, else this host's available memory)")
    ap.add_argument("overrides", nargs="*", help="key.sub=value config overrides")
    args = ap.parse_args(argv)

    from mindgrpo.config import ConfigError, GRPOConfig, load_config
    from mindgrpo.config.sections import TURN_STEP, TURN_TEMPLATE_TOKENS
    from mindgrpo.memory.auto import apply, choose
    from mindgrpo.memory.plan import plan, report
    from mindgrpo.grpo.builder import reward_model_configs
    from mindgrpo.models.presets import preset_config
    from mindgrpo.parallel.layout import ParallelLayout

    try:
        cfg = load_config(GRPOConfig, args.config, args.overrides)
        mcfg = preset_config(cfg.actor_config.model, compute_dtype=cfg.actor_config.dtype)
        for section in ("actor_config", "generate_config"):
            ParallelLayout.from_config(getattr(cfg, section).parallel_config).check_divisible(mcfg)
        reward_models = reward_model_configs(cfg)  # the reward models', then the judges'
    except (ConfigError, OSError, ValueError) as e:
        print(f"plan_memory: error: {e}", file=sys.stderr)
        return 2
    actor, gen = cfg.actor_config.parallel_config, cfg.generate_config.parallel_config
    print(f"# Memory plan: {args.config}\n")
    print(f"Model {cfg.actor_config.model}: {mcfg.num_params() / 1e9:.2f} B parameters, compute dtype "
          f"{mcfg.compute_dtype}; training dp{actor.data_parallel} x tp{actor.model_parallel}"
          f"{f' x pp{actor.pipeline_stage}' if actor.pipeline_stage > 1 else ''}"
          f"{' (AdamW moments split over dp)' if actor.optimizer_shard else ''}, inference "
          f"dp{gen.data_parallel} x tp{gen.model_parallel} ({actor.world_size} devices); "
          f"{cfg.rl_config.batch_size} prompts x {cfg.rl_config.num_generations} samples, prompt <= "
          f"{cfg.generate_config.max_prompt_length}, response <= {cfg.generate_config.max_tokens} tokens, "
          f"micro-batch {cfg.actor_config.micro_batch_size}.\n")
    a = cfg.actor_config
    if a.lora_rank:
        print(f"LoRA rank {a.lora_rank} on {', '.join(a.lora_target_modules)}: gradients and AdamW moments of the "
              "adapters alone, the adapters beside the weights, no reference copy (the policy with its adapters off), "
              "the sync moves the adapters only.\n")
    g = cfg.generate_config
    if g.conversations:
        kind = f"tools {', '.join(g.tools)}" if g.tools else f"environment {g.environment}"
        print(f"Conversations ({kind}): each sample also holds up to {g.max_turns} appended turn(s) of "
              f"{g.turn_positions() // g.max_turns} tokens ({TURN_TEMPLATE_TOKENS} for the chat template's text, "
              f"{g.tool_response_max_tokens} of answer, rounded up to {TURN_STEP}): {g.turn_positions()} more "
              "positions in each KV-cache slot and each training row (the run logs its template's exact turn size).\n")
    print(report(plan(cfg, mcfg, reward_models=reward_models), int((args.device_gb or 64.0) * 2 ** 30)))
    budget = args.device_gb or cfg.rl_config.memory_budget_gb
    policy = choose(cfg, mcfg, "CPU", actor.world_size == 1, None if budget is None else int(budget * 2 ** 30),
                    reward_models=reward_models)
    print("\nThe plan above is of the config's explicit switches (an unset one: off). What rl_config.memory decides "
          "on one CPU device, and the plan with its choice:\n")
    print(policy.summary())
    if policy.overrides():
        print("\n" + report(plan(apply(cfg, policy.overrides()), mcfg, reward_models=reward_models)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
