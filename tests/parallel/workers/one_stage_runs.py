"""Worker for tests/parallel/test_msrun.py: scripts/grpo_one_stage.py several times in one process,
with the given key=value settings plus each run's own, into folders of OUT_DIR named after the runs:

    msrun --worker_num=2 ... one_stage_runs.py OUT_DIR RUN[,RUN ...] [key=value ...]
    python one_stage_runs.py OUT_DIR single,single_packed [key=value ...]

Under msrun (--use_parallel True): swap_on, swap_off (training tp2, swap on and off), pp2 (two
pipeline stages), opt_whole, opt_shard (dp2 for two steps, the AdamW moments whole and split: ZeRO-1), sep0,
sep1 (generate_config.placement separate, off_policy_steps 0 with a warm start and 1 with a reward model, both validating; their
one-process peers: col0, col1), sep1p (sep1 with partial rollouts; its peer col1p), sep0r, sep1r (after
sep0, sep1: their last step again, resumed from their step-2 checkpoints), sep2 (off_policy_steps 2 for five
steps, validating; its peer col2), sep2r and col2r (sep2, col2 again from their step-2 checkpoints for steps 3-5), sepk
(sep1p killed with SIGKILL on rank 0 right after its step-1 checkpoint: the job fails), sepkr (sepk resumed in its
folder, --resume), sep0t (sep0's schedule with tool calls: TOOLS, on the micro model that calls tools of
tests/grpo/tool_caller.py, which the caller wrote into OUT_DIR/tool_caller; its peer: col0t), sep1pt (sep1p's
partial rollouts with sep0t's tool calls: the rollout rank carries the conversations; its peer: col1pt), sep0l (sep0
with LoRA rank 4, without validation, stopped after step 2 and resumed for step 3; its peer col0l), sep1l (LoRA with
off_policy_steps 1; its
peer col1l). On three ranks (msrun --worker_num=3: one training rank, a rollout group of two): sep0d (sep0, stopped
after step 2 and resumed for step 3) and sep1d (sep1), each rollout rank generating half of every step's groups; their
peers col0 and col1; sep0dl (sep0l; its peer col0l); sep0g (sep0d's schedule with two data-parallel training ranks
and one rollout rank; its peer col0); sep0dt (sep0t on the rollout group of two, each rank its half's conversations;
its peer col0t); sep0gl (sep0l on two training ranks; its peer col0l), sep1pg (sep1p on two training ranks, stopped
after step 1 and resumed; its peers col1p and sepk), sep1pd (sep1p on the rollout group of two, stopped after step 1
and resumed; checked against the data's order, col0s: one process, six steps of two prompts), sep1g (sep1, its
reward model scored on training rank 0 for both; its peer col1) and sep0gt (sep0t on two training ranks; its peer
col0t).
opt_shard stops after one step and resumes (--resume) for the second: its sharded checkpoint is read
back by every rank. One process, their peers: single (swap off), single_packed (packed rows). Runs in
one process share its start-up and imports (a process each cost seconds of CPU before it compiled).
dp0t: col0t's run colocated on two data-parallel replicas (training and generating), each running the conversations
of its half of the prompts on its own tool workers; its peer col0t.
sep0tp, sep1tp, sep1ptp (three ranks: sep0, sep1, sep1p with one training rank beside a rollout replica of two
tensor-parallel pieces; peers col0, col1, col1p); sep0tpg (three ranks: sep0g's schedule on a training replica of two tensor-parallel pieces beside
one rollout rank, its sharded checkpoint read back; peer col0); sep0ppg (sep0tpg on a training replica of two
pipeline stages, the untied micro model of tests/parallel/workers/micro_untied.yaml; peer col0u).
sep0e: an environment (guess_number: ENVIRONMENT) under separate, the rollout rank playing the games, with dynamic
sampling (DYNAMIC); its peer col0e. sep1ed (three ranks: sep0e one step off-policy on a rollout group of two, which
decides each step's rounds a step ahead); its peer col1e. sep1pen: partial rollouts with sep0e's environment and dynamic
sampling, one step off-policy (PARTIAL_ENVIRONMENT: the rollout rank carries the unfinished games); its peer col1pen;
sep1penr: sep1pen stopped after step 1 and resumed (the games in flight reset again on the rollout rank).
"""

