"""The issue-20 GRPO step at the Qwen2.5-0.5B shape through the project's own trainer, alone in its process:
resident memory and seconds per phase, with the memory switches on or off.

    python -m benchmarks.step_memory [--layers 24] [--steps 2] [--switches on|layers|off|auto] [--sides ours trl]
        [--output PATH] [--set KEY=VALUE ...] [--malloc_trim] [--pool INIT INCREASE]

The model: the qwen2_5_0_5b preset (hidden 896, intermediate 4864, 14 / 2 heads, tied, vocabulary 151,936;
random weights) with --layers decoder layers. The work: the first 4 GSM8K test questions under the qwen_r1
template, Qwen2.5's tokenizer (`../shared`), G = 4 samples of 128 forced new tokens each (temperature 1, no
stop), micro-batches of 4 rows, beta 0.04 (k3), one update per step, a cheap in-process reward (the share of
ASCII letters: `grpo_step.workload.letter_share`, TRL's too).
One device: the engine generates with the policy itself (generate_config.inference_weights: auto).
`--switches on` sets rl_config.release_graphs, actor_config.layerwise_update, generate_config.layerwise and
ref_config.layerwise; `layers` the three layerwise ones, release_graphs off; `off` clears them; `auto` sets none
(rl_config.memory auto chooses them for this machine's available memory: its start-up block says which).

For experiments on our side: `--set` adds config overrides (e.g. actor_config.logprob_chunk_size=256),
`--malloc_trim` calls glibc's malloc_trim(0) after every phase, `--pool` sets MindSpore's memory pool
(`ms.runtime.set_memory(init_size, increase_size)`); glibc's own settings go in the environment
(MALLOC_MMAP_THRESHOLD_=..., inherited by the side's process). The JSON holds, per phase, glibc's heap, its free part
and its mmapped blocks after it (mallinfo2, GB) beside the resident memory.

The trainer is built by `grpo.builder.build` and stepped by `train_step`, as `scripts/grpo_one_stage.py`
does. Per step and phase (the trainer's own: rollout, reward, ref, update, sync): seconds, resident
memory after it and its peak while it ran (VmHWM, reset when the phase starts), in GB = 10^9 bytes; the
process peak. The first step compiles its graphs (and, with release_graphs, every step does). After the steps,
the fp32 matmul rates in our process (MindSpore's MatMul and our CPU kernel's) and, after each of TRL's steps,
PyTorch's in its process: a ratio of step times measures these kernels too.

`--sides ours trl`: then TRL's GRPOTrainer (`benchmarks.grpo_step.trl_side.run_trl`, its default gradient
checkpointing, fp32, every core's thread) on the same work in a process of its own, started after ours has
ended (both at once do not fit at 24 layers): random HF weights of the same shape (transformers' init, seed
0), the same prompt texts and reward, `min_new_tokens` forcing the same 128 tokens. Per step: its phases'
seconds (generation, reference, update = the step less its input preparation) and its peak resident memory
(the first step's includes TRL's set-up and the model's load, not the writing of the random weights before);
the ratio of TRL's seconds per step to ours, on the last step of each side (the first compiles / warms up).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from typing import Dict, Optional, Tuple

from benchmarks.harness import (RESULTS, SHARED, code_version, peak_since_reset_gb, reset_peak_rss, rss_gb, run_stamp,
                                stamp_lines, write_results)
from benchmarks.workers import Workers

PROMPTS, G, RESPONSE, MICRO_BATCH, BETA = 4, 4, 128, 4, 0.04
SWITCHES = ("rl_config.release_graphs", "actor_config.layerwise_update", "generate_config.layerwise",
            "ref_config.layerwise")
# --switches -> (`side`'s switches: all on, all off or none set; overrides after them). on: rl_config.memory low, so
# that every layer of the layerwise update runs its forward again (actor_config.recompute_num_layers as low sets it:
# the least memory, as the switches' figures were measured); layers: the layerwise update's recomputed layers as
# auto chooses them for this machine unless --set names them
SETTINGS: Dict[str, Tuple[Optional[bool], tuple]] = {
    "on": (True, ("rl_config.memory=low",)), "layers": (True, ("rl_config.release_graphs=false",)),
    "off": (False, ()), "auto": (None, ())}


def _questions(n: int):
    with open(os.path.join(SHARED, "data", "gsm8k", "test.jsonl"), encoding="utf-8") as f:
        return [json.loads(line)["question"] for _, line in zip(range(n), f)]


def _model_file(folder: str, layers: int) -> str:
    """The qwen2_5_0_5b preset with `layers` decoder layers, as a model config file."""
    from mindgrpo.models.presets import resolve_model_config

    with open(resolve_model_config("qwen2_5_0_5b"), encoding="utf-8") as f:
        text = f.read().replace("num_hidden_layers: 24", f"num_hidden_layers: {layers}")
    path = os.path.join(folder, f"qwen2_5_0_5b_{layers}_layers.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _dataset(folder: str, tokenizer_dir: str):
    """The prompts' MindRecord (the qwen_r1 template rendered here, written raw) and their lengths in tokens."""
    from mindgrpo.data.mindrecord import PromptRow, write_prompt_dataset
    from mindgrpo.data.templates import render_prompt
    from mindgrpo.data.tokenizer import QwenTokenizer

    texts = [render_prompt("qwen_r1", q) for q in _questions(PROMPTS)]
    tok = QwenTokenizer.from_dir(tokenizer_dir)
    lengths = [len(ids) for ids in tok.encode_batch(texts)]
    path = os.path.join(folder, "prompts.mindrecord")
    write_prompt_dataset(path, [PromptRow(question=t, answer="", solution="0") for t in texts], tok, template="raw",
                         max_prompt_length=max(lengths), overwrite=True)
    return path, lengths


