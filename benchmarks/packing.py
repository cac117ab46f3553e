"""The reference and update passes on long-tailed responses: padded rows, token-budget micro-batches
and packed rows (mindgrpo/grpo/packing.py), and TRL's update on the same samples, side by side.

    python -m benchmarks.packing [--configs tiny-qwen-vocab tiny-small-vocab] [--repeats 3]
        [--samples 32] [--max_len 512] [--output benchmarks/results/update.json]

Two workloads of --samples prompts and completions (token ids; no generation), for each model config:
  longtail  response lengths drawn from a log-normal clipped to [16, max_len], mean about 0.3 of max_len,
            the longest at max_len (R1-style training: most responses short, a few truncated)
  equal     every sample of one length: the long-tailed workload's mean prompt and mean response
Long-tailed prompts are 48 to 112 tokens. One step = the reference model's log-probs of every sample,
then one optimizer step over all of them (beta 0.04, k3 KL, token-mean, grad clip 1, old log-probs
detached: num_iterations 1). On a vocabulary over 32k tokens (tiny-qwen-vocab) our sides score with
the fused, chunked head (actor_config.logprob_chunk_size = 256): autodiff's (rows, vocabulary) buffers
of 4 x 512 response positions would not fit beside the other sides.

Sides, each in its own process (`benchmarks.workers`), after a warm-up step (compiles: every
micro-batch shape the workload meets); the padded side runs throughout and each other side beside
it in turn, the two alternated step by step for --repeats rounds (`measure`):
  padded  micro-batches of 4 samples right-padded to the step's longest (the trainer's default)
  budget  actor_config.max_tokens_per_micro_batch = 4 rows of the padded length: the same most tokens
          per micro-batch as padded, samples sorted by length, each micro-batch padded to its own
  packed  the same budget with actor_config.packing: several samples per row
  trl     TRL's GRPOTrainer on the same ids: the reference model's `_get_per_token_logps_and_entropies`,
          then `_compute_loss` + backward per micro-batch of 4 (its padding: prompts left-padded,
          completions right-padded to the batch's longest), grad clip, its AdamW; loss_type dapo (a
          token mean over the whole batch); TRL's defaults otherwise (gradient checkpointing on)
Seconds are medians of the rounds (padded's over all its rounds; the ratios against padded from the
rounds beside it); peak RSS is each process's VmHWM at the end (the warm-up's compiles included).
Writes --output (`{"configs": {NAME: {"longtail": {...}, "equal": {...}}}}`, the details beside,
each workload's run stamp in "stamps": {NAME: {KIND: stamp}}) and a markdown table with the same name.
--keep FILE: the workloads (config and kind) of an earlier results file that this run does not
measure are kept in --output beside the new ones, with their own run stamps (one workload at a time
into one table).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Dict, List

import numpy as np

from benchmarks.harness import RESULTS, code_version, median, run_stamp, write_results
from benchmarks.tiny_models import ALL_CONFIGS, hf_model
from benchmarks.workers import Workers

BETA, LR, MICRO, CHUNK = 0.04, 1e-6, 4, 256
SIDES = ("padded", "budget", "packed", "trl")
KINDS = ("longtail", "equal")


# ----------------------------------------------------------------------------------- the workload
def workload(kind: str, samples: int, max_len: int, vocab: int, seed: int = 0):
    """(prompts, responses, advantages): token-id lists and (samples,) float32, the same for every side."""
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(48, 113, samples)
    lengths = longtail_lengths(samples, max_len, rng)
    if kind == "equal":  # samples of one length: prompts and responses of the long tail's means
        prompt_lens = np.full(samples, int(round(prompt_lens.mean())))
        lengths = np.full(samples, int(round(lengths.mean())))
    ids = lambda n: rng.integers(10, vocab, int(n)).tolist()  # noqa: E731
    advantages = rng.standard_normal(samples).astype(np.float32)
    return [ids(n) for n in prompt_lens], [ids(n) for n in lengths], advantages


def longtail_lengths(samples: int, max_len: int, rng) -> np.ndarray:
    """Log-normal lengths clipped to [16, max_len], the longest set to max_len: mean about 0.3 max_len."""
    lengths = np.clip(rng.lognormal(np.log(0.2 * max_len), 0.9, samples), 16, max_len).astype(int)
    lengths[np.argmax(lengths)] = max_len
    return lengths


def padded_len(prompts, responses) -> int:
    return -(-max(len(p) + len(r) for p, r in zip(prompts, responses)) // 32) * 32


# ----------------------------------------------------------------------------------- our sides
def build_side(name: str, side: str, prompts, responses, advantages):
    """Our side `side` (padded, budget or packed) of config `name` in this process (GRAPH_MODE, CPU):
    (reference Scorer, PolicyUpdater, Experience), nothing compiled yet."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    from mindgrpo.grpo.actor import PolicyUpdater, Scorer
    from mindgrpo.grpo.experience import pack
    from mindgrpo.grpo.ms_objective import GRPOLoss
    from mindgrpo.grpo.packing import Batching
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    cfg = Qwen2Config(**ALL_CONFIGS[name], max_position_embeddings=4096)
    budget = MICRO * padded_len(prompts, responses)
    batching = {"padded": {}, "budget": dict(max_tokens=budget),
                "packed": dict(max_tokens=budget, packing=True)}[side]
    policy, reference = Qwen2ForCausalLM(cfg, seed=0), Qwen2ForCausalLM(cfg, seed=0)
    chunk = CHUNK if cfg.vocab_size > 32768 else 0
    scorer = Scorer(reference, MICRO, chunk=chunk, **batching)
    updater = PolicyUpdater(policy, GRPOLoss(beta=BETA, kl_kind="k3", agg_mode="token-mean"),
                            Batching(MICRO, **batching), detach_old=True, use_ref=True, chunk=chunk)
    return scorer, updater, pack(prompts, responses, advantages)