import gc
import os
import sys

import mindgrpo.grpo.builder  # noqa: F401  (imported by each run: here so that they are frozen below)
import mindgrpo.grpo.trainer  # noqa: F401
from mindgrpo.parallel.checkpoint_folders import CRASH_ENV, PUBLISHED
from scripts import grpo_one_stage
from worker_clock import Clock

# what the imports made stays out of the full collection MindSpore runs before each compile (tests/conftest.py)
gc.collect()
gc.freeze()

TP2 = ["actor_config.parallel_config.model_parallel=2", "generate_config.parallel_config.data_parallel=2"]
PP2 = ["actor_config.parallel_config.pipeline_stage=2", "generate_config.parallel_config.data_parallel=2"]
DP2 = ["actor_config.parallel_config.data_parallel=2", "generate_config.parallel_config.data_parallel=2",
       "rl_config.max_steps=2"]  # two steps: the second update reads the moments of the first
# the single-process peer on packed rows (mindgrpo/grpo/packing.py): the trainer's update through them
PACKED = ["actor_config.max_tokens_per_micro_batch=1024", "actor_config.packing=true"]
MSRUN = ["--use_parallel", "True"]
# save_interval 2: the checkpoint of step 2 that sep0r and sep1r resume from
SEPARATE, OFF1 = ["generate_config.placement=separate", "rl_config.save_interval=2"], ["rl_config.off_policy_steps=1"]
# five steps (the lag of 2 shows from step 4), the checkpoint of step 2 kept for sep2r and col2r
OFF2 = ["rl_config.off_policy_steps=2", "rl_config.max_steps=5", "rl_config.keep_last_k=3"]
# validation at step 0 and after the last step (the test's 3) on 4 held-out prompts, greedy (VAL) or sampled (SAMPLED:
# a micro model's greedy answers may not move in 2 updates, its samples do); and a 2-step warm start
VAL, SAMPLED = ["rl_config.val_interval=3", "rl_config.val_size=4"], ["rl_config.val_temperature=1.0"]
WARM = \
    ["sft_config={steps: 2, batch_size: 4, lr: 1.0e-2}"]  # a section: the shared overrides set it as one
# partial rollouts; a tenth of the micro model's 512 ids stop a sample, so that lengths differ and a step's rollout
# stops with samples half done (they go on in the next step)
# rank 4 on all seven projections (docs/lora.md); beta > 0: the reference is the policy with its adapters off
LORA = ["actor_config.lora_rank=4", "rl_config.beta=0.04"]
PARTIAL = OFF1 + ["generate_config.partial_rollout=true", f"generate_config.stop_token_ids={list(range(100, 152))}"]
PARTIAL2 = ["rl_config.off_policy_steps=2"] + PARTIAL[1:]
# tool calls (docs/tools.md) on tests/grpo/tool_caller.py's micro model, its rewards reading the tools' answers
TOOLS = ["generate_config.tools=[calculator]", "generate_config.tool_num_workers=1", "generate_config.max_turns=1",
         "generate_config.tool_response_max_tokens=48", "generate_config.max_prompt_length=64",
         "generate_config.temperature=1.0",
         "generate_config.chat_template=model_configs/qwen_grpo/tiny_tools/tokenizer_config.json",
         f"actor_config.load_checkpoint={os.path.join(sys.argv[1], 'tool_caller', 'policy.ckpt')}",
         "reward_config.verifier_function=[test_text_length,test_tool_outcome]", "reward_config.verifier_weight=[1.0,1.0]"]
# partial rollouts one step off-policy with TOOLS (the tool caller's turns end on its own stop token); a step's 16
# samples decode at once, 16 tokens each, so that its rollout stops with conversations part way (mid-turn, after a
# tool turn)
PARTIAL_TOOLS = OFF1 + ["generate_config.partial_rollout=true", "generate_config.max_num_seqs=16",
                          "generate_config.max_tokens=16"] + TOOLS
