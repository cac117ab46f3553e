"""One GRPO step: mindgrpo against TRL's GRPOTrainer (PyTorch, CPU) on identical work, in one run.

    .venv/bin/python benchmarks/grpo_step.py                      # both configs, TRL side by side
    .venv/bin/python benchmarks/grpo_step.py --mode all           # ... and mindgrpo's scaling sweep
    .venv/bin/python benchmarks/grpo_step.py --mode scaling       # only the sweep
        [--configs tiny-qwen-vocab tiny-small-vocab] [--steps 3] [--output benchmarks/results/grpo_step.json]

One mode alone keeps the other's last results in the JSON (each part records its date and command).

Identical work on both sides: the same random HF Qwen2 weights (saved by transformers, converted for
us by scripts/convert_weight.py), the same 4 prompts (GSM8K test questions in the R1 template when
../shared holds them, else synthetic text; Qwen2.5's tokenizer for the Qwen vocabulary when ../shared
holds it, else our tiny tokenizer, which the 4096-vocabulary config always uses; both sides must
produce the same prompt ids), G = 4, exactly --new_tokens tokens per completion (no stop ids on our
side, min_new_tokens on TRL's), temperature 1, top-k off, top-p 1, fp32, beta > 0 (both score a
reference model), k3 KL, token-mean loss, one optimizer step per rollout batch, micro-batches of
--micro_batch rows (our trainer's default, 4; TRL: per_device_train_batch_size with gradient
accumulation), grad clip 1, the same cheap reward (share of digits; not constant, so the gradients
are not all zero). TRL runs with its own defaults otherwise (gradient checkpointing on).

Our step is the project's trainer (`mindgrpo.grpo.builder.build`, `GRPOTrainer.train_step`) with the
phases its Progress times. TRL's phases come from wrapping its methods (`_generate_single_turn`,
`_get_per_token_logps_and_entropies`, `_prepare_inputs`) and trainer callbacks; its update is the step
less the time in `_prepare_inputs` (losses, backwards, clip, AdamW). TRL generates with the model
it trains, so it has no weight sync. Each side runs in its own process (no shared thread pools or
allocators) and the parent alternates them step by step (TRL step i, then ours), so changes in the
shared machine's load hit both; each side's first step (compilation, lazy set-up) is a warm-up;
numbers are medians over --steps. Update GFLOP/s count the useful model FLOPs (3x a forward over the
real tokens; the vocabulary projection on response positions; attention over the full S x S square),
the same number for both sides. Each side measures its framework's fp32 matmul GFLOP/s right after
each of its steps (square shapes and the update's own largest shapes; the best is the peak), and each
step's update is set against the peak measured after it, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import CONFIGS, hf_model, run_stamp  # noqa: E402
from grpo_step_report import PHASES, plot_compare, plot_scaling, scaling_sentence, write_markdown  # noqa: E402

SHARED = os.path.join(os.path.dirname(REPO), "shared")  # GSM8K and the Qwen2.5 tokenizer, when present
REWARD = "benchmark_digit_share"
TEMPLATE = "qwen_r1"
BETA, LR = 0.04, 1e-6
# tests only: a micro model that runs a step in seconds
EXTRA_CONFIGS = {"micro": dict(CONFIGS["tiny-small-vocab"], vocab_size=512, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2)}
ALL_CONFIGS = {**CONFIGS, **EXTRA_CONFIGS}
# the sweep's model sizes: (hidden, layers, heads, kv heads, intermediate), Qwen2 proportions
MODEL_SIZES = ((256, 4, 4, 2, 1024), (384, 6, 6, 2, 1536), (512, 8, 8, 2, 2048))
RESPONSE_LENGTHS, GROUP_SIZES = (64, 128, 256), (4, 8, 16)


def digit_share(completions, **_):
    """A cheap reward with TRL's and our signature: the share of digits in the completion."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