class _PhaseMemory:
    """Wraps a Progress's `phase`: the resident memory after each phase and its peak (VmHWM reset at the
    phase's start; a phase inside another folds its peak into the outer one's)."""

    def __init__(self, progress, trim=None):
        from mindgrpo.utils import compiles

        self.records, self._stack, self.max_peak = [], [], 0.0
        inner = progress.phase

        @contextlib.contextmanager
        def phase(name):
            if self._stack:
                self._stack[-1] = max(self._stack[-1], peak_since_reset_gb())
            reset_peak_rss()
            self._stack.append(0.0)
            t0, c0 = time.perf_counter(), compiles.totals()
            try:
                with inner(name):
                    yield
            finally:
                if trim is not None:
                    trim()
                peak = max(self._stack.pop(), peak_since_reset_gb())
                spent = compiles.totals() - c0  # what the phase compiled (release_graphs: every step again)
                self.records.append({"phase": name, "seconds": time.perf_counter() - t0, "after_gb": rss_gb(),
                                     "peak_gb": peak, "compile_s": spent.seconds, "graphs": spent.graphs,
                                     **_mallinfo()})
                if self._stack:
                    self._stack[-1] = max(self._stack[-1], peak)
                self.max_peak = max(self.max_peak, peak)
                reset_peak_rss()

        progress.phase = phase


def setup(folder: str, layers: int, switches: Optional[bool], extra: tuple = ()):
    """The workload's config, paths, overrides and prompt lengths (the reward registered, the files written);
    switches None: none set, rl_config.memory (auto) chooses them."""
    from mindgrpo.config import GRPOConfig, load_config
    from mindgrpo.grpo import builder
    from mindgrpo.rewards import register_reward

    from benchmarks.grpo_step.workload import REWARD, letter_share

    register_reward(REWARD, overwrite=True)(letter_share)
    tokenizer_dir = os.path.join(SHARED, "tokenizers", "qwen2_5")
    dataset, lengths = _dataset(folder, tokenizer_dir)
    overrides = [f"actor_config.model={_model_file(folder, layers)}", "rl_config.seed=0", "rl_config.max_steps=1000",
                 f"rl_config.batch_size={PROMPTS}", f"rl_config.num_generations={G}", f"rl_config.beta={BETA}",
                 "rl_config.kl_kind=k3", "rl_config.completions_interval=0", f"rl_config.output_dir={folder}",
                 f"actor_config.micro_batch_size={MICRO_BATCH}", "actor_config.lr=1e-6", "actor_config.grad_clip=1.0",
                 f"generate_config.max_prompt_length={max(lengths)}", f"generate_config.max_tokens={RESPONSE}",
                 "generate_config.temperature=1.0", f"generate_config.max_num_seqs={PROMPTS * G}",
                 f"reward_config.verifier_function=[{REWARD}]", "reward_config.verifier_weight=[1.0]",
                 "reward_config.num_workers=0"] \
        + ([] if switches is None else [f"{k}={'true' if switches else 'false'}" for k in SWITCHES]) \
        + list(extra)
    cfg = load_config(GRPOConfig, overrides=overrides)
    paths = builder.Paths(output_dir=folder, vocab_path=os.path.join(tokenizer_dir, "vocab.json"),
                          merges_file_path=os.path.join(tokenizer_dir, "merges.txt"),
                          tokenizer_config=os.path.join(tokenizer_dir, "tokenizer_config.json"), dataset=dataset)
    return cfg, paths, overrides, lengths


