"""Evaluate a model on a math set: K samples per problem, scored, pass@k / mean@K / maj@K.

    python scripts/evaluate.py --model PATH --data FILE --output DIR [--tokenizer_dir DIR] \
        [--n K --temperature T --top_p P --top_k K --max_tokens N] [--limit M] [--template qwen_r1] \
        [--reward accuracy] [--reward_plugin FILE] [--seed S] [--lora ADAPTER_DIR]

PATH is an HF folder or a MindSpore .ckpt with its config.json beside it (a training checkpoint's
policy.ckpt is one); the tokenizer (vocab.json + merges.txt) comes from --tokenizer_dir, by default
the model's folder; --lora a PEFT LoRA adapter folder on top of it (a LoRA checkpoint's `adapter/`). FILE is a prompt MindRecord of data_tools/rlhf_data.py, or a GSM8K-style .jsonl
/ .json (templated here with --template, default qwen_r1). Writes DIR/summary.json (pass@k for
k = 1, 2, 4, ... K with the unbiased estimator, mean@K, maj@K; with --temperature 0, pass@1 is greedy
accuracy) and DIR/samples.jsonl (every sample with its score), prints the table. A progress line
with tokens/s and the time left goes to stderr. Bad input stops it with one line naming the file.
"""

from __future__ import annotations

import argparse
import os
import sys

NAME = "evaluate"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF folder, or a MindSpore .ckpt with config.json beside it")
    ap.add_argument("--config", help="model config (default: beside the weights)")
    ap.add_argument("--lora", help="a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) "
                    "on top of --model")
    ap.add_argument("--data", required=True, help="prompt MindRecord, or GSM8K-style .jsonl / .json")
    ap.add_argument("--output", required=True, help="folder for summary.json and samples.jsonl")
    ap.add_argument("--tokenizer_dir", help="vocab.json + merges.txt (default: the model's folder)")
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
    return ap.parse_args(argv)


class InputError(Exception):
    """Bad input: one line, naming the file."""


def check_args(args) -> None:
    if args.n < 1:
        raise InputError(f"--n must be >= 1, got {args.n}")
    if args.temperature == 0 and args.n > 1:
        raise InputError(f"--n {args.n} with --temperature 0 draws {args.n} identical greedy samples; use --n 1, or "
                         "sample with --temperature > 0")
    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be >= 1, got {args.limit}")
    if not os.path.exists(args.data):
        raise InputError(f"{args.data}: no such file (--data)")
    for flag in ("template", "max_prompt_length"):
        if not is_jsonl(args.data) and getattr(args, flag) is not None:
            raise InputError(f"--{flag} applies to .jsonl/.json data; {args.data} is a MindRecord of templated prompts")


def is_jsonl(path: str) -> bool:
    return path.endswith((".jsonl", ".json"))


def load_tokenizer(args):
    from mindgrpo.data.tokenizer import QwenTokenizer

    folder = args.tokenizer_dir or (args.model if os.path.isdir(args.model) else os.path.dirname(os.path.abspath(args.model)))
    for name in ("vocab.json", "merges.txt"):
        if not os.path.isfile(os.path.join(folder, name)):
            flag = "--tokenizer_dir" if args.tokenizer_dir else "the model's folder (pass --tokenizer_dir)"
            raise InputError(f"{os.path.join(folder, name)}: no such file; the tokenizer is read from {flag}")
    return QwenTokenizer.from_dir(folder)


def load_problems(args, tokenizer):
    from mindgrpo.eval.runner import problems_from_mindrecord, problems_from_questions

    if not is_jsonl(args.data):
        return problems_from_mindrecord(args.data, args.limit)
    return problems_from_questions(args.data, tokenizer, args.template or "qwen_r1", args.max_prompt_length or 512,
                                   args.limit)


def check_problems(problems, vocab_size: int, max_positions: int, max_tokens: int) -> int:
    """The longest prompt; InputError naming the data file for a token id outside the model's
    vocabulary or a prompt that does not fit the context with max_tokens."""
    for i, ids in enumerate(problems.ids):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InputError(f"{problems.path}: row {problems.rows[i]} holds token id {bad[0]}, outside the model's "
                             f"vocabulary of {vocab_size}; the data was written with another tokenizer")
        if len(ids) + max_tokens > max_positions:
            raise InputError(f"{problems.path}: row {problems.rows[i]} is {len(ids)} tokens; with --max_tokens "
                             f"{max_tokens} it needs {len(ids) + max_tokens} positions, more than the model's "
                             f"context of {max_positions}")
    return max(len(ids) for ids in problems.ids)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mindgrpo.models.convert import WeightError
    from mindgrpo.rewards import RewardError

    try:
        check_args(args)
        return run(args)
    except (InputError, WeightError, RewardError, ValueError, OSError) as e:
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 1
    except KeyError as e:  # a MindRecord without a column; str() of a KeyError quotes its text
        print(f"{NAME}: error: {e.args[0]}", file=sys.stderr)
        return 1


def run(args) -> int:
    import mindspore as ms

    from mindgrpo.eval.runner import ProgressLine, evaluate, format_table, write_outputs
    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.models.checkpoint import load_model
    from mindgrpo.models.lora import load_adapter
    from mindgrpo.rewards import RewardSet, load_reward_plugin

    ms.set_context(mode=ms.GRAPH_MODE)
    tokenizer = load_tokenizer(args)
    problems = load_problems(args, tokenizer)
    if args.reward_plugin:
        load_reward_plugin(args.reward_plugin)
    rewards = RewardSet([args.reward], num_workers=args.num_workers, timeout_s=args.timeout_s)
    rewards.check_columns([*problems.columns, "completion_length"], f"the problems of {args.data}")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, n=args.n, stop_token_ids=tuple(tokenizer.stop_token_ids), seed=args.seed)
    lm = load_model(args.model, args.config)
    if args.lora:
        load_adapter(lm, args.lora)
    max_positions = int(lm.rope_cos.shape[0])
    longest = check_problems(problems, lm.config.vocab_size, max_positions, args.max_tokens)
    engine = RolloutEngine(lm, pad_token_id=tokenizer.pad_token_id or 0, max_num_seqs=args.max_num_seqs,
                           max_model_len=longest + args.max_tokens)
    settings = {"model": os.path.abspath(args.model), "data": os.path.abspath(args.data)}
    try:
        result = evaluate(engine, tokenizer, problems, params, rewards, args.reward, args.pass_threshold,
                          on_progress=ProgressLine(len(problems)), settings=settings)
    finally:
        rewards.close()
    paths = write_outputs(args.output, result)
    print(format_table(result.summary))
    print(f"wrote {paths['summary']} and {paths['samples']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