# ----------------------------------------------------------------------------------- the workload
class Workload:
    """Weights (HF dir and our .ckpt), tokenizer files and the prompt MindRecord of one model config."""

    def __init__(self, name: str, model: dict, folder: str, num_prompts: int, shared: str = SHARED, seed: int = 0):
        self.name, self.model, self.folder = name, model, folder
        self.gsm8k = os.path.join(shared, "data", "gsm8k", "test.jsonl")
        self.qwen_tokenizer = os.path.join(shared, "tokenizers", "qwen2_5")
        os.makedirs(folder, exist_ok=True)
        self.hf_dir, self.ckpt = os.path.join(folder, "hf"), os.path.join(folder, "ms", "model.ckpt")
        self.tokenizer_dir = self._tokenizer()
        self.texts = self._prompts(num_prompts)
        self._weights(seed)
        self.dataset, self.prompt_ids = self._dataset()
        self.params = _num_params(model)

    def _tokenizer(self) -> str:
        """Qwen2.5's when present and the model's vocabulary holds its ids, else our tiny one."""
        from mindgrpo.data.synthetic import ensure_tiny_tokenizer
        from mindgrpo.data.tokenizer import QwenTokenizer

        if os.path.isfile(os.path.join(self.qwen_tokenizer, "vocab.json")):
            if QwenTokenizer.from_dir(self.qwen_tokenizer).vocab_size <= self.model["vocab_size"]:
                return self.qwen_tokenizer

        path = os.path.join(self.folder, "tiny_tokenizer")
        ensure_tiny_tokenizer(path)
        return path

    def _prompts(self, n: int) -> List[str]:
        from mindgrpo.data.templates import render_prompt

        self.data = "GSM8K test" if os.path.isfile(self.gsm8k) else "synthetic"
        if os.path.isfile(self.gsm8k):
            with open(self.gsm8k, encoding="utf-8") as f:
                questions = [json.loads(line)["question"] for _, line in zip(range(n), f)]
        else:
            questions = [f"Question {i}: a farmer has {3 + i} fields of {12 * (i + 1)} rows with {7 + 2 * i} plants "
                         f"each and sells a third of the plants. How many plants are left?" for i in range(n)]
        return [render_prompt(TEMPLATE, q) for q in questions]

    def _weights(self, seed: int) -> None:
        sys.path.insert(0, os.path.join(REPO, "scripts"))
        from convert_weight import hf_to_ms  # the project's converter (scripts/convert_weight.py)

        hf_model(self.name, seed=seed, overrides=self.model).save_pretrained(self.hf_dir)
        os.makedirs(os.path.dirname(self.ckpt), exist_ok=True)
        hf_to_ms(self.hf_dir, self.ckpt, None)

    def _dataset(self):
        from mindgrpo.data.mindrecord import PromptRow, write_prompt_dataset
        from mindgrpo.data.tokenizer import QwenTokenizer
        from transformers import AutoTokenizer

        ours = QwenTokenizer.from_dir(self.tokenizer_dir)
        ids = ours.encode_batch(self.texts)
        if AutoTokenizer.from_pretrained(self.tokenizer_dir)(text=self.texts)["input_ids"] != ids:
            raise RuntimeError(f"{self.tokenizer_dir}: transformers and mindgrpo tokenize the prompts differently")
        path = os.path.join(self.folder, "prompts.mindrecord")
        rows = [PromptRow(question=t, answer="", solution="0") for t in self.texts]
        write_prompt_dataset(path, rows, ours, template="raw", max_prompt_length=max(map(len, ids)), overwrite=True)
        return path, ids


def _num_params(model: dict) -> int:
    from mindgrpo.models.qwen2 import Qwen2Config

    return Qwen2Config(**model).num_params()


