"""Evaluate a model on a math set: K samples per problem, scored, pass@k / mean@K / maj@K.

    python scripts/evaluate.py --model PATH --data FILE --output DIR [--tokenizer_dir DIR] \
        [--n K --temperature T --top_p P --top_k K --max_tokens N] [--limit M] [--template qwen_r1] \
        [--reward accuracy] [--reward_plugin FILE] [--seed S] [--lora ADAPTER_DIR]

PATH is an HF folder or a MindSpore .ckpt with its config.json beside it (a training checkpoint's
policy.ckpt is one); the tokenizer (vocab.json + merges.txt) comes from --tokenizer_dir, by default
the model's folder, else (a training checkpoint, checkpoints/step_N/policy.ckpt) the run's
checkpoints/tokenizer; --lora a PEFT LoRA adapter folder on top of the model (a LoRA checkpoint's `adapter/`).
FILE is a prompt MindRecord of data_tools/rlhf_data.py, or a GSM8K-style .jsonl
/ .json (templated here with --template, default qwen_r1). Writes DIR/summary.json (pass@k for
k = 1, 2, 4, ... K with the unbiased estimator, mean@K, maj@K; with --temperature 0, pass@1 is greedy
accuracy) and DIR/samples.jsonl (every sample with its score), prints the table. A progress line
with tokens/s and the time left goes to stderr. Bad input stops it with one line naming the file.

With --reward_model RM (an HF folder of a Qwen2/Qwen3 *ForSequenceClassification with one label, or a
MindSpore .ckpt of one, `scripts/convert_weight.py`) every sample is also scored by that model, shown
its prompt's tokens and its completion's: samples.jsonl gets `rm_score`, summary.json `reward_model`
(the mean and each problem's mean over its K samples). The reward model reads the policy's tokens.

A model trained with tools (or an environment) is evaluated with them: the flags are the run's
generate_config keys, and the rollouts are the same conversations as in training (tool turns in the KV
cache, at most --max_turns of them), all problems in one generate call:

    python scripts/evaluate.py --model PATH --data FILE --output DIR --tools calculator [--max_turns 4] \
        [--tool_response_max_tokens 256] [--tool_timeout_s 10] [--tool_num_workers 2] [--tool_plugin FILE] \
        [--chat_template tokenizer_config.json]
    python scripts/evaluate.py ... --environment NAME [--environment_plugin FILE] [--environment_settings JSON] \
        --reward environment

--chat_template (default: the tokenizer folder's tokenizer_config.json) writes the turns and, for a .jsonl,
the prompts: --template's system message with the tools' definitions, the question, the open assistant turn,
as the trainer writes them (a MindRecord holds prompts written by rlhf_data.py --tools). An environment writes
its own prompts from each problem's `prompt` text. The rewards get the columns of training (tool_calls,
messages; env_reward, env_done); samples.jsonl gets each sample's turns and those columns, summary.json
`conversations` (tool/calls_mean, tool/errors, ..., env/*, turns/mean) beside pass@k.

Scoring given rows, without generating:

    python scripts/evaluate.py --score_only --input ROWS.jsonl --reward_model RM --output OUT.jsonl \
        [--template raw|NAME] [--tokenizer_dir DIR] [--rm_micro_batch_size 8] [--rm_max_tokens_per_micro_batch T]

Each row of ROWS.jsonl holds `prompt` and `completion` text; --template raw (the default) joins them as they
are, NAME (a prompt template, e.g. qwen_r1) renders the prompt with it first; the text is tokenized by the
tokenizer of --tokenizer_dir (default: the reward model's folder). OUT.jsonl gets each row back, in input
order, with a `score` field; it is written whole or not at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

NAME = "evaluate"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="HF folder, or a MindSpore .ckpt with config.json beside it")
    ap.add_argument("--config", help="model config (default: beside the weights)")
    ap.add_argument("--lora", help="a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) "
                    "on top of --model")
    ap.add_argument("--data", help="prompt MindRecord, or GSM8K-style .jsonl / .json")
    ap.add_argument("--output", required=True, help="folder for summary.json and samples.jsonl (--score_only: "
                    "the .jsonl to write)")
    ap.add_argument("--reward_model", help="a reward model (HF folder or .ckpt) scoring every sample")
    ap.add_argument("--reward_model_config", help="the reward model's config (default: beside its weights)")
    ap.add_argument("--rm_micro_batch_size", type=int, default=8, help="rows a reward-model micro-batch")
    ap.add_argument("--rm_max_tokens_per_micro_batch", type=int, default=0,
                    help="> 0: the reward model scores packed rows of at most this many tokens a micro-batch")
    ap.add_argument("--score_only", action="store_true", help="score --input's rows with --reward_model")
    ap.add_argument("--input", help="--score_only: a .jsonl of rows with prompt and completion text")
    ap.add_argument("--tokenizer_dir", help="vocab.json + merges.txt (default: the model's folder, else a training "
                    "run's checkpoints/tokenizer)")
    ap.add_argument("--template", help="prompt template for a .jsonl/.json file (default qwen_r1); a MindRecord "
                    "holds templated prompts")
    ap.add_argument("--max_prompt_length", type=int, help=".jsonl/.json: longer prompts are left out (default 512)")
    ap.add_argument("--n", type=int, default=1, help="samples per problem (K)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (then --n must be 1)")
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--top_k", type=int, default=0)
    ap.add_argument("--max_tokens", type=int, default=512)
    ap.add_argument("--limit", type=int, help="the first M problems only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reward", default="accuracy", help="a registered reward function")
    ap.add_argument("--reward_plugin", help="a Python file registering reward functions")
    ap.add_argument("--pass_threshold", type=float, default=1.0, help="a sample is right when it scores at least this")
    ap.add_argument("--num_workers", type=int, default=2, help="reward worker processes (0: score in this process)")
    ap.add_argument("--timeout_s", type=float, default=10.0, help="bound on one reward call in a worker")
    ap.add_argument("--max_num_seqs", type=int, default=64, help="decode slots of the rollout engine")
    conv = ap.add_argument_group("conversations", "as the run's generate_config keys (docs/tools.md)")
    conv.add_argument("--tools", help="comma-separated registered tools offered to the model")
    conv.add_argument("--max_turns", type=int, help="appended (tool or user) turns per sample at most (default 4)")
    conv.add_argument("--tool_response_max_tokens", type=int, help="each answer cut to this many tokens (default 256)")
    conv.add_argument("--tool_timeout_s", type=float, help="each call's wall-clock bound (default 10)")
    conv.add_argument("--tool_num_workers", type=int, help="worker processes for the calls (default 2)")
    conv.add_argument("--tool_plugin", help="a Python file of @register_tool functions")
    conv.add_argument("--chat_template", help="a tokenizer_config.json whose chat template writes the turns "
                      "(default: the tokenizer folder's)")
    conv.add_argument("--environment", help="a registered multi-turn environment")
    conv.add_argument("--environment_plugin", help="a Python file of @register_environment classes")
    conv.add_argument("--environment_settings", help="the environment's settings as a JSON object")
    return ap.parse_args(argv)


CONVERSATION_FLAGS = ("tools", "max_turns", "tool_response_max_tokens", "tool_timeout_s", "tool_num_workers",
                      "tool_plugin", "chat_template", "environment", "environment_plugin", "environment_settings")


class InputError(Exception):
    """Bad input: one line, naming the file."""


def check_args(args) -> None:
    from mindgrpo.inference.sampling import identical_greedy_samples

    if args.score_only:
        for flag in ("input", "reward_model"):
            if getattr(args, flag) is None:
                raise InputError(f"--score_only needs --{flag}")
        for flag in ("model", "data", "lora"):
            if getattr(args, flag) is not None:
                raise InputError(f"--{flag} does not apply to --score_only, which scores the rows of --input")
        if not os.path.isfile(args.input):
            raise InputError(f"{args.input}: no such file (--input)")
        return
    for flag in ("model", "data"):
        if getattr(args, flag) is None:
            raise InputError(f"--{flag} is required (or --score_only to score given rows)")
    if args.input is not None:
        raise InputError("--input applies to --score_only")
    if args.n < 1:
        raise InputError(f"--n must be >= 1, got {args.n}")
    if args.temperature == 0 and args.n > 1:
        raise InputError(identical_greedy_samples(args.n, "--temperature 0"))
    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be >= 1, got {args.limit}")
    if not os.path.exists(args.data):
        raise InputError(f"{args.data}: no such file (--data)")
    for flag in ("template", "max_prompt_length"):
        if not is_jsonl(args.data) and getattr(args, flag) is not None:
            raise InputError(f"--{flag} applies to .jsonl/.json data; {args.data} is a MindRecord of templated prompts")
    conversation_config(args)  # the conversation flags: refused before any work
    check_output(args.output)


def conversation_config(args):
    """A GRPOConfig whose generate_config holds the conversation flags, or None when none is given; a flag that
    cannot act (--max_turns without --tools or --environment, both of those) or a bad value is an InputError
    naming the flag."""
    from mindgrpo.config import ConfigError, GRPOConfig
    from mindgrpo.config.loader import from_dict

    gen = {k: getattr(args, k) for k in CONVERSATION_FLAGS if getattr(args, k) is not None}
    if not gen:
        return None
    if "tools" in gen:
        gen["tools"] = [t.strip() for t in gen["tools"].split(",") if t.strip()]
    if "environment_settings" in gen:
        try:
            gen["environment_settings"] = json.loads(gen["environment_settings"])
        except ValueError as e:
            raise InputError(f"--environment_settings: not JSON ({e})") from None
    try:
        cfg = from_dict(GRPOConfig, {"generate_config": gen})
    except ConfigError as e:
        raise InputError(f"--{e.key.rsplit('.', 1)[-1]}: {e.message}") from None
    if not cfg.generate_config.conversations:
        raise InputError("--tools names no tool")
    return cfg


def build_conversation(cfg, args, tokenizer):
    """The run's Conversations for cfg's flags (grpo/conversations.py): the chat template of --chat_template, else
    the tokenizer folder's tokenizer_config.json."""
    from mindgrpo.config import ConfigError
    from mindgrpo.data.tokenizer import find_tokenizer_dir
    from mindgrpo.grpo.conversations import build_conversations

    path = args.chat_template
    if path is None:
        beside = os.path.join(find_tokenizer_dir(args.model, args.tokenizer_dir), "tokenizer_config.json")
        path = beside if os.path.isfile(beside) else None
    elif not os.path.isfile(path):
        raise InputError(f"--chat_template {path}: no such file (a tokenizer_config.json with a chat_template)")
    try:
        return build_conversations(cfg, tokenizer, path), path
    except ConfigError as e:
        raise InputError(f"--{e.key.rsplit('.', 1)[-1]}: {e.message}") from None