# two colocated data-parallel replicas training and generating (half the 8 rows each: micro-batches of 4)
DP_TOOLS = ["actor_config.parallel_config.data_parallel=2", "generate_config.parallel_config.data_parallel=2",
            "actor_config.micro_batch_size=4"]
# a checkpoint every step, all kept: sepk's step 1 has groups in flight (its step 2 takes them all)
EVERY_STEP = ["rl_config.save_interval=1", "rl_config.keep_last_k=3"]
# an environment (docs/tools.md: the example guess_number, 1 to 3) writing the prompts and answering each model turn,
# rewarded by the game; a fifth of the micro model's ids stop a turn, so that the game answers within 8 tokens
ENVIRONMENT = ["generate_config.environment=guess_number", "generate_config.tool_num_workers=1",
               "generate_config.environment_settings={low: 1, high: 3, invalid_reward: -1.0}",
               "generate_config.chat_template=model_configs/qwen_grpo/tiny_tools/tokenizer_config.json",
               "generate_config.max_turns=1", "generate_config.tool_response_max_tokens=32",
               "generate_config.max_prompt_length=160", f"generate_config.stop_token_ids={list(range(3, 100))}",
               "reward_config.verifier_function=[environment]", "reward_config.verifier_weight=[2.0]"]
# dynamic sampling (DAPO): a group whose games all scored the same is drawn again, up to two more rollouts a step
DYNAMIC = ["rl_config.dynamic_sampling=true", "rl_config.max_resample_times=2"]
# partial rollouts with dynamic sampling, scored by a coarse reward (separate_rewards.py) so that a step has groups
# whose four samples all score the same: dropped, their prompts spent, further rounds of partial rollouts
PARTIAL_DYNAMIC = PARTIAL + DYNAMIC + ["reward_config.verifier_function=[test_length_mod3]"]
# partial rollouts one step off-policy with sep0e's environment and dynamic sampling; a step's 16 samples decode at once
# with 12 tokens of their own each, so that its rollout stops with games part way (mid-turn, after the game's answer;
# with 8 every game ends together, with 16 or more every game has two turns without a number: no spread of rewards)
PARTIAL_ENVIRONMENT = OFF1 + ["generate_config.partial_rollout=true", "generate_config.max_num_seqs=16",
                              "generate_config.max_tokens=12"] + ENVIRONMENT + DYNAMIC