def update_flops(model: dict, prompt_lens: List[int], new_tokens: int) -> float:
    """Useful FLOPs of one forward + backward (3x the forward) over the real tokens."""
    h, i, v = model["hidden_size"], model["intermediate_size"], model["vocab_size"]
    n_layers = model["num_hidden_layers"]
    d = h // model["num_attention_heads"]
    q, kv = model["num_attention_heads"] * d, model["num_key_value_heads"] * d
    per_token = 2 * (h * q + 2 * h * kv + q * h + 3 * h * i)  # q, k, v, o, gate, up, down
    forward = 0.0
    for p in prompt_lens:
        s = p + new_tokens
        forward += n_layers * (s * per_token + 4 * s * s * q)  # + QK^T and AV, (S, S) per head
        forward += 2 * new_tokens * h * v  # the vocabulary projection of the scored positions
    return 3 * forward


# ----------------------------------------------------------------------------------- matmul peaks
def matmul_gflops(framework: str, shapes: Dict[str, tuple], repeats: int = 3) -> Dict[str, float]:
    """fp32 GFLOP/s of (m, k) @ (k, n) for each shape (median of `repeats` after one untimed call) in
    "mindspore" (graph mode) or "torch"; "peak" is the best of the shapes."""
    if framework == "mindspore":
        import mindspore as ms
        from mindspore import nn, ops

        class MatMul(nn.Cell):
            def construct(self, a, b):
                return ops.matmul(a, b)

        net = MatMul()
        make = lambda a, b: lambda x=ms.Tensor(a), y=ms.Tensor(b): net(x, y).asnumpy()  # noqa: E731
    else:
        import torch

        make = lambda a, b: lambda x=torch.from_numpy(a), y=torch.from_numpy(b): torch.matmul(x, y)  # noqa: E731
    rng = np.random.default_rng(0)
    out = {}
    for label, (m, k, n) in shapes.items():
        fn = make(rng.random((m, k), np.float32), rng.random((k, n), np.float32))
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[label] = 2 * m * k * n / float(np.median(times)) / 1e9
    out["peak"] = max(out.values())
    return out


def peak_shapes(m: dict, s: int, new_tokens: int, micro_batch: int) -> Dict[str, tuple]:
    """Square matmuls and the update's two largest matmuls of one micro-batch of model config m,
    sequences of s tokens (prompt + response)."""
    return {"square 1024": (1024, 1024, 1024), "square 2048": (2048, 2048, 2048),
            "MLP up (B*S, H) @ (H, I)": (micro_batch * s, m["hidden_size"], m["intermediate_size"]),
            "vocab head (B*R, H) @ (H, V)": (micro_batch * new_tokens, m["hidden_size"], m["vocab_size"])}


# ----------------------------------------------------------------------------------- our step
class OurSide:
    """The project's trainer built by its builder; `step()` runs `train_step` and returns phase seconds."""

    def __init__(self, work: Workload, folder: str, group: int, new_tokens: int, micro_batch: int,
                 logprob_chunk: int = 0):
        from mindgrpo.config.grpo import ActorConfig, GenerateConfig, GRPOConfig, RLConfig, RewardConfig
        from mindgrpo.grpo import builder
        from mindgrpo.rewards import register_reward
        from mindgrpo.utils.metrics_log import MetricsLogger
        from mindgrpo.utils.progress import Progress

        register_reward(REWARD, overwrite=True)(digit_share)
        rows = len(work.texts) * group
        cfg = GRPOConfig(
            rl_config=RLConfig(seed=0, max_steps=1000, batch_size=len(work.texts), num_generations=group, beta=BETA,
                               kl_kind="k3", loss_agg_mode="token-mean", completions_interval=0, output_dir=folder),
            actor_config=ActorConfig(lr=LR, micro_batch_size=micro_batch, grad_clip=1.0,
                                     logprob_chunk_size=logprob_chunk),
            generate_config=GenerateConfig(max_prompt_length=512, max_tokens=new_tokens, temperature=1.0, top_k=0,
                                           top_p=1.0),
            # scored in this process, as TRL does (the reward is registered here, not in a plugin file)
            reward_config=RewardConfig(verifier_function=(REWARD,), verifier_weight=(1.0,), num_workers=0))
        tok = work.tokenizer_dir
        paths = builder.Paths(output_dir=folder, sft_path_train=work.ckpt, dataset=work.dataset,
                              vocab_path=os.path.join(tok, "vocab.json"),
                              merges_file_path=os.path.join(tok, "merges.txt"),
                              tokenizer_config=os.path.join(tok, "tokenizer_config.json"))
        self.parts = builder.build(cfg, paths, os.path.join(folder, "cache"))
        self.trainer = builder.make_trainer(cfg, self.parts, MetricsLogger(folder, tensorboard=False, console=False),
                                            Progress(cfg.rl_config.max_steps), folder)
        self.trainer.stop_ids = ()  # no early stop: every completion has exactly new_tokens tokens
        self.expected_tokens = rows * new_tokens

    def step(self) -> Dict[str, float]:
        t = self.trainer
        t0 = time.perf_counter()
        t.train_step()
        wall = time.perf_counter() - t0
        t.step += 1
        m = t.progress.step_done(t.step)  # its time/step would include TRL's step: we use our own clock
        t.memory.step_metrics()
        if t.engine.last_stats["new_tokens"] != self.expected_tokens:
            raise RuntimeError(f"generated {t.engine.last_stats['new_tokens']} tokens, not {self.expected_tokens}")
        out = {"generation": m["time/rollout"], "reference": m.get("time/ref", 0.0),
               "old_logprobs": m.get("time/old", 0.0), "update": m["time/update"], "sync": m["time/sync"]}
        out["other"] = wall - sum(out.values())  # reward, advantages, packing, decoding
        out["step"] = wall
        return out