def check_output(output: str) -> None:
    """--output names a folder, or one this process can create: checked before any work (the outputs are
    written at the end)."""
    from mindgrpo.eval.runner import SAMPLES_FILE, SUMMARY_FILE

    path = os.path.abspath(output)
    while not os.path.lexists(path):  # the nearest part of the path that exists
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise InputError(f"--output {output}: {path} is a file; --output names the folder for {SUMMARY_FILE} and "
                         f"{SAMPLES_FILE}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"--output {output}: cannot write into {path}")


def is_jsonl(path: str) -> bool:
    return path.endswith((".jsonl", ".json"))


def load_tokenizer(args, weights=None):
    """(the tokenizer of --tokenizer_dir, else that of `weights` (default --model): its folder, or a training run's
    checkpoints/tokenizer; where it was found, as a message names it)."""
    from mindgrpo.data.tokenizer import QwenTokenizer, find_tokenizer_dir

    folder = find_tokenizer_dir(weights or args.model, args.tokenizer_dir)
    where = f"--tokenizer_dir {folder}" if args.tokenizer_dir else f"{folder} (the default of --tokenizer_dir)"
    return QwenTokenizer.from_dir(folder), where


def check_tokenizer(tokenizer, vocab_size: int, where: str) -> None:
    """A tokenizer of more tokens than the model's vocabulary is not the model's."""
    if tokenizer.vocab_size > vocab_size:
        raise InputError(f"{where}: its tokenizer has {tokenizer.vocab_size} tokens, more than the model's vocabulary "
                         f"of {vocab_size}; pass the tokenizer the model was trained with")


def load_problems(args, tokenizer, template=None):
    """template: the prompt template of a .jsonl (default --template, else qwen_r1)."""
    from mindgrpo.eval.runner import problems_from_mindrecord, problems_from_questions

    if not is_jsonl(args.data):
        return problems_from_mindrecord(args.data, args.limit)
    return problems_from_questions(args.data, tokenizer, template or args.template or "qwen_r1",
                                   args.max_prompt_length or 512, args.limit)


def tool_prompt_template(args, cfg, chat_template: str):
    """With --tools, a .jsonl's prompts as the trainer writes them: the chat template's one-question prompt with
    --template's system message and the tools' definitions."""
    from mindgrpo.data.templates import ChatTemplateError, chat_prompt_template, get_template
    from mindgrpo.tools import tool_schema

    try:
        return chat_prompt_template(chat_template, get_template(args.template or "qwen_r1").system,
                                    [tool_schema(n) for n in cfg.generate_config.tools])
    except (ChatTemplateError, KeyError) as e:
        raise InputError(f"--chat_template {chat_template}: {e}") from None


def check_problems(problems, vocab_size: int, max_positions: int, max_tokens: int, turn_positions: int = 0) -> int:
    """The longest prompt; InputError naming the data file for a token id outside the model's
    vocabulary (a MindRecord written with another tokenizer) or a prompt that does not fit the context with
    max_tokens (and conversations' `turn_positions`)."""
    for i, ids in enumerate(problems.ids):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InputError(f"{problems.path}: row {problems.rows[i]} holds token id {bad[0]}, outside the model's "
                             f"vocabulary of {vocab_size}; the data was written with another tokenizer than the "
                             "model's")
        if len(ids) + max_tokens + turn_positions > max_positions:
            turns = f" and {turn_positions} for the appended turns (--max_turns)" if turn_positions else ""
            raise InputError(f"{problems.path}: row {problems.rows[i]} is {len(ids)} tokens; with --max_tokens "
                             f"{max_tokens}{turns} it needs {len(ids) + max_tokens + turn_positions} positions, more "
                             f"than the model's context of {max_positions}")
    return max(len(ids) for ids in problems.ids)


def reward_scorer(args, vocab_size: int, whose: str = "the tokenizer's"):
    """The RewardScorer of --reward_model; InputError when its vocabulary does not hold `whose` (the tokenizer's,
    or the policy's)."""
    from mindgrpo.models.reward_model import RewardScorer, load_reward_model

    rm = load_reward_model(args.reward_model, args.reward_model_config)
    if rm.config.vocab_size < vocab_size:
        raise InputError(f"{args.reward_model}: the reward model's vocab_size {rm.config.vocab_size} is smaller than "
                         f"{whose} {vocab_size}")
    return RewardScorer(rm, args.rm_micro_batch_size, args.rm_max_tokens_per_micro_batch)


def read_scoring_rows(path: str) -> list:
    """The rows of a .jsonl, each an object with `prompt` and `completion` text; InputError naming file:line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise InputError(f"{path}:{n}: not JSON ({e})") from None
            if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("prompt", "completion")):
                raise InputError(f"{path}:{n}: a row needs \"prompt\" and \"completion\" text")
            rows.append((n, row))
    if not rows:
        raise InputError(f"{path}: no rows")
    return rows


def score_only(args) -> int:
    import mindspore as ms

    from mindgrpo.data.templates import TEMPLATES, render_prompt
    from mindgrpo.utils.staging import write_text

    ms.set_context(mode=ms.GRAPH_MODE)
    template = args.template or "raw"
    if template != "raw" and template not in TEMPLATES.names():
        raise InputError(f"--template {template!r}: not raw nor a prompt template ({', '.join(TEMPLATES.names())})")
    rows = read_scoring_rows(args.input)
    tokenizer, _ = load_tokenizer(args, args.reward_model)
    scorer = reward_scorer(args, tokenizer.vocab_size)
    context = int(scorer.rm.lm.rope_cos.shape[0])
    seqs = []
    for n, row in rows:
        prompt = row["prompt"] if template == "raw" else render_prompt(template, row["prompt"])
        ids = tokenizer.encode(prompt + row["completion"])
        if not ids:
            raise InputError(f"{args.input}:{n}: the prompt and completion are empty")
        if len(ids) > context:
            raise InputError(f"{args.input}:{n}: {len(ids)} tokens, more than the reward model's context of {context}")
        seqs.append(ids)
    scores = scorer(seqs)
    write_text(args.output, "".join(json.dumps({**row, "score": float(v)}, ensure_ascii=False) + "\n"
                                     for (_, row), v in zip(rows, scores)))
    print(f"scored {len(rows)} rows (mean {float(scores.mean()):.4f}) -> {args.output}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    from mindgrpo.models.convert import WeightError
    from mindgrpo.rewards import RewardError

    try:
        check_args(args)
        return score_only(args) if args.score_only else run(args)
    except (InputError, WeightError, RewardError, ValueError, OSError) as e:
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 1
    except KeyError as e:  # a MindRecord without a column; str() of a KeyError quotes its text
        print(f"{NAME}: error: {e.args[0]}", file=sys.stderr)
        return 1


def run(args) -> int:
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    tokenizer, tokenizer_source = load_tokenizer(args)
    cfg = conversation_config(args)
    conversations, template = None, None
    if cfg is not None:
        conversations, chat_template = build_conversation(cfg, args, tokenizer)
        if cfg.generate_config.tools and is_jsonl(args.data):
            template = tool_prompt_template(args, cfg, chat_template)
    try:
        return generate_and_score(args, tokenizer, tokenizer_source, template, conversations)
    finally:
        if conversations is not None:
            conversations.close()  # the tool workers and their folders


def generate_and_score(args, tokenizer, tokenizer_source, template, conversations) -> int:
    from mindgrpo.eval.runner import ProgressLine, evaluate, format_table, write_outputs
    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.models.checkpoint import load_model
    from mindgrpo.models.lora import load_adapter
    from mindgrpo.rewards import RewardSet, load_reward_plugin

    problems = load_problems(args, tokenizer, template)
    if args.reward_plugin:
        load_reward_plugin(args.reward_plugin, "--reward_plugin")
    rewards = RewardSet([args.reward], num_workers=args.num_workers, timeout_s=args.timeout_s)
    extra = list(conversations.columns) if conversations is not None else []
    rewards.check_columns([*problems.columns, "completion_length", *extra], f"the problems of {args.data}")
    turn_positions = conversations.extra_positions if conversations is not None else 0
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, n=args.n, stop_token_ids=tuple(tokenizer.stop_token_ids), seed=args.seed)
    lm = load_model(args.model, args.config)
    check_tokenizer(tokenizer, lm.config.vocab_size, tokenizer_source)  # before the prompts' ids are checked
    if args.lora:
        load_adapter(lm, args.lora)
    max_positions = int(lm.rope_cos.shape[0])
    longest = check_problems(problems, lm.config.vocab_size, max_positions, args.max_tokens, turn_positions)
    capacity = longest + args.max_tokens + turn_positions
    if conversations is not None and conversations.prompts is not None:
        capacity = None  # an environment writes its prompts in the call: the engine sizes its slots then
    engine = RolloutEngine(lm, pad_token_id=tokenizer.pad_token_id or 0, max_num_seqs=args.max_num_seqs,
                           max_model_len=capacity)
    settings = {"model": os.path.abspath(args.model), "data": os.path.abspath(args.data)}
    settings.update({k: getattr(args, k) for k in ("tools", "environment") if getattr(args, k)})
    score_model = None
    if args.reward_model:
        score_model = reward_scorer(args, lm.config.vocab_size, "the policy's")
        context = int(score_model.rm.lm.rope_cos.shape[0])
        if longest + args.max_tokens > context:
            raise InputError(f"{args.reward_model}: the reward model's context of {context} cannot hold the longest "
                             f"prompt ({longest} tokens) and --max_tokens {args.max_tokens}")
        settings["reward_model"] = os.path.abspath(args.reward_model)
    try:
        result = evaluate(engine, tokenizer, problems, params, rewards, args.reward, args.pass_threshold,
                          on_progress=ProgressLine(len(problems)), settings=settings, score_model=score_model,
                          conversations=conversations)
    finally:
        rewards.close()
    paths = write_outputs(args.output, result)
    print(format_table(result.summary))
    print(f"wrote {paths['summary']} and {paths['samples']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
