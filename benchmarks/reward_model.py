"""Scoring completions with an outcome reward model: our scorer (`models/reward_model.RewardScorer`) with padded
and with packed micro-batches, against transformers' Qwen2ForSequenceClassification, on the same sequences and
the same weights, with both frameworks' fp32 matmul rates beside them.

    python -m benchmarks.reward_model [--count 256] [--layers 24] [--min_len 100] [--max_len 1000]
        [--micro 8] [--max_tokens 8192] [--repeats 1] [--threads N] [--output benchmarks/results/reward_model.json]

The model: Qwen2.5-0.5B's shape (hidden 896, 14 heads, 2 KV heads, MLP 4864, its 151,936-token vocabulary;
--layers of its 24) under a scalar head, random weights (transformers' initialisation), saved once as an HF folder
that both sides load. The work: --count sequences, each a prompt of 32 to 128 tokens and a completion of --min_len
to --max_len tokens (uniform), random ids.
Sides (each timed call scores every sequence, in input order; one untimed call first compiles every shape):
  padded        RewardScorer, max_tokens 0: sequences sorted by length, --micro rows a micro-batch, each
                right-padded to its longest's row length (`row_length`: rounded up to 32, then to two values per
                octave; `reward_config.reward_models[].micro_batch_size`), the graphs of every row length kept
                (`kept_row_lengths` 64 instead of the default 4), so that the timed call compiles nothing
  packed        RewardScorer, max_tokens --max_tokens: packed rows of the longest sequence's row length, as many a
                micro-batch as the budget holds (`max_tokens_per_micro_batch`)
  transformers  Qwen2ForSequenceClassification (sdpa attention, torch.inference_mode), the same sorted micro-batches
                of --micro rows, each right-padded to its longest (no rounding), the score at the last real token
Our sides take our CPU kernels as a run does (MINDGRPO_CPU_KERNELS, default on: the matmuls of 512 rows and more,
and the attention: docs/cpu_kernels.md). Our two sides run in one process (one model), transformers in another; the processes take turns call by call
for --repeats rounds, so the machine's load falls on both. Rates are real tokens per second (padding not counted)
and the matching arithmetic rate: 2 x the decoder's parameters (embedding excluded) per token, attention's
score and value products excluded. The matmul rates are `benchmarks.matmul_peak`'s, in each side's process after
its scoring. The scores of the sides are compared (largest difference from transformers').
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time

import numpy as np

from benchmarks.harness import RESULTS, code_version, load_average, median, run_stamp, write_results
from benchmarks.matmul_peak import SQUARES, matmul_gflops
from benchmarks.workers import Workers

SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
             rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=4096, tie_word_embeddings=False)
SIDES = ("padded", "packed", "transformers")


def workload(count: int, min_len: int, max_len: int, vocab: int, seed: int = 0):
    """count token sequences (prompt + completion ids), the same for every side."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(32, 129, count)
    completions = rng.integers(min_len, max_len + 1, count)
    return [rng.integers(10, vocab, int(p + c)).tolist() for p, c in zip(prompts, completions)]


def save_model(folder: str, layers: int, pad_id: int = 0) -> int:
    """The random reward model as an HF folder; returns the decoder's parameters without the embedding."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(**SHAPE, num_hidden_layers=layers, num_labels=1, pad_token_id=pad_id)
    model = transformers.Qwen2ForSequenceClassification(cfg).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)


def serve(conn, framework: str, score) -> None:
    """A side's loop, once it is ready: "stop" ends it, "matmul" -> the framework's matmul rates, any other message
    -> (seconds, score(message) as a list)."""
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        if msg == "matmul":
            conn.send(matmul_gflops(framework, SQUARES))
            continue
        t0 = time.perf_counter()
        scores = score(msg)
        conn.send((time.perf_counter() - t0, scores.tolist()))


def ours_worker(conn, folder: str, seqs, micro: int, max_tokens: int) -> None:
    """Our side: one model, a padded and a packed RewardScorer; "padded" / "packed" -> (seconds, scores);
    "matmul" -> MindSpore's matmul rates."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    from mindgrpo.models.reward_model import RewardScorer, load_reward_model

    rm = load_reward_model(folder)
    # every row length's graphs kept (the default keeps 4): the timed calls compile nothing
    scorers = {"padded": RewardScorer(rm, micro, 0, kept_row_lengths=64),
               "packed": RewardScorer(rm, micro, max_tokens)}
    for scorer in scorers.values():
        scorer(seqs)  # compiles every shape
    serve(conn, "mindspore", lambda msg: scorers[msg](seqs))


def transformers_worker(conn, folder: str, seqs, micro: int, threads: int) -> None:
    """transformers' side: "transformers" -> (seconds, scores in input order); "matmul" -> torch's matmul rates."""
    import torch
    import transformers

    torch.set_num_threads(threads)  # a process that has imported MindSpore passes OMP_NUM_THREADS=1 to its children
    model = transformers.Qwen2ForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    batches = []
    for k in range(0, len(order), micro):
        part = order[k:k + micro]
        s = max(len(seqs[i]) for i in part)
        ids = torch.zeros((len(part), s), dtype=torch.long)
        mask = torch.zeros((len(part), s), dtype=torch.long)
        for row, i in enumerate(part):
            ids[row, :len(seqs[i])], mask[row, :len(seqs[i])] = torch.tensor(seqs[i]), 1
        batches.append((part, ids, mask))

    def score():
        out = np.zeros(len(seqs), np.float32)
        with torch.inference_mode():
            for part, ids, mask in batches:
                out[part] = model(input_ids=ids, attention_mask=mask).logits[:, 0].float().numpy()
        return out

    score()  # warm-up
    serve(conn, "torch", lambda msg: score())