def ours_worker(conn, name: str, side: str, prompts, responses, advantages) -> None:
    """A `benchmarks.workers` side: our reference scorer and PolicyUpdater with `side`'s batching;
    one warm-up step, then one timed step per "step" message (-> (reference s, update s, shapes))."""
    import time

    from mindgrpo.grpo.packing import plan

    scorer, updater, exp = build_side(name, side, prompts, responses, advantages)
    shapes = sorted({mb.ids.shape + (len(mb.exp),) for mb in plan(exp, updater.batching)})  # (rows, S, samples)

    def step():
        t0 = time.perf_counter()
        exp.ref_logp = scorer(exp)
        t1 = time.perf_counter()
        updater.update(exp, lr=LR)
        return t1 - t0, time.perf_counter() - t1

    step()  # warm-up: every shape compiles
    conn.send(("ready", [list(s) for s in shapes]))
    while conn.recv() == "step":
        conn.send(step())


# ----------------------------------------------------------------------------------- TRL's side
def trl_worker(conn, name: str, prompts, responses, advantages, folder: str, threads: int) -> None:
    """A `benchmarks.workers` side: TRL's reference pass and update (module docstring) on the same ids."""
    import time

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from mindgrpo.data.synthetic import ensure_tiny_tokenizer

    # a process that has imported MindSpore passes OMP_NUM_THREADS=1 on to its children
    torch.set_num_threads(threads)
    n = len(prompts)
    tokenizer_dir = os.path.join(folder, "tiny_tokenizer")
    ensure_tiny_tokenizer(tokenizer_dir)  # TRL wants a processing class; the ids below are ours
    args = GRPOConfig(
        output_dir=os.path.join(folder, "trl"), per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=n // MICRO, num_generations=4, beta=BETA, loss_type="dapo", learning_rate=LR,
        lr_scheduler_type="constant", max_grad_norm=1.0, max_steps=1, bf16=False, use_cpu=True,
        model_init_kwargs={"dtype": "float32"}, save_strategy="no", report_to="none", disable_tqdm=True, seed=0)
    hf_dir = os.path.join(folder, f"hf_{name}")  # TRL loads the policy and the reference from a folder
    hf_model(name, seed=0, overrides=ALL_CONFIGS[name]).save_pretrained(hf_dir)
    trainer = GRPOTrainer(model=hf_dir, reward_funcs=lambda **_: [0.0], args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * n}),
                          processing_class=AutoTokenizer.from_pretrained(tokenizer_dir))
    trainer.current_gradient_accumulation_steps = n // MICRO
    model = trainer.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

    # TRL's layout of a generation batch: prompts left-padded, completions right-padded
    p_len, c_len = max(map(len, prompts)), max(map(len, responses))
    prompt_ids, prompt_mask = torch.zeros(n, p_len, dtype=torch.long), torch.zeros(n, p_len, dtype=torch.long)
    completion_ids, completion_mask = torch.zeros(n, c_len, dtype=torch.long), torch.zeros(n, c_len, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_ids[i, p_len - len(p):], prompt_mask[i, p_len - len(p):] = torch.tensor(p), 1
        completion_ids[i, :len(r)], completion_mask[i, :len(r)] = torch.tensor(r), 1
    batch = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                 completion_mask=completion_mask, advantages=torch.tensor(advantages))
    input_ids, attention_mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    tokens = completion_mask.sum()

    def step():
        t0 = time.perf_counter()
        with torch.no_grad():
            ref, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, input_ids, attention_mask,
                                                                    c_len, batch_size=MICRO)
        t1 = time.perf_counter()
        for start in range(0, n, MICRO):
            micro = {k: v[start:start + MICRO] for k, v in batch.items()}
            micro.update(ref_per_token_logps=ref[start:start + MICRO], num_items_in_batch=tokens)
            trainer._compute_loss(model, micro).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return t1 - t0, time.perf_counter() - t1

    step()  # warm-up
    conn.send(("ready", []))
    while conn.recv() == "step":
        conn.send(step())


