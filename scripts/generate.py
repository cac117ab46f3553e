"""Generate completions with our MindSpore Qwen2 inference graph.

    python scripts/generate.py --model PATH --prompt TEXT [--prompt TEXT ...] --max_tokens N \
        [--greedy | --temperature T --top_p P --top_k K --min_p M] [--n N] [--tokenizer_dir DIR] \
        [--template raw|qwen_chat|qwen_r1] [--seed S] [--lora ADAPTER_DIR]

PATH is an HF directory (config.json + safetensors) or a MindSpore .ckpt with config.json or
config.yaml beside it (or --config); a prompt's tokens + --max_tokens must fit in the model's
context (max_position_embeddings). The tokenizer (vocab.json + merges.txt) is read from
--tokenizer_dir, by default the model's folder, else (a training checkpoint,
checkpoints/step_N/policy.ckpt) the run's checkpoints/tokenizer. --lora: a PEFT LoRA adapter folder (a
training checkpoint's `adapter/`, or any plain LoRA adapter PEFT wrote for this model) on top of the model.
--greedy (or --temperature 0) takes --n 1: n greedy samples would be copies. Prints one JSON line per completion:
{"prompt": ..., "completion": ..., "token_ids": [...], "finish_reason": ...}; a summary with
tokens/s goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--config", help="model config (default: beside the weights)")
    ap.add_argument("--lora", help="a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) "
                    "on top of --model")
    ap.add_argument("--prompt", action="append", required=True)
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top_k", type=int, default=0)
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--min_p", type=float, default=0.0)
    ap.add_argument("--n", type=int, default=1, help="samples per prompt")
    ap.add_argument("--tokenizer_dir", help="vocab.json + merges.txt (default: the model's folder, else a training "
                    "run's checkpoints/tokenizer)")
    ap.add_argument("--template", default="raw", help="prompt template: raw, qwen_chat, qwen_r1")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def check_args(args) -> None:
    """ValueError in one line for flags that cannot work together or an empty prompt."""
    from mindgrpo.inference.sampling import identical_greedy_samples

    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    if args.n > 1 and (args.greedy or args.temperature == 0):
        raise ValueError(identical_greedy_samples(args.n, "--greedy" if args.greedy else "--temperature 0"))
    for i, prompt in enumerate(args.prompt):
        if not prompt:
            raise ValueError(f"prompt {i + 1} (--prompt) is empty")


def main(argv=None) -> int:
    args = parse_args(argv)
    import mindspore as ms

    from mindgrpo.data.templates import render_prompt
    from mindgrpo.data.tokenizer import QwenTokenizer, find_tokenizer_dir
    from mindgrpo.inference.engine import RolloutEngine
    from mindgrpo.inference.sampling import SamplingParams
    from mindgrpo.models.checkpoint import load_model
    from mindgrpo.models.lora import load_adapter
    from mindgrpo.models.convert import WeightError

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        check_args(args)
        tokenizer = QwenTokenizer.from_dir(find_tokenizer_dir(args.model, args.tokenizer_dir))
        lm = load_model(args.model, args.config)
        if args.lora:
            load_adapter(lm, args.lora)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0 if args.greedy else args.temperature,
                                top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, n=args.n,
                                stop_token_ids=tuple(tokenizer.stop_token_ids), seed=args.seed)
        texts = [render_prompt(args.template, p) for p in args.prompt]
    except (WeightError, ValueError, OSError, KeyError) as e:
        print(f"generate: error: {e}", file=sys.stderr)
        return 1
    vocab = lm.config.vocab_size
    ids = tokenizer.encode_batch(texts)
    too_big = [i for row in ids for i in row if i >= vocab]
    if too_big:
        print(f"generate: error: token id {too_big[0]} is outside the model's vocabulary ({vocab}); "
              "is --tokenizer_dir the model's tokenizer?", file=sys.stderr)
        return 1
    engine = RolloutEngine(lm, pad_token_id=tokenizer.pad_token_id or 0, max_num_seqs=len(ids) * args.n)
    for i, row in enumerate(ids):
        if len(row) + args.max_tokens > engine.max_positions:
            print(f"generate: error: prompt {i + 1} is {len(row)} tokens; with --max_tokens {args.max_tokens} it "
                  f"needs {len(row) + args.max_tokens} positions, more than the model's context of "
                  f"{engine.max_positions} (max_position_embeddings)", file=sys.stderr)
            return 1
    for c in engine.generate(ids, params):
        print(json.dumps({"prompt": args.prompt[c.prompt_index], "completion": tokenizer.decode(c.token_ids, skip_special_tokens=True),
                          "token_ids": c.token_ids, "finish_reason": c.finish_reason}, ensure_ascii=False))
    s = engine.last_stats
    print(f"generated {s['new_tokens']} tokens in {s['seconds']:.2f}s ({s['tokens_per_s']:.1f} tokens/s, "
          f"{s['decode_steps']} decode steps, useful fraction {s['useful_fraction']:.2f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
