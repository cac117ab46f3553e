"""Our side of the GRPO step benchmark: the project's trainer, built by its builder, step by step."""

from __future__ import annotations

import os
import time
from typing import Dict

from benchmarks.grpo_step.flops import peak_shapes
from benchmarks.grpo_step.workload import BETA, LR, REWARD, Workload, letter_share
from benchmarks.matmul_peak import matmul_gflops


class OurSide:
    """The project's trainer built by its builder; `step()` runs `train_step` and returns phase seconds."""

    def __init__(self, work: Workload, folder: str, group: int, new_tokens: int, micro_batch: int,
                 logprob_chunk: int = 0):
        from mindgrpo.config import ActorConfig, GenerateConfig, GRPOConfig, RLConfig, RewardConfig
        from mindgrpo.grpo import builder
        from mindgrpo.rewards import register_reward
        from mindgrpo.utils.metrics_log import MetricsLogger
        from mindgrpo.utils.progress import Progress

        register_reward(REWARD, overwrite=True)(letter_share)
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
        self.parts = builder.build(cfg, paths)
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


def ours_worker(conn, work: Workload, folder: str, group: int, new_tokens: int, micro_batch: int,
                peaks: bool = False, logprob_chunk: int = 0) -> None:
    """A `benchmarks.workers` side: builds our side, says "ready", then runs a step per "step" until
    "stop"; with `peaks`, measures MindSpore's matmul GFLOP/s after each step."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ours = OurSide(work, folder, group, new_tokens, micro_batch, logprob_chunk)
    conn.send("ready")
    s = max(map(len, work.prompt_ids)) + new_tokens
    while conn.recv() == "step":
        phases = ours.step()
        if peaks:  # right after the step, under the same machine load
            phases["matmul_gflops"] = matmul_gflops("mindspore", peak_shapes(work.model, s, new_tokens, micro_batch))
        conn.send(phases)