# ----------------------------------------------------------------------------------- the run
def measure(name: str, kind: str, samples: int, max_len: int, repeats: int, folder: str, threads: int) -> dict:
    """Every side on one workload: side -> {ref_s, update_s, step_s, vs_padded, peak_rss_gb, shapes}.

    The padded side runs throughout; each other side in turn runs beside it, the two alternated
    step by step (two sides in memory at a time: four would not fit beside other jobs on 24 GB), so
    each side's `vs_padded` (padded seconds / its seconds) comes from steps timed side by side."""
    prompts, responses, adv = workload(kind, samples, max_len, ALL_CONFIGS[name]["vocab_size"])
    times: Dict[str, List[tuple]] = {s: [] for s in SIDES}
    out = {}

    def start(sides, side):
        w = sides.start(trl_worker, name, prompts, responses, adv, folder, threads) if side == "trl" \
            else sides.start(ours_worker, name, side, prompts, responses, adv)
        out[side] = {"shapes": w.recv()[1]}  # after its warm-up
        return w

    with Workers() as sides:
        padded = start(sides, "padded")
        for side in SIDES[1:]:
            other, mine = start(sides, side), []
            for _ in range(repeats):
                mine.append(padded.ask("step"))
                times[side].append(other.ask("step"))
            out[side]["peak_rss_gb"] = other.ask("stop")
            out[side]["vs_padded"] = median([sum(t) for t in mine]) / median([sum(t) for t in times[side]])
            times["padded"] += mine
        out["padded"]["peak_rss_gb"] = padded.ask("stop")
    for side in SIDES:
        ref, upd = median([t[0] for t in times[side]]), median([t[1] for t in times[side]])
        out[side].update(ref_s=ref, update_s=upd, step_s=median([t[0] + t[1] for t in times[side]]))
    lengths = np.array([len(r) for r in responses])
    out["workload"] = dict(samples=samples, response_mean=float(lengths.mean()), response_max=int(lengths.max()),
                           padded_len=padded_len(prompts, responses),
                           tokens=int(sum(len(p) + len(r) for p, r in zip(prompts, responses))))
    return out


def summary(details: dict) -> dict:
    """The issue's layout: reference + update seconds and peak RSS of each side."""
    return {
        "padded_s": details["padded"]["step_s"], "budget_s": details["budget"]["step_s"],
        "packed_s": details["packed"]["step_s"], "trl_s": details["trl"]["step_s"],
        "padded_peak_rss_gb": details["padded"]["peak_rss_gb"], "packed_peak_rss_gb": details["packed"]["peak_rss_gb"]}