# ----------------------------------------------------------------------------------- TRL's step
def run_trl(work: Workload, folder: str, group: int, new_tokens: int, micro_batch: int, steps: int,
            after_step: Callable[[dict], None], gradient_checkpointing: bool = True) -> None:
    """TRL's GRPOTrainer for `steps` optimizer steps, each on one rollout batch in micro-batches of
    `micro_batch` rows (gradient accumulation); after_step(phase seconds) runs after each step, untimed."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = len(work.texts) * group
    args = GRPOConfig(
        output_dir=folder, per_device_train_batch_size=micro_batch, gradient_accumulation_steps=rows // micro_batch,
        num_generations=group,
        max_completion_length=new_tokens, generation_kwargs={"min_new_tokens": new_tokens}, num_iterations=1,
        beta=BETA, loss_type="dapo", scale_rewards="group", temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=LR, lr_scheduler_type="constant", max_grad_norm=1.0, max_steps=steps, bf16=False,
        use_cpu=True, gradient_checkpointing=gradient_checkpointing, model_init_kwargs={"dtype": "float32"},
        logging_steps=10 ** 6, save_strategy="no", report_to="none", disable_tqdm=True, log_completions=False,
        seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=work.hf_dir, reward_funcs=digit_share, args=args,
                          train_dataset=Dataset.from_dict({"prompt": work.texts}),
                          processing_class=AutoTokenizer.from_pretrained(work.tokenizer_dir))

    class Phases(TrainerCallback):
        def __init__(self):
            self.current = dict.fromkeys(PHASES, 0.0)
            self.t0 = 0.0

        def on_step_begin(self, *_, **__):
            self.t0, self.current = time.perf_counter(), dict.fromkeys(PHASES + ("prepare",), 0.0)

        def on_step_end(self, *_, **__):
            now = time.perf_counter()
            cur = self.current
            cur["step"] = now - self.t0
            prepare = cur.pop("prepare")  # generation, reward, reference, batching
            cur["update"] = cur["step"] - prepare  # losses, backwards, grad clip, AdamW, zero_grad
            cur["other"] = prepare - cur["generation"] - cur["reference"] - cur["old_logprobs"]
            logged = trainer._metrics["train"]
            if {logged["completions/min_length"][-1], logged["completions/max_length"][-1]} != {new_tokens}:
                raise RuntimeError("TRL's completions are not all exactly new_tokens long")
            after_step(cur)

    phases = Phases()

    def timed(name: str, phase_of: Callable):
        fn = getattr(trainer, name)

        def wrapper(*a, **k):
            phase = phase_of(*a, **k)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                if phase:
                    phases.current[phase] += time.perf_counter() - t0
        setattr(trainer, name, wrapper)

    def scoring(model, *_, **__):  # the policy under grad is the update's forward, counted there
        return "reference" if model is trainer.ref_model else None if torch.is_grad_enabled() else "old_logprobs"

    timed("_generate_single_turn", lambda *a, **k: "generation")
    timed("_get_per_token_logps_and_entropies", scoring)
    timed("_prepare_inputs", lambda *a, **k: "prepare")
    trainer.add_callback(phases)
    trainer.train()


# ----------------------------------------------------------------------------------- processes
class Worker:
    """A side in its own process (no thread pools, allocators or memory pools shared with the other),
    driven over a pipe; an exception in the child is raised here with its traceback."""

    def __init__(self, target, *args):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.target = target.__name__
        self.proc = ctx.Process(target=_serve, args=(child, target, *args))
        self.proc.start()

    def send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except BrokenPipeError:
            self.died()

    def recv(self):
        try:
            msg = self.conn.recv()
        except EOFError:
            self.died()
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            self.proc.join()
            raise RuntimeError(f"{self.proc.name} failed:\n{msg[1]}")
        return msg

    def ask(self, msg):
        self.send(msg)
        return self.recv()

    def join(self) -> None:
        self.proc.join()

    def died(self):
        """The child ended without a word: killed (the kernel's OOM killer sends SIGKILL) or crashed."""
        self.proc.join(timeout=10)
        code = self.proc.exitcode
        why = " (SIGKILL: out of memory? see dmesg)" if code == -9 else ""
        raise RuntimeError(f"{self.proc.name} ({self.target}) died with exit code {code}{why}")


def _serve(conn, target, *args) -> None:
    import traceback

    try:
        target(conn, *args)
        conn.send(peak_rss_gb())
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))