ROLLOUT2 = ["generate_config.parallel_config.data_parallel=2"]  # two rollout ranks, whole replicas of the model
# one rollout replica of two tensor-parallel pieces (ranks 1 and 2 of a world of 3)
ROLLOUT_TP2 = ["generate_config.parallel_config.model_parallel=2"]
# a training replica of two tensor-parallel pieces (ranks 0 and 1 of a world of 3)
TRAIN_TP2 = ["actor_config.parallel_config.model_parallel=2"]
# a training replica of two pipeline stages (ranks 0 and 1 of a world of 3) on the micro model of three layers with
# untied embeddings (the first stage holds the embedding, the last the lm_head)
TRAIN_PP2 = ["actor_config.parallel_config.pipeline_stage=2"]
UNTIED = [f"actor_config.model={os.path.join(os.path.dirname(os.path.abspath(__file__)), 'micro_untied.yaml')}"]
# two training ranks, data-parallel (each trains half of a mini-batch's 8 rows: a micro-batch of 4)
TRAIN2 = ["actor_config.parallel_config.data_parallel=2", "actor_config.micro_batch_size=4"]
ZERO1 = ["actor_config.parallel_config.optimizer_shard=true"]
RUNS = {
    # name: the invocations of grpo_one_stage.py, each (flags, overrides after the shared ones)
    "swap_on": [(MSRUN + ["--swap", "True"], TP2)],
    "swap_off": [(MSRUN + ["--swap", "False"], TP2)],
    "pp2": [(MSRUN + ["--swap", "True"], PP2)],
    "opt_whole": [(MSRUN, DP2 + ["actor_config.parallel_config.optimizer_shard=false"])],
    "opt_shard": [(MSRUN, DP2 + ["actor_config.parallel_config.optimizer_shard=true", "rl_config.max_steps=1"]),
                  (MSRUN + ["--resume"], DP2 + ["actor_config.parallel_config.optimizer_shard=true"])],
    # generate_config.placement separate (rank 0 trains, rank 1 generates), synchronous and one step off-policy,
    # and their one-process peers (tests/grpo/test_off_policy.py); sep0 with a warm start, both with validation
    "sep0": [(MSRUN, SEPARATE + WARM + VAL)],
    "sep1": [(MSRUN, SEPARATE + OFF1 + VAL + SAMPLED)],
    "col0": [([], WARM + VAL)],
    "col1": [([], OFF1 + VAL + SAMPLED)],
    "sep1p": [(MSRUN, SEPARATE + PARTIAL)],
    # sep1p killed (SIGKILL, rank 0) right after its step-1 checkpoint, and resumed in place (--resume) for steps 2-3
    "sepk": [(MSRUN, SEPARATE + PARTIAL + EVERY_STEP)],
    "sepkr": [(MSRUN + ["--resume"], SEPARATE + PARTIAL + EVERY_STEP)],
    "col1p": [([], PARTIAL)],
    # partial rollouts two steps off-policy (not in the test's job: sep2's queue with sep1p's groups in flight)
    "sep2p": [(MSRUN, SEPARATE + PARTIAL2)],
    "col2p": [([], PARTIAL2)],
    # two steps off-policy over five steps (steps 1-3 sample with version 0, 4 with 1, 5 with 2), validating at steps
    # 0 and 3 (with version 1), and their one-process peer; sep2r, col2r: each resumed from its step-2 checkpoint
    "sep2": [(MSRUN, SEPARATE + OFF2 + VAL + SAMPLED)],
    "col2": [([], ["rl_config.save_interval=2"] + OFF2 + VAL + SAMPLED)],
    "sep0t": [(MSRUN, ["generate_config.placement=separate"] + TOOLS)],
    "col0t": [([], TOOLS)],
    # partial rollouts with tool calls (grpo/partial_conversations.py): the rollout rank carries the unfinished
    # conversations (their tool calls with them) into the next step; peer col1pt, the same in one process
    "sep1pt": [(MSRUN, SEPARATE + PARTIAL_TOOLS)],
    "col1pt": [([], PARTIAL_TOOLS)],
    # an environment under separate: the rollout rank runs its conversations (its resets are the prompts; peer col0e),
    # with dynamic sampling: the training rank asks the rollout rank for each further rollout of a step
    "sep0e": [(MSRUN, ["generate_config.placement=separate"] + ENVIRONMENT + DYNAMIC)],
    "col0e": [([], ENVIRONMENT + DYNAMIC)],
    # sep0e one step off-policy on a rollout group of two (world 3): the rollout ranks decide each step's rounds when
    # they generate it, a step ahead (every round with the weights of its first), their counts of groups with a spread
    # of rewards summed; its one-process peer col1e
    "sep1ed": [(MSRUN, ["generate_config.placement=separate"] + ENVIRONMENT + DYNAMIC + OFF1 + ROLLOUT2)],
    "col1e": [([], ENVIRONMENT + DYNAMIC + OFF1)],
    # dynamic sampling with partial rollouts: the rollout rank runs a step's rounds (each a partial rollout of the
    # groups still needed) when it generates it, a step ahead, and hands over each; its one-process peer col1pe
    "sep1pe": [(MSRUN, SEPARATE + PARTIAL_DYNAMIC)],
    "col1pe": [([], PARTIAL_DYNAMIC)],
    # partial rollouts with an environment: the rollout rank resets the games of its fresh prompts, carries the
    # unfinished ones (their state) into later steps and hands over the prompts as written; its peer col1pen
    "sep1pen": [(MSRUN, SEPARATE + PARTIAL_ENVIRONMENT)],
    "col1pen": [([], PARTIAL_ENVIRONMENT)],
    # sep1pen stopped after step 1 (games in flight; its checkpoint holds their prompts as drawn) and resumed for steps
    # 2-3: the rollout rank draws those prompts again and resets their games
    "sep1penr": [(MSRUN, SEPARATE + PARTIAL_ENVIRONMENT + EVERY_STEP + ["rl_config.max_steps=1"]),
                 (MSRUN + ["--resume"], SEPARATE + PARTIAL_ENVIRONMENT + EVERY_STEP)],
    # tool calls on two colocated inference replicas, each running its share's conversations (peer: col0t)
    "dp0t": [(MSRUN, TOOLS + DP_TOOLS)],
    # LoRA under a separate placement: the base at the start, after the warm start and after the resume (sep0l stops
    # after step 2 and resumes for step 3), the adapters each update
    "sep0l": [(MSRUN, SEPARATE + WARM + LORA + ["rl_config.max_steps=2"]),
              (MSRUN + ["--resume"], SEPARATE + WARM + LORA)],
    "col0l": [([], WARM + LORA)],
    "sep1l": [(MSRUN, SEPARATE + OFF1 + LORA)],
    "col1l": [([], OFF1 + LORA)],
    # a rollout group of two ranks (world 3): sep0's schedule, stopped after step 2 and resumed (the start meeting
    # reaches both rollout ranks) for step 3, and sep1's
    "sep0d": [(MSRUN, SEPARATE + WARM + VAL + ROLLOUT2 + ["rl_config.max_steps=2"]),
              (MSRUN + ["--resume"], SEPARATE + WARM + VAL + ROLLOUT2)],
    "sep1d": [(MSRUN, SEPARATE + OFF1 + VAL + SAMPLED + ROLLOUT2)],
    # a training group of two data-parallel ranks and one rollout rank (world 3): sep0d's schedule (warm start,
    # validation, stopped after step 2 and resumed: both training ranks read the checkpoint rank 0 wrote)
    "sep0g": [(MSRUN, SEPARATE + WARM + VAL + TRAIN2 + ["rl_config.max_steps=2"]),
              (MSRUN + ["--resume"], SEPARATE + WARM + VAL + TRAIN2)],
    # sep0g with AdamW's moments split over the two training ranks (ZeRO-1): sharded checkpoints, resumed from them
    "sep0gz": [(MSRUN, SEPARATE + WARM + VAL + TRAIN2 + ZERO1 + ["rl_config.max_steps=2"]),
               (MSRUN + ["--resume"], SEPARATE + WARM + VAL + TRAIN2 + ZERO1)],
    # sep0l on a training group of two (peer col0l): the adapters' gradients summed over the two, rank 0's adapters
    # to the rollout rank, its checkpoint (the adapters, adapter/ in PEFT's layout) read back by both training ranks
    "sep0gl": [(MSRUN, SEPARATE + WARM + LORA + TRAIN2 + ["rl_config.max_steps=2"]),
               (MSRUN + ["--resume"], SEPARATE + WARM + LORA + TRAIN2)],
    # sep1p on a training group of two beside one rollout rank, stopped after step 1 (its checkpoint holds prompts in
    # flight, written once by rank 0) and resumed (--resume) for steps 2-3: both training ranks read them back; peers
    # col1p (step 1) and sepk + sepkr (the same stop and resume on one training rank)
    "sep1pg": [(MSRUN, SEPARATE + PARTIAL + EVERY_STEP + TRAIN2 + ["rl_config.max_steps=1"]),
               (MSRUN + ["--resume"], SEPARATE + PARTIAL + EVERY_STEP + TRAIN2)],
    # sep1p on a rollout group of two, each keeping its own groups in flight and handing over its share of a step's
    # groups, stopped after step 1 and resumed for steps 2-3 (each rollout rank redraws its share of the prompts in
    # flight); checked against the data's order (col0s) and its own files
    "sep1pd": [(MSRUN, SEPARATE + PARTIAL + EVERY_STEP + ROLLOUT2 + ["rl_config.max_steps=1"]),
               (MSRUN + ["--resume"], SEPARATE + PARTIAL + EVERY_STEP + ROLLOUT2)],
    # sep1pd's stop and resume with dynamic sampling (sep1pe's): each round's groups shared between the replicas, their
    # counts of groups with a spread summed; dropped groups' prompts spent
    "sep1pde": [(MSRUN, SEPARATE + PARTIAL_DYNAMIC + EVERY_STEP + ROLLOUT2 + ["rl_config.max_steps=1"]),
                (MSRUN + ["--resume"], SEPARATE + PARTIAL_DYNAMIC + EVERY_STEP + ROLLOUT2)],
    # one process, six steps of 2 prompts (completions.jsonl logs each step's 2 G samples): the data's first 12
    # prompts in the order every run draws them
    "col0s": [([], ["rl_config.max_steps=6"])],
    # sep1 (a reward model) on a training group of two (peer col1): rank 0 scores, both train on its scores
    "sep1g": [(MSRUN, SEPARATE + OFF1 + VAL + SAMPLED + TRAIN2)],
    # sep0l with a rollout group of two (peer col0l; not in the test's job: the same meetings as sep0d's)
    "sep0dl": [(MSRUN, SEPARATE + WARM + LORA + ROLLOUT2 + ["rl_config.max_steps=2"]),
               (MSRUN + ["--resume"], SEPARATE + WARM + LORA + ROLLOUT2)],
    # sep0t on a rollout group of two: each rank runs its half of the prompts' conversations on its own tool workers
    "sep0dt": [(MSRUN, ["generate_config.placement=separate"] + TOOLS + ROLLOUT2)],
    # sep0t on a training group of two (peer col0t): the value meeting brings both training ranks the conversations'
    "sep0gt": [(MSRUN, ["generate_config.placement=separate"] + TOOLS + TRAIN2)],
    # a rollout replica of two tensor-parallel pieces beside one training rank (world 3): sep0's schedule (a warm
    # start, validation) and sep1's (one step off-policy, sampled validation, a reward model); peers col0 and col1
    "sep0tp": [(MSRUN, SEPARATE + WARM + VAL + ROLLOUT_TP2)],
    "sep1tp": [(MSRUN, SEPARATE + OFF1 + VAL + SAMPLED + ROLLOUT_TP2)],
    # sep1p beside a rollout replica of two tensor-parallel pieces (both keep the same groups in flight); peer col1p
    "sep1ptp": [(MSRUN, SEPARATE + PARTIAL + ROLLOUT_TP2)],
    # sep0l beside a rollout replica of two tensor-parallel pieces: each piece keeps its slice of the base and of
    # the adapters each meeting brings, and merges its pieces (peer col0l)
    "sep0tpl": [(MSRUN, SEPARATE + WARM + LORA + ROLLOUT_TP2 + ["rl_config.max_steps=2"]),
                (MSRUN + ["--resume"], SEPARATE + WARM + LORA + ROLLOUT_TP2)],
    # a training replica of two tensor-parallel pieces beside one rollout rank (world 3): sep0's schedule, stopped
    # after step 2 and resumed for step 3 (both training ranks read back the sharded checkpoint they wrote); peer col0
    "sep0tpg": [(MSRUN, SEPARATE + WARM + VAL + TRAIN_TP2 + ["rl_config.max_steps=2"]),
                (MSRUN + ["--resume"], SEPARATE + WARM + VAL + TRAIN_TP2)],
    # sep0tpg's schedule with LoRA (sep0l's): the adapters and their moments in pieces, the PEFT folder made whole
    "sep0tpgl": [(MSRUN, SEPARATE + WARM + LORA + TRAIN_TP2 + ["rl_config.max_steps=2"]),
                 (MSRUN + ["--resume"], SEPARATE + WARM + LORA + TRAIN_TP2)],
    # sep0tpg's schedule on a training replica of two pipeline stages (its sharded checkpoint read back by both
    # stages), on the untied micro model; its one-process peer col0u
    "sep0ppg": [(MSRUN, SEPARATE + WARM + VAL + TRAIN_PP2 + UNTIED + ["rl_config.max_steps=2"]),
                (MSRUN + ["--resume"], SEPARATE + WARM + VAL + TRAIN_PP2 + UNTIED)],
    "col0u": [([], WARM + VAL + UNTIED)],
    # sep0ppg's schedule with LoRA (sep0l's): each stage gives its layers' adapters; its one-process peer col0lu
    "sep0ppgl": [(MSRUN, SEPARATE + WARM + LORA + TRAIN_PP2 + UNTIED + ["rl_config.max_steps=2"]),
                 (MSRUN + ["--resume"], SEPARATE + WARM + LORA + TRAIN_PP2 + UNTIED)],
    "col0lu": [([], WARM + LORA + UNTIED)],
    "single": [(["--swap", "False"], [])],
    "single_packed": [(["--swap", "False"], PACKED)],
}

