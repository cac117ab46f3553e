"""TRL's side of the GRPO step benchmark: its GRPOTrainer on the same work, its phases timed by
wrapping its methods and a trainer callback."""

from __future__ import annotations

import time
from typing import Callable

from benchmarks.grpo_step.flops import peak_shapes
from benchmarks.grpo_step.report import PHASES
from benchmarks.grpo_step.workload import BETA, LR, Workload, letter_share
from benchmarks.matmul_peak import matmul_gflops


def run_trl(work: Workload, folder: str, group: int, new_tokens: int, micro_batch: int, steps: int,
            after_step: Callable[[dict], None], gradient_checkpointing: bool = True, peft_config=None) -> None:
    """TRL's GRPOTrainer for `steps` optimizer steps, each on one rollout batch in micro-batches of
    `micro_batch` rows (gradient accumulation); after_step(phase seconds) runs after each step, untimed.
    peft_config: a PEFT LoraConfig (TRL then trains the adapters and scores the reference with them off)."""
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
    trainer = GRPOTrainer(model=work.hf_dir, reward_funcs=letter_share, args=args,
                          train_dataset=Dataset.from_dict({"prompt": work.texts}),
                          processing_class=AutoTokenizer.from_pretrained(work.tokenizer_dir), peft_config=peft_config)

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
        if trainer.ref_model is None and peft_config is not None and not torch.is_grad_enabled():
            return "reference"  # PEFT: TRL scores the reference with the adapters off (old log-probs are not needed)
        return "reference" if model is trainer.ref_model else None if torch.is_grad_enabled() else "old_logprobs"

    timed("_generate_single_turn", lambda *a, **k: "generation")
    timed("_get_per_token_logps_and_entropies", scoring)
    timed("_prepare_inputs", lambda *a, **k: "prepare")
    trainer.add_callback(phases)
    trainer.train()


def trl_worker(conn, work: Workload, folder: str, group: int, new_tokens: int, micro_batch: int, steps: int,
               gradient_checkpointing: bool, threads: int) -> None:
    """A `benchmarks.workers` side: runs TRL; after each step measures PyTorch's matmul GFLOP/s,
    sends them with the step's phases and waits for "go"."""
    import torch

    # explicitly: a process that has imported MindSpore passes OMP_NUM_THREADS=1 on to its children
    # (its runtime setenv()s it), and PyTorch would then run on one thread
    torch.set_num_threads(threads)
    s = max(map(len, work.prompt_ids)) + new_tokens

    def after_step(phases: dict) -> None:
        phases["torch_threads"] = float(torch.get_num_threads())
        phases["matmul_gflops"] = matmul_gflops("torch", peak_shapes(work.model, s, new_tokens, micro_batch))
        conn.send(phases)
        conn.recv()

    run_trl(work, folder, group, new_tokens, micro_batch, steps, after_step, gradient_checkpointing)
