"""Stand-ins for the trainer's collaborators and small inputs shared by the tests of tests/grpo (which is on
sys.path under pytest)."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


class RecordingLog:
    """The metrics log: keeps each step's metrics in `rows`; completions are dropped."""

    def __init__(self):
        self.rows = {}

    def log(self, step, metrics):
        self.rows[step] = dict(metrics)

    def log_completions(self, step, rows):
        pass


def ragged_experience():
    """Four samples of a 512-token vocabulary with prompts of 9, 5, 7 and 12 and responses of 6, 11, 3
    and 8 tokens (padded to a multiple of 8), random advantages and reference log-probs."""
    import numpy as np

    from mindgrpo.grpo.experience import pack

    rng = np.random.default_rng(20)
    prompts = [rng.integers(1, 512, n).tolist() for n in (9, 5, 7, 12)]
    responses = [rng.integers(1, 512, n).tolist() for n in (6, 11, 3, 8)]
    exp = pack(prompts, responses, rng.standard_normal(4).astype(np.float32), step=8)
    exp.ref_logp = (-6.0 + 0.3 * rng.standard_normal(exp.labels.shape)).astype(np.float32) * exp.mask
    return exp


def with_adapters(cfg, p=0.0, stage=None, seed=7):
    """A Qwen2ForCausalLM of cfg (seed `seed`) with rank-4 adapters of dropout p on all seven projections, B random
    (a zero B gives A no gradient), each B from its own name's stream: a pipeline stage's are the whole model's."""
    import zlib

    import numpy as np
    from mindspore import Tensor

    from mindgrpo.models.lora import LoraSpec, adapter_parameters, add_adapters
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    lm = Qwen2ForCausalLM(cfg, seed=seed, stage=stage)
    add_adapters(lm, LoraSpec(rank=4, alpha=8.0, dropout=p), seed=3)
    for q in adapter_parameters(lm):
        if q.name.endswith(".lora_b"):
            rng = np.random.default_rng([11, zlib.crc32(q.name.encode())])
            q.set_data(Tensor(rng.normal(0.0, 0.2, q.shape).astype(np.float32)))
    return lm


def one_layer_micro(folder) -> str:
    """tests/grpo/micro_qwen2.yaml with one decoder layer, written into `folder`: its path. A graph of one
    layer compiles in about 0.6x the CPU time of two."""
    with open(os.path.join(HERE, "micro_qwen2.yaml")) as f:
        text = f.read().replace("num_hidden_layers: 2", "num_hidden_layers: 1")
    assert "num_hidden_layers: 1" in text
    path = os.path.join(str(folder), "micro_one_layer.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def watch_ledger(memory) -> list:
    """Records (phase, the exclusive groups resident) at every check of the swap ledger `memory` (the checks still
    run): the list it returns fills as the trainer runs."""
    from mindgrpo.memory import swap

    seen, check = [], memory._check_and_record

    def watch():
        seen.append((memory.current, [n for n in swap.EXCLUSIVE if n in memory.groups and memory.groups[n].resident]))
        check()

    memory._check_and_record = watch
    return seen


def keep_rollouts(trainer) -> dict:
    """The trainer's reward phase also keeps the Rollouts it scored, in the returned dict under "r"."""
    kept, reward = {}, trainer.reward

    def keeping(r):
        metrics = reward(r)
        kept["r"] = r
        return metrics

    trainer.reward = keeping
    return kept


class StepRecorder:
    """A trainer's steps run by hand (`steps(n)`: train_step, then the step count), what each step's `collect`
    returned kept as record(rollouts, metrics) in trained[name][step] (`name`: the run's, settable: "straight",
    "resumed", ...)."""

    def __init__(self, trainer, record, names=("straight", "resumed")):
        self.trainer, self.name = trainer, names[0]
        self.trained = {n: {} for n in names}
        collect = trainer.collect

        def recorded():
            r, m = collect()
            self.trained[self.name][trainer.step + 1] = record(r, m)
            return r, m

        trainer.collect = recorded

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.trainer.train_step()
            self.trainer.step += 1


def save_judge(folder, model_yaml, seed=11) -> str:
    """A random causal LM of `model_yaml`'s shape as a MindSpore .ckpt with its config beside it (a generative judge's
    model): its path."""
    import shutil

    from mindgrpo.models.checkpoint import model_state, save_ms_checkpoint
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM

    os.makedirs(folder, exist_ok=True)
    shutil.copyfile(model_yaml, os.path.join(folder, "config.yaml"))
    lm = Qwen2ForCausalLM(Qwen2Config.load(model_yaml, param_init_std=0.5), seed=seed)
    path = os.path.join(folder, "judge.ckpt")
    save_ms_checkpoint({n: ("F32", a) for n, a in model_state(lm).items()}, path)
    return path


def save_reward_model(folder, model_yaml, seed=7) -> str:
    """A random reward model of `model_yaml`'s shape as a MindSpore .ckpt with its config beside it: its path."""
    import shutil

    from mindgrpo.models.checkpoint import save_ms_checkpoint
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.reward_model import RewardModel

    os.makedirs(folder, exist_ok=True)
    shutil.copyfile(model_yaml, os.path.join(folder, "config.yaml"))
    rm = RewardModel(Qwen2Config.load(model_yaml, param_init_std=0.5), seed=seed)
    path = os.path.join(folder, "rm.ckpt")
    save_ms_checkpoint({n: ("F32", p.asnumpy()) for n, p in rm.named_parameters().items()}, path)
    return path