def _mallinfo() -> dict:
    """glibc's mallinfo2 over every arena, in GB: heap = obtained by brk/sbrk or arena mmaps, free = of it
    free but kept by the allocator, mmapped = in blocks mmapped one by one (returned to the system when freed)."""
    import ctypes

    class _Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Info
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return {"heap_gb": float("nan"), "heap_free_gb": float("nan"), "mmapped_gb": float("nan")}
    m = libc.mallinfo2()
    return {"heap_gb": m.arena / 1e9, "heap_free_gb": m.fordblks / 1e9, "mmapped_gb": m.hblkhd / 1e9}


def _malloc_trim():
    """glibc's malloc_trim(0): hands the heaps' free pages back to the system."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def build_trainer(cfg, paths, folder: str):
    """The workload's parts and trainer (`setup`'s config and paths), metrics to `folder` only, no early stop."""
    from mindgrpo.grpo import builder
    from mindgrpo.utils.metrics_log import MetricsLogger
    from mindgrpo.utils.progress import Progress

    parts = builder.build(cfg, paths)
    trainer = builder.make_trainer(cfg, parts, MetricsLogger(folder, tensorboard=False, console=False),
                                   Progress(cfg.rl_config.max_steps), folder)
    trainer.stop_ids = ()  # no early stop: every completion has exactly RESPONSE tokens
    return parts, trainer


def side(conn, layers: int, switches: Optional[bool], folder: str, trim: bool = False, extra: tuple = (),
         pool: tuple = ()) -> None:
    """A `benchmarks.workers` side: builds the trainer, then one step per "step" message."""
    import mindspore as ms

    from mindgrpo.utils import compiles

    ms.set_context(mode=ms.GRAPH_MODE)
    compiles.install()  # each phase's compile seconds and graphs (_PhaseMemory)
    if pool:
        ms.runtime.set_memory(*pool)  # the runtime's memory pool: its first block, then each block it adds
    cfg, paths, overrides, lengths = setup(folder, layers, switches, extra)
    t0 = time.perf_counter()
    reset_peak_rss()
    parts, trainer = build_trainer(cfg, paths, folder)
    memory = _PhaseMemory(trainer.progress, _malloc_trim if trim else None)
    build_peak = peak_since_reset_gb()
    memory.max_peak = build_peak
    conn.send({"build_s": time.perf_counter() - t0, "built_gb": rss_gb(), "build_peak_gb": build_peak,
               "prompt_tokens": lengths, "overrides": overrides, "shared": parts.inference is parts.policy,
               "memory_policy": parts.memory_policy.summary() if parts.memory_policy else ""})
    while True:
        message = conn.recv()
        if message == "sync":  # after the steps (their peaks are sent): the syncs and the matmul rate
            conn.send(sync_seconds(parts.policy))
            continue
        if message == "matmul":  # after the steps: this process's fp32 matmul rates, MindSpore's and our kernel's
            from benchmarks.matmul_peak import square_rates

            conn.send(square_rates())
            continue
        if message != "step":
            break
        memory.records.clear()
        reset_peak_rss()
        t0 = time.perf_counter()
        metrics = trainer.train_step()
        wall = time.perf_counter() - t0
        trainer.step += 1
        trainer.progress.step_done(trainer.step)
        tokens = trainer.engine.last_stats["new_tokens"]
        step_peak = max([r["peak_gb"] for r in memory.records] + [peak_since_reset_gb()])
        memory.max_peak = max(memory.max_peak, step_peak)
        conn.send({"step_s": wall, "phases": list(memory.records), "new_tokens": tokens,
                   "loss": float(metrics.get("loss", float("nan"))),
                   "grad_norm": float(metrics.get("grad_norm", float("nan"))), "step_peak_gb": step_peak,
                   "process_peak_gb": memory.max_peak})


def sync_seconds(policy, repeats: int = 3) -> dict:
    """Seconds of a same-layout weight sync (`parallel/weight_sync.WeightSync`, as with
    generate_config.inference_weights: copy) from the policy into a fresh copy of its model, in the buckets of a run's
    default rl_config.weight_sync_bucket_mb: of every base weight (full fine-tuning's sync) and, with adapters, of
    the adapters alone (LoRA's); each the median of `repeats` calls after a first that compiles. And MindSpore's
    fp32 matmul GFLOP/s in this process."""
    from benchmarks.matmul_peak import SQUARES, matmul_gflops
    from mindgrpo.config import GRPOConfig
    from mindgrpo.models.lora import add_adapters, adapter_names, lora_spec
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM
    from mindgrpo.parallel.weight_sync import WeightSync

    copy = Qwen2ForCausalLM(policy.config, seed=1)
    spec = lora_spec(policy)
    if spec is not None:
        add_adapters(copy, spec, seed=1)
    moved = {"full": [n for n, _ in policy.parameters_and_names() if ".lora_" not in n]}
    if spec is not None:
        moved["adapters"] = adapter_names(policy)
    out = {}
    for kind, names in moved.items():
        sync = WeightSync(policy, copy, bucket_bytes=GRPOConfig().rl_config.weight_sync_bucket_bytes, names=names)
        first = sync()
        times = sorted(sync()["sync/seconds"] for _ in range(repeats))
        out[kind] = {"seconds": times[len(times) // 2], "first_s": first["sync/seconds"], "bytes": first["sync/bytes"]}
        del sync
    out["matmul_gflops"] = matmul_gflops("mindspore", SQUARES)
    return out


def trl_side(conn, layers: int, folder: str, steps: int, threads: int, lora_rank: int = 0) -> None:
    """A `benchmarks.workers` side: TRL's GRPOTrainer on the workload for `steps` steps; sends each step's
    phases, peak resident memory (VmHWM since the previous step ended) and PyTorch's fp32 matmul GFLOP/s after
    it. lora_rank > 0: with PEFT's LoraConfig of that rank (alpha 2 r) on the seven projections."""
    import torch

    from benchmarks.matmul_peak import SQUARES, matmul_gflops

    from benchmarks.grpo_step.trl_side import run_trl
    from benchmarks.grpo_step.workload import Workload
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.presets import resolve_model_config

    class _HFOnly(Workload):
        """The HF weights and prompt ids only: TRL's process imports no MindSpore (its memory would count)."""

        def _weights(self, seed: int) -> None:
            from benchmarks.tiny_models import hf_model

            hf_model(self.name, seed=seed, overrides=self.model).save_pretrained(self.hf_dir)

        def _dataset(self):
            from transformers import AutoTokenizer

            return None, AutoTokenizer.from_pretrained(self.tokenizer_dir)(text=self.texts)["input_ids"]

    torch.set_num_threads(threads)  # a MindSpore parent passes OMP_NUM_THREADS=1 on (trl_side.trl_worker)
    reset_peak_rss()
    c = Qwen2Config.load(resolve_model_config("qwen2_5_0_5b"))
    model = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                 num_hidden_layers=layers, num_attention_heads=c.num_attention_heads,
                 num_key_value_heads=c.num_key_value_heads, tie_word_embeddings=c.tie_word_embeddings)
    t0 = time.perf_counter()
    work = _HFOnly("qwen2.5-0.5b-shape", model, os.path.join(folder, "work"), PROMPTS)
    gc.collect()
    conn.send({"weights_s": time.perf_counter() - t0, "prompt_tokens": [len(p) for p in work.prompt_ids],
               "rss_gb": rss_gb(), "writing_peak_gb": peak_since_reset_gb(), "torch_threads": torch.get_num_threads(),
               "torch": torch.__version__})
    reset_peak_rss()  # TRL's own from here: the model written above is not its

    def after_step(phases: dict) -> None:
        peak, after = peak_since_reset_gb(), rss_gb()
        conn.send({"phases": phases, "step_peak_gb": peak, "after_gb": after,
                   "matmul_gflops": matmul_gflops("torch", SQUARES)})
        reset_peak_rss()

    peft_config = None
    if lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, task_type="CAUSAL_LM",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"])
    run_trl(work, os.path.join(folder, "trl"), G, RESPONSE, MICRO_BATCH, steps, after_step, peft_config=peft_config)


def _trl_markdown(res: dict) -> list:
    trl = res["trl"]
    lines = ["", f"## TRL's GRPOTrainer on the same work, alone in its process after ours ({trl['versions']})", "",
             f"Random HF weights written in {trl['setup']['weights_s']:.1f} s (resident {trl['setup']['rss_gb']:.2f} "
             f"GB); prompts {trl['setup']['prompt_tokens']} tokens; gradient checkpointing on, fp32, "
             f"{trl['setup']['torch_threads']} torch threads.", "",
             "| step | generation s | reference s | update s | other s | step s | step peak GB | torch matmul "
             "GFLOP/s after it |", "|---|---|---|---|---|---|---|---|"]
    for i, s in enumerate(trl["steps"], 1):
        p = s["phases"]
        rate = f"{s['matmul_gflops']['peak']:.0f}" if "matmul_gflops" in s else ""
        lines.append(f"| {i} | {p['generation']:.1f} | {p['reference']:.1f} | {p['update']:.1f} | {p['other']:.1f} | "
                     f"**{p['step']:.1f}** | {s['step_peak_gb']:.2f} | {rate} |")
    lines += ["", f"TRL's process peak: {trl['process_peak_gb']:.2f} GB."]
    if res.get("steps") and trl["steps"]:
        ours, theirs = res["steps"][-1]["step_s"], trl["steps"][-1]["phases"]["step"]
        peaks = res["process_peak_gb"], trl["process_peak_gb"]
        lines += ["", f"**Last step: TRL {theirs:.1f} s against ours {ours:.1f} s: ours {theirs / ours:.2f}x faster "
                  f"(TRL s/step / ours); peak {peaks[0]:.2f} GB ours against {peaks[1]:.2f} GB TRL's "
                  f"({peaks[0] / peaks[1]:.2f}x).**"]
    return lines


def markdown(res: dict) -> str:
    lines = [f"# The issue-20 GRPO step at the Qwen2.5-0.5B shape, {res['layers']} layers, through the trainer", "",
             *stamp_lines(res),
             f"Workload: the qwen2_5_0_5b preset with {res['layers']} decoder layers (random weights), 4 GSM8K test "
             f"prompts (qwen_r1 template) x G = {G}, {RESPONSE} forced new tokens, micro-batches of {MICRO_BATCH} "
             f"rows, beta {BETA} (k3), one update per step. Resident memory in GB (10^9 bytes): after = when the "
             "phase ended; peak = while it ran (VmHWM)."]
    if "built" in res:
        lines += ["", f"## Ours: switches ({', '.join(SWITCHES)}): {res['switches']}; one copy of the weights (the "
                  f"engine generates with the policy); prompts {res['built']['prompt_tokens']} tokens", "",
                  f"Built in {res['built']['build_s']:.1f} s: resident {res['built']['built_gb']:.2f} GB, peak "
                  f"{res['built']['build_peak_gb']:.2f} GB.", "",
                  "| step | phase | s | of it compiling, s | after | peak |", "|---|---|---|---|---|---|"]
        for i, step in enumerate(res["steps"], 1):
            for r in step["phases"]:
                lines.append(f"| {i} | {r['phase']} | {r['seconds']:.1f} | {r.get('compile_s', float('nan')):.1f} | "
                             f"{r['after_gb']:.2f} | {r['peak_gb']:.2f} |")
            lines.append(f"| {i} | **step** | **{step['step_s']:.1f}** | "
                         f"{sum(r.get('compile_s', float('nan')) for r in step['phases']):.1f} | | "
                         f"**{step['step_peak_gb']:.2f}** |")
        if "process_peak_gb" in res:
            lines += ["", f"Process peak: {res['process_peak_gb']:.2f} GB. Tokens generated per step: "
                      f"{[s['new_tokens'] for s in res['steps']]}; losses {[s['loss'] for s in res['steps']]}."]
        if "matmul_gflops" in res:
            lines += ["", "fp32 matmul GFLOP/s in this process after the steps (squares of 1024 and 2048, the better): "
                      + ", ".join(f"{side} {rates['peak']:.0f}" for side, rates in res["matmul_gflops"].items())
                      + " (MindSpore's MatMul, and our CPU kernel's)."]
    if "trl" in res:
        lines += _trl_markdown(res)
    return "\n".join(lines) + "\n"


def _ours(res: dict, args, output: str) -> None:
    with tempfile.TemporaryDirectory() as folder, Workers() as workers:
        switches, extra = SETTINGS[args.switches]
        worker = workers.start(side, args.layers, switches, folder, args.malloc_trim, (*extra, *args.set),
                               tuple(args.pool))
        res["built"] = worker.recv()
        print(f"built: {res['built']['build_s']:.1f} s, {res['built']['built_gb']:.2f} GB\n"
              f"{res['built']['memory_policy']}", flush=True)
        for _ in range(args.steps):
            step = worker.ask("step")
            res["steps"].append(step)
            print(f"step: {step['step_s']:.1f} s, peak {step['step_peak_gb']:.2f} GB; "
                  + ", ".join(f"{r['phase']} {r['seconds']:.1f} s (compiling {r['compile_s']:.1f}) {r['peak_gb']:.2f} GB "
                            f"(after {r['after_gb']:.2f}: heap {r['heap_gb']:.2f}, free {r['heap_free_gb']:.2f}, "
                            f"mmapped {r['mmapped_gb']:.2f})"
                            for r in step["phases"]),
                  flush=True)
            res["process_peak_gb"] = max([res["built"]["build_peak_gb"]] + [s["step_peak_gb"] for s in res["steps"]])
            res["load_average_end"] = os.getloadavg()[0]
            write_results(output, res, markdown(res))  # each step as it comes: a run stopped later keeps it
        if args.steps:
            res["matmul_gflops"] = worker.ask("matmul")
            write_results(output, res, markdown(res))
        worker.ask("stop")


def _trl(res: dict, args, output: str) -> None:
    import transformers
    import trl

    with tempfile.TemporaryDirectory() as folder, Workers() as workers:
        worker = workers.start(trl_side, args.layers, folder, args.steps, args.torch_threads)
        setup_ = worker.recv()
        res["trl"] = {"setup": setup_, "steps": [], "process_peak_gb": setup_["rss_gb"],
                      "versions": f"trl {trl.__version__}, transformers {transformers.__version__}, "
                                  f"torch {setup_['torch']}"}
        print(f"trl: weights in {setup_['weights_s']:.1f} s", flush=True)
        for _ in range(args.steps):  # run_trl's callback sends each step unasked
            step = worker.recv()
            res["trl"]["steps"].append(step)
            res["trl"]["process_peak_gb"] = max(res["trl"]["process_peak_gb"], step["step_peak_gb"])
            res["load_average_end"] = os.getloadavg()[0]
            print(f"trl step: {step['phases']['step']:.1f} s, peak {step['step_peak_gb']:.2f} GB; "
                  + ", ".join(f"{k} {v:.1f}" for k, v in step["phases"].items()), flush=True)
            write_results(output, res, markdown(res))
        # a side's last message: its process peak (VmHWM, reset after each step: the last step's at least)
        res["trl"]["process_peak_gb"] = max(res["trl"]["process_peak_gb"], worker.recv())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--switches", choices=tuple(SETTINGS), default="on",
                    help="layers: the three layerwise ones without release_graphs; auto: none set, rl_config.memory "
                         "auto chooses them for this machine")
    ap.add_argument("--sides", nargs="+", choices=("ours", "trl"), default=["ours"])
    ap.add_argument("--torch_threads", type=int, default=os.cpu_count(), help="PyTorch threads on TRL's side")
    ap.add_argument("--malloc_trim", action="store_true", help="glibc's malloc_trim(0) after every phase")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides for our side")
    ap.add_argument("--pool", nargs=2, default=[], metavar=("INIT", "INCREASE"),
                    help="ms.runtime.set_memory(init_size, increase_size) in our side, e.g. 0.01GB 0.01GB")
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)
    output = args.output or os.path.join(RESULTS, f"step_memory_{args.layers}_layers.json")
    res = dict(run_stamp("benchmarks.step_memory", argv), code=code_version(), layers=args.layers,
               switches=args.switches, steps=[], load_average_end=os.getloadavg()[0])
    if "ours" in args.sides:  # first, then TRL alone: both at once do not fit at 24 layers
        _ours(res, args, output)
    if "trl" in args.sides:
        _trl(res, args, output)
    res["load_average_end"] = os.getloadavg()[0]
    write_results(output, res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