def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM; ru_maxrss would carry the parent's over exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 2 ** 20


def ours_worker(conn, work: Workload, folder: str, group: int, new_tokens: int, micro_batch: int,
                peaks: bool = False, logprob_chunk: int = 0) -> None:
    """Builds our side, says "ready", then runs a step per "step" until "stop"; with `peaks`, measures
    MindSpore's matmul GFLOP/s after each step."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ours = OurSide(work, folder, group, new_tokens, micro_batch, logprob_chunk)
    conn.send("ready")
    while conn.recv() == "step":
        phases = ours.step()
        if peaks:  # right after the step, under the same machine load
            phases["matmul_gflops"] = matmul_gflops("mindspore", peak_shapes(work.model, max(map(len, work.prompt_ids)) + new_tokens, new_tokens, micro_batch))
        conn.send(phases)


def trl_worker(conn, work: Workload, folder: str, group: int, new_tokens: int, micro_batch: int, steps: int,
               gradient_checkpointing: bool, threads: int) -> None:
    """Runs TRL; after each step measures PyTorch's matmul GFLOP/s, sends them with the step's phases
    and waits for "go"."""
    import torch

    # explicitly: a process that has imported MindSpore passes OMP_NUM_THREADS=1 on to its children
    # (its runtime setenv()s it), and PyTorch would then run on one thread
    torch.set_num_threads(threads)

    def after_step(phases: dict) -> None:
        phases["torch_threads"] = float(torch.get_num_threads())
        phases["matmul_gflops"] = matmul_gflops("torch", peak_shapes(work.model, max(map(len, work.prompt_ids)) + new_tokens, new_tokens, micro_batch))
        conn.send(phases)
        conn.recv()

    run_trl(work, folder, group, new_tokens, micro_batch, steps, after_step, gradient_checkpointing)


# ----------------------------------------------------------------------------------- runs
def medians(steps: List[dict]) -> Dict[str, float]:
    return {k: float(np.median([s[k] for s in steps])) for k, v in steps[0].items() if isinstance(v, float)}


def compare(name: str, model: dict, folder: str, args) -> dict:
    """Both sides on one config, steps alternating; returns the config's JSON entry."""
    work = Workload(name, model, os.path.join(folder, name), args.prompts, args.shared)
    ours = Worker(ours_worker, work, os.path.join(folder, name, "ours"), args.group, args.new_tokens,
                  args.micro_batch, True)
    ours.recv()  # built before TRL starts, so neither side's set-up overlaps the other's steps
    trl = Worker(trl_worker, work, os.path.join(folder, name, "trl"), args.group, args.new_tokens, args.micro_batch,
                 1 + args.steps, not args.trl_no_gradient_checkpointing, args.torch_threads)
    our_steps, trl_steps = [], []
    for _ in range(1 + args.steps):  # TRL step i, then ours, then TRL step i + 1 ...
        trl_steps.append(trl.recv())
        our_steps.append(ours.ask("step"))
        trl.send("go")
    our_rss, trl_rss = ours.ask("stop"), trl.recv()
    ours.join(), trl.join()
    o, t = medians(our_steps[1:]), medians(trl_steps[1:])
    tokens = len(work.texts) * args.group * args.new_tokens
    flops = update_flops(model, [len(p) for p in work.prompt_ids for _ in range(args.group)], args.new_tokens)
    entry = {"params": work.params, "model": model, "prompts": work.data,
             "tokenizer": "Qwen2.5 (../shared/tokenizers/qwen2_5)" if work.tokenizer_dir == work.qwen_tokenizer
             else "mindgrpo tiny tokenizer (512 tokens)",
             "prompt_tokens": [len(p) for p in work.prompt_ids], "generated_tokens": tokens,
             "mindgrpo_step_s": o["step"], "trl_step_s": t["step"], "speedup": t["step"] / o["step"]}
    for phase in PHASES:
        entry[f"mindgrpo_{phase}_s"], entry[f"trl_{phase}_s"] = o[phase], t[phase]
    for side, m in (("mindgrpo", o), ("trl", t)):
        entry[f"{side}_tokens_per_s"] = tokens / m["step"]
        entry[f"{side}_generation_tokens_per_s"] = tokens / m["generation"]
    entry["update_gflop"] = flops / 1e9
    for side, steps, m, fw in (("mindgrpo", our_steps, o, "mindspore"), ("trl", trl_steps, t, "torch")):
        entry[f"{side}_update_gflops_per_s"] = flops / m["update"] / 1e9
        # each step against the peak measured right after it, then the median
        entry[f"{side}_update_pct_of_{fw}_peak"] = float(np.median(
            [100 * flops / s["update"] / 1e9 / s["matmul_gflops"]["peak"] for s in steps[1:]]))
        entry[f"{fw}_matmul_gflops"] = {k: float(np.median([s["matmul_gflops"][k] for s in steps[1:]]))
                                        for k in steps[0]["matmul_gflops"]}
    entry["mindgrpo_first_step_s"], entry["trl_first_step_s"] = our_steps[0]["step"], trl_steps[0]["step"]
    entry["mindgrpo_steps"], entry["trl_steps"] = our_steps, trl_steps
    entry["mindgrpo_peak_rss_gb"], entry["trl_peak_rss_gb"] = our_rss, trl_rss
    entry["trl_torch_threads"] = int(t["torch_threads"])
    print(f"{name}: mindgrpo {o['step']:.2f} s/step, TRL {t['step']:.2f} s/step, {entry['speedup']:.2f}x; "
          + ", ".join(f"{p} {o[p]:.2f}/{t[p]:.2f}" for p in PHASES), flush=True)
    return entry