def run(args) -> dict:
    seqs = workload(args.count, args.min_len, args.max_len, SHAPE["vocab_size"])
    tokens = sum(map(len, seqs))
    times = {s: [] for s in SIDES}
    scores, peaks, matmul = {}, {}, {}
    with tempfile.TemporaryDirectory() as folder:
        params = save_model(folder, args.layers)
        with Workers() as workers:
            ours = workers.start(ours_worker, folder, seqs, args.micro, args.max_tokens)
            theirs = workers.start(transformers_worker, folder, seqs, args.micro, args.threads)
            ours.recv(), theirs.recv()
            for _ in range(args.repeats):
                for side in SIDES:
                    seconds, scores[side] = (theirs if side == "transformers" else ours).ask(side)
                    times[side].append(seconds)
            matmul["mindspore"], matmul["torch"] = ours.ask("matmul"), theirs.ask("matmul")
            peaks["ours"], peaks["transformers"] = ours.ask("stop"), theirs.ask("stop")
    ref = np.asarray(scores["transformers"])
    sides = {}
    for side in SIDES:
        s = median(times[side])
        sides[side] = {"seconds": s, "seconds_all": times[side], "tokens_per_s": tokens / s,
                       "gflops_per_s": 2 * params * tokens / s / 1e9,
                       "max_abs_vs_transformers": float(np.abs(np.asarray(scores[side]) - ref).max()),
                       "score_std": float(np.std(scores[side]))}
    lengths = np.array([len(q) for q in seqs])
    return {"sides": sides, "matmul_gflops": matmul, "peak_rss_gb": peaks,
            "packed_vs_transformers": sides["transformers"]["seconds"] / sides["packed"]["seconds"],
            "padded_vs_transformers": sides["transformers"]["seconds"] / sides["padded"]["seconds"],
            "workload": {"count": args.count, "layers": args.layers, "tokens": int(tokens),
                         "length_mean": float(lengths.mean()), "length_max": int(lengths.max()),
                         "decoder_params": int(params), "micro": args.micro, "max_tokens": args.max_tokens}}


def markdown(res: dict) -> str:
    s, w, m = res["stamp"], res["workload"], res["matmul_gflops"]
    lines = [f"# Reward model scoring: padded, packed, transformers ({s['date']})", "",
             f"`{s['command']}` on {s['date']}, {s['machine']}, load average {s['load_average']} at the start, "
             f"{res['load_average_end']} at the end{res.get('note', '')}; {s['code']}.", "",
             f"{w['count']} sequences (mean {w['length_mean']:.0f}, max {w['length_max']} tokens, {w['tokens']} in all) "
             f"scored by a Qwen2.5-0.5B-shaped reward model of {w['layers']} layers ({w['decoder_params'] / 1e6:.0f} M "
             f"decoder parameters without the embedding); padded micro-batches of {w['micro']} rows, packed within "
             f"{w['max_tokens']} tokens. Seconds are medians of {s['repeats']} rounds.", "",
             "| side | seconds | tokens/s | GFLOP/s | vs transformers | largest score difference from transformers |",
             "|---|---|---|---|---|---|"]
    t = res["sides"]["transformers"]["seconds"]
    for side, d in res["sides"].items():
        lines.append(f"| {side} | {d['seconds']:.1f} | {d['tokens_per_s']:.0f} | {d['gflops_per_s']:.1f} | "
                     f"{t / d['seconds']:.2f}x | {d['max_abs_vs_transformers']:.2e} |")
    lines += ["", f"fp32 matmul peak in the same processes: MindSpore {m['mindspore']['peak']:.1f} GFLOP/s, "
              f"PyTorch {m['torch']['peak']:.1f} GFLOP/s. Peak RSS: ours {res['peak_rss_gb']['ours']:.2f} GB, "
              f"transformers {res['peak_rss_gb']['transformers']:.2f} GB."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=256)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--min_len", type=int, default=100)
    ap.add_argument("--max_len", type=int, default=1000)
    ap.add_argument("--micro", type=int, default=8, help="padded rows per micro-batch (our padded side, transformers)")
    ap.add_argument("--max_tokens", type=int, default=8192, help="packed side's tokens per micro-batch")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="PyTorch's threads")
    ap.add_argument("--note", default="", help="said after the load average, e.g. ' (other jobs shared the machine)'")
    ap.add_argument("--output", default=os.path.join(RESULTS, "reward_model.json"))
    args = ap.parse_args(argv)
    quoted = [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)]  # --note holds spaces
    stamp = dict(run_stamp("benchmarks.reward_model", quoted), repeats=args.repeats, code=code_version())
    res = dict(run(args), stamp=stamp, load_average_end=load_average(), note=args.note)
    write_results(args.output, res, markdown(res))
    print(markdown(res))
    return res


if __name__ == "__main__":
    main()