def markdown(res: dict) -> str:
    stamps = [(f"{name} {kind}", s) for name, by_kind in res["stamps"].items() for kind, s in by_kind.items()]
    lines = [f"# Reference + update: padded, token budget, packed, TRL ({max(s['date'] for _, s in stamps)})", ""]
    lines += [f"{workload}: `{s['command']}` on {s['date']}, {s['machine']}, load average {s['load_average']}, "
              f"{s['repeats']} rounds{', ' + s['code'] if 'code' in s else ''}." for workload, s in stamps]
    lines += ["", "Seconds per step (the reference log-probs, then one optimizer step over every sample), medians of "
              "the rounds; each ratio (above 1: faster than padded) from rounds alternated with the "
              "padded side; peak RSS of each side's process.", "",
              "| config | workload | padded s | budget s | packed s | TRL s | padded / budget | padded / packed | "
              "padded / TRL | padded peak GB | packed peak GB | budget peak GB | TRL peak GB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, kinds in res["configs"].items():
        for kind, row in kinds.items():
            d = res["details"][name][kind]
            lines.append(f"| {name} | {kind} | {row['padded_s']:.2f} | {row['budget_s']:.2f} | {row['packed_s']:.2f} | "
                         f"{row['trl_s']:.2f} | {d['budget']['vs_padded']:.2f}x | {d['packed']['vs_padded']:.2f}x | "
                         f"{d['trl']['vs_padded']:.2f}x | {row['padded_peak_rss_gb']:.2f} | "
                         f"{row['packed_peak_rss_gb']:.2f} | {d['budget']['peak_rss_gb']:.2f} | "
                         f"{d['trl']['peak_rss_gb']:.2f} |")
    lines += ["", "Workloads (response tokens):", ""]
    for name, kinds in res["details"].items():
        for kind, d in kinds.items():
            w = d["workload"]
            lines.append(f"- {name} {kind}: {w['samples']} samples, mean {w['response_mean']:.0f}, max "
                         f"{w['response_max']}, padded length {w['padded_len']}, {w['tokens']} tokens; shapes "
                         f"of the update's micro-batches (rows, length, samples): budget {len(d['budget']['shapes'])}, packed "
                         f"{len(d['packed']['shapes'])}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["tiny-qwen-vocab", "tiny-small-vocab"], choices=list(ALL_CONFIGS))
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--max_len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="PyTorch's threads (TRL's side)")
    ap.add_argument("--output", default=os.path.join(RESULTS, "update.json"))
    ap.add_argument("--keep", help="an earlier results file whose workloads (config, kind) this run does not "
                    "measure stay in --output")
    args = ap.parse_args(argv)
    if args.samples % MICRO:
        ap.error(f"--samples must be a multiple of {MICRO} (the micro-batch), got {args.samples}")
    stamp = dict(run_stamp("benchmarks.packing", argv), repeats=args.repeats, code=code_version())
    res = {"stamp": stamp, "configs": {}, "details": {}, "stamps": {}}
    if args.keep:
        res = kept(args.keep, res, args.configs, args.kinds)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.configs:
            for kind in args.kinds:
                d = measure(name, kind, args.samples, args.max_len, args.repeats, folder, args.threads)
                res["stamps"].setdefault(name, {})[kind] = stamp
                res["details"].setdefault(name, {})[kind] = d
                res["configs"].setdefault(name, {})[kind] = summary(d)
                print(name, kind, res["configs"][name][kind], flush=True)
                write_results(args.output, res, markdown(res))  # after each workload: a long run keeps its part
    return res


def kept(path: str, res: dict, configs: List[str], kinds: List[str]) -> dict:
    """res with the workloads of the results file `path` that this run does not measure (a config of
    `configs` with a kind of `kinds`), each with its run stamp. Older layouts: one stamp per config
    ("stamps": {NAME: stamp}), or one for the file ("stamp" and "repeats")."""
    try:
        with open(path) as f:
            old = json.load(f)
        for name, by_kind in old["configs"].items():
            stamps = old["stamps"][name] if "stamps" in old else dict(old["stamp"], repeats=old["repeats"])
            for kind in by_kind:
                if name in configs and kind in kinds:
                    continue
                stamp = stamps if "command" in stamps else stamps[kind]
                res["configs"].setdefault(name, {})[kind] = by_kind[kind]
                res["details"].setdefault(name, {})[kind] = old["details"][name][kind]
                res["stamps"].setdefault(name, {})[kind] = stamp
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--keep {path}: not a benchmarks.packing results file ({type(e).__name__}: {e})")
    return res

if __name__ == "__main__":
    main()