def scaling(base: str, folder: str, args) -> dict:
    """Our step time against response length, group size and model size (mindgrpo only). The points
    are measured in --scaling_passes passes, every other one in reverse order, so a drift in the
    machine's load does not masquerade as a trend; medians over all passes' measured steps."""
    axes = [("response_length", r, args.group, MODEL_SIZES[0]) for r in RESPONSE_LENGTHS]
    axes += [("group_size", args.new_tokens, g, MODEL_SIZES[0]) for g in GROUP_SIZES]
    axes += [("model_size", args.new_tokens, args.group, size) for size in MODEL_SIZES]
    points = list(dict.fromkeys((r, g, size) for _, r, g, size in axes))  # the base point is on every axis
    works: Dict[tuple, Workload] = {}
    for size in MODEL_SIZES:
        h, layers, heads, kv, inter = size
        model = dict(ALL_CONFIGS[base], hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                     num_key_value_heads=kv, intermediate_size=inter)
        works[size] = Workload(base, model, os.path.join(folder, f"scaling_{h}x{layers}"), args.prompts, args.shared)
    runs: Dict[tuple, list] = {p: [] for p in points}
    for k in range(args.scaling_passes):
        for new_tokens, group, size in points if k % 2 == 0 else points[::-1]:
            micro = max(1, args.micro_batch * args.new_tokens // new_tokens)  # the same tokens per micro-batch
            ours = Worker(ours_worker, works[size], os.path.join(folder, f"scaling_{k}_{new_tokens}_{group}_{size[0]}"),
                          group, new_tokens, micro)  # a fresh process per point: MindSpore keeps its memory pool
            ours.recv()
            steps = [ours.ask("step") for _ in range(1 + args.scaling_steps)]
            runs[new_tokens, group, size].append((micro, steps, ours.ask("stop"), os.getloadavg()[0]))
            ours.join()
            print(f"scaling pass {k}: {new_tokens} tokens, G={group}, H={size[0]}: "
                  + ", ".join(f"{s['step']:.2f}" for s in steps[1:]) + " s/step", flush=True)
    out: Dict[str, list] = {"response_length": [], "group_size": [], "model_size": []}
    for axis, new_tokens, group, size in axes:
        work, rs = works[size], runs[new_tokens, group, size]
        m = medians([s for _, steps, _, _ in rs for s in steps[1:]])
        value = {"response_length": new_tokens, "group_size": group, "model_size": work.params}[axis]
        out[axis].append({"value": value, "new_tokens": new_tokens, "group_size": group, "params": work.params,
                          "body_params": work.params - work.model["vocab_size"] * size[0],  # without the embedding
                          "hidden_size": size[0], "layers": size[1], "micro_batch": rs[0][0],
                          "peak_rss_gb": max(r[2] for r in rs), "load_average_1min": float(np.mean([r[3] for r in rs])),
                          "step_s": m["step"], "first_step_s": [r[1][0]["step"] for r in rs],
                          "steps_s": [s["step"] for r in rs for s in r[1][1:]], **{f"{p}_s": m[p] for p in PHASES},
                          "tokens_per_s": len(work.texts) * group * new_tokens / m["step"]})
    out["base"], out["summary"] = base, scaling_sentence(out)
    return out


# ----------------------------------------------------------------------------------- main
def code_version() -> str:
    """The commit the library code is at, and whether mindgrpo/ differs from it."""
    import subprocess

    def git(*cmd):
        return subprocess.run(["git", "-C", REPO, *cmd], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", "mindgrpo", "scripts")
    return f"commit {commit}" + (" with uncommitted changes under mindgrpo/ or scripts/" if dirty else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(ALL_CONFIGS))
    ap.add_argument("--mode", choices=("compare", "scaling", "all"), default="compare")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per side after one warm-up step")
    ap.add_argument("--scaling_steps", type=int, default=2, help="measured steps per sweep point and pass")
    ap.add_argument("--scaling_passes", type=int, default=2, help="passes over the sweep, alternating order")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--micro_batch", type=int, default=4, help="rows per forward/backward, both sides (ours: "
                    "actor_config.micro_batch_size, its default; TRL: per_device_train_batch_size with gradient "
                    "accumulation over the rollout batch)")
    ap.add_argument("--trl_no_gradient_checkpointing", action="store_true",
                    help="turn off TRL's default gradient checkpointing (its recomputation in the update)")
    ap.add_argument("--torch_threads", type=int, default=os.cpu_count(),
                    help="PyTorch threads on TRL's side (default: every core, as MindSpore uses)")
    ap.add_argument("--shared", default=SHARED, help="folder with data/gsm8k and tokenizers/qwen2_5 (optional)")
    ap.add_argument("--output", default=os.path.join(HERE, "results", "grpo_step.json"))
    args = ap.parse_args(argv)

    import mindspore as ms
    import torch
    import transformers
    import trl

    ms.set_context(mode=ms.GRAPH_MODE)
    res = {}
    if args.mode != "all" and os.path.exists(args.output):
        with open(args.output) as f:
            res = json.load(f)  # one mode keeps the other's last results (each part records its own date)
    stamp = dict(run_stamp(__file__, argv), code=code_version(),
                 versions=f"mindspore {ms.__version__}, torch {torch.__version__} ({args.torch_threads} threads on "
                          f"TRL's side), transformers {transformers.__version__}, trl {trl.__version__}")
    folder = tempfile.mkdtemp(prefix="grpo_step_")
    try:
        if args.mode in ("compare", "all"):
            res = dict(stamp, configs={}, **({"scaling": res["scaling"]} if "scaling" in res else {}))
            gsm8k = os.path.join(args.shared, "data", "gsm8k", "test.jsonl")
            res["settings"] = (
                f"Work per step: {args.prompts} prompts ({'GSM8K test' if os.path.isfile(gsm8k) else 'synthetic'}, "
                f"{TEMPLATE} template) x G={args.group} x {args.new_tokens} new tokens (forced), fp32, temperature 1, "
                f"top-k 0, top-p 1, beta {BETA} (k3 KL), token-mean loss, lr {LR}, one optimizer step per batch in "
                f"micro-batches of {args.micro_batch} rows, grad clip 1; one warm-up step then {args.steps} "
                f"measured steps per side, each side in its own process, alternating; TRL gradient checkpointing "
                f"{'off' if args.trl_no_gradient_checkpointing else 'on (its default)'}.")
            for name in args.configs:
                res["configs"][name] = compare(name, ALL_CONFIGS[name], folder, args)
            save(res, args.output)
        if args.mode in ("scaling", "all"):
            for k, v in stamp.items():
                res.setdefault(k, v)
            res.setdefault("settings", "")
            base = "tiny-qwen-vocab" if "tiny-qwen-vocab" in args.configs else args.configs[0]
            res["scaling"] = scaling(base, folder, args)
            res["scaling"].update(date=stamp["date"], command=stamp["command"], load_average=stamp["load_average"],
                                  code=stamp["code"], settings=(
                f"{args.prompts} prompts, G={args.group} and {args.new_tokens} new tokens unless varied; micro-batch "
                f"rows scaled so a micro-batch holds {args.micro_batch} x {args.new_tokens} response tokens; "
                f"{args.scaling_passes} passes over the points (every other one in reverse order), each point in a "
                f"fresh process with one warm-up step then {args.scaling_steps} measured; medians over the passes."))
            save(res, args.output)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def save(res: dict, output: str) -> None:
    """The JSON, the markdown beside it and the PNGs (same stem)."""
    stem = os.path.splitext(output)[0]
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    if res.get("configs"):
        res["png"] = os.path.basename(stem) + ".png"
        plot_compare(res, stem + ".png")
    if res.get("scaling"):
        res["scaling_png"] = os.path.basename(stem) + "_scaling.png"
        plot_scaling(res["scaling"], stem + "_scaling.png")
    res["load_average_end"] = "%.1f %.1f %.1f" % os.getloadavg()
    with open(output, "w") as f:
        json.dump(res, f, indent=2)
    write_markdown(res, stem + ".md")
    print(f"written {output} and {os.path.basename(stem)}.md/.png beside it", flush=True)


if __name__ == "__main__":
    sys.exit(main())