out, names, overrides = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
# sep1, col1 (and sep1r, sep1d, sep1g, sep1tp) also score with a reward model and a generative judge on the training
# rank (sep1g: on training rank 0 for both), the random ones of the micro shape that tests/parallel/test_separate.py saves as
# OUT_DIR/rm/rm.ckpt and OUT_DIR/judge/judge.ckpt (tests/grpo/fakes.save_reward_model, save_judge), beside the rule
REWARD_MODEL = [f"reward_config.reward_models=[{{path: {os.path.join(out, 'rm', 'rm.ckpt')}, name: rm, weight: 0.5}}]",
                f"reward_config.judges=[{{path: {os.path.join(out, 'judge', 'judge.ckpt')}, name: critic, weight: 0.25, "
                "max_tokens: 4, max_num_seqs: 8, max_model_len: 256, score_range: [0, 50]}]"]
for name in ("sep1", "col1", "sep1d", "sep1g", "sep1tp"):
    RUNS[name] = [(flags, more + REWARD_MODEL) for flags, more in RUNS[name]]
# single, single_packed, swap_on, swap_off, pp2 (tests/parallel/test_msrun.py) ask a generative judge too, the random one
# of the untied micro shape saved as OUT_DIR/judge/judge.ckpt: under msrun each rank answers half of the questions
JUDGE = [f"reward_config.judges=[{{path: {os.path.join(out, 'judge', 'judge.ckpt')}, name: critic, weight: 0.25, "
         "max_tokens: 4, max_num_seqs: 8, max_model_len: 256, score_range: [0, 50]}]"]
for name in ("single", "single_packed", "swap_on", "swap_off", "pp2"):
    RUNS[name] = [(flags, more + JUDGE) for flags, more in RUNS[name]]
# sep0r, sep1r: sep0 and sep1 again from their step-2 checkpoints (--resume_from) for their last step
for run, step in (("0", 2), ("1", 2), ("2", 2)):
    RUNS[f"sep{run}r"] = [(MSRUN + ["--resume_from", os.path.join(out, f"sep{run}", "checkpoints", f"step_{step:08d}")],
                           RUNS[f"sep{run}"][0][1])]
# col2r: col2 again from its step-2 checkpoint, sep2r's one-process peer (the lag restarts the same way)
RUNS["col2r"] = [(["--resume_from", os.path.join(out, "col2", "checkpoints", "step_00000002")],
                  RUNS["col2"][0][1])]
KILLED = {"sepk": f"1:{PUBLISHED}"}  # CRASH_ENV of a run: its rank 0 kills itself there
FOLDERS = {"sepkr": "sepk"}  # a run that goes on in another's output folder
unknown = [n for n in names if n not in RUNS]
if unknown:
    sys.exit(f"one_stage_runs.py: unknown runs {unknown}; valid: {sorted(RUNS)}")
clock = Clock("one_stage_runs")
for name in names:
    if name in KILLED:
        os.environ[CRASH_ENV] = KILLED[name]
    else:
        os.environ.pop(CRASH_ENV, None)
    for flags, more in RUNS[name]:
        code = grpo_one_stage.main([*flags, "--output_dir", os.path.join(out, FOLDERS.get(name, name)), *overrides,
                                    *more])
        if code:
            sys.exit(code)
        clock.mark(" ".join([name, *flags]))
