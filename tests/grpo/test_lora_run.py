"""LoRA through the builder and the trainer on one device (actor_config.lora_rank > 0, beta > 0): no reference
model (the reference pass is the policy with its adapters off), gradient buffers and AdamW moments for the
adapters alone, the memory ledger and scripts/plan_memory.py's plan agreeing; a GRPO step moves the adapters and
leaves the base; the engine's rollouts (the policy itself, its fused copies merged W + s B A) and those of an
inference copy synced adapters-only equal the rollouts of a model given the merged weights in full (numpy's merge);
checkpoints hold the adapters, their moments, the base by path and sha256, and the PEFT adapter folder."""

import json
import os
import shutil

import numpy as np
import pytest

import mindspore as ms

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.grpo import builder
from mindgrpo.memory.plan import lora_bytes, plan
from mindgrpo.models.checkpoint import load_state, model_state
from mindgrpo.models.lora import (LoraSpec, adapter_names, adapter_parameters, adapter_state, add_adapters,
                                  merge_state)
from mindgrpo.models.lora_files import read_adapter
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.parallel.checkpoint_folders import CheckpointError
from mindgrpo.parallel.weight_sync import WeightSync
from mindgrpo.utils.progress import Progress

from fakes import one_layer_micro  # tests/grpo is on sys.path under pytest
from test_one_copy import MICRO, NoLog, generate, param_bytes  # the same micro run

LORA = ["actor_config.lora_rank=4", "actor_config.lora_alpha=8", "rl_config.beta=0.05"]

pytestmark = pytest.mark.slow  # builds and compiles a trainer and three engines: over a minute of CPU


def _clone(policy, seed):
    """A model of the policy's config with its base weights (no adapters)."""
    lm = Qwen2ForCausalLM(policy.config, seed=seed, max_positions=int(policy.rope_cos.shape[0]))
    load_state(lm, {k: v for k, v in model_state(policy).items() if ".lora_" not in k})
    return lm


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    out = tmp_path_factory.mktemp("lora_run")
    model = one_layer_micro(out)
    cfg = load_config(GRPOConfig, None, MICRO + LORA + [f"actor_config.model={model}", f"rl_config.output_dir={out}"])
    parts = builder.build(cfg, builder.Paths(output_dir=str(out)))
    trainer = builder.make_trainer(cfg, parts, NoLog(), Progress(1), str(out))
    policy = parts.policy
    base_before = {k: v.copy() for k, v in model_state(policy).items() if ".lora_" not in k}
    adapters_before = {k: v.copy() for k, v in adapter_state(policy).items()}
    metrics = trainer.train_step()
    trainer.step = 1

    # an inference copy with adapters of its own (another A), synced adapters-only; a plain model given the
    # merged weights in full
    spec = LoraSpec(rank=4, alpha=8)
    copy = _clone(policy, seed=11)
    add_adapters(copy, spec, seed=99)
    sync = WeightSync(policy, copy, names=adapter_names(policy))
    sync_metrics = sync()
    merged = Qwen2ForCausalLM(policy.config, seed=12, max_positions=int(policy.rope_cos.shape[0]))
    load_state(merged, merge_state({k: v for k, v in model_state(policy).items() if ".lora_" not in k},
                                   adapter_state(policy), spec.scaling))
    prompts = parts.train_prompts.take(range(2)).ids
    pad = parts.tokenizer.pad_token_id
    rollouts = {name: generate(trainer, engine, prompts) for name, engine in (
        ("policy", parts.engine), ("copy", builder.build_engine(cfg, copy, pad)),
        ("merged", builder.build_engine(cfg, merged, pad)))}
    saved = trainer.save()
    yield dict(cfg=cfg, parts=parts, trainer=trainer, metrics=metrics, base_before=base_before,
               adapters_before=adapters_before, sync_metrics=sync_metrics, rollouts=rollouts, saved=saved, out=out)
    ms.set_context(mode=previous)


def test_no_reference_model_and_only_adapters_train(run):
    parts, trainer = run["parts"], run["trainer"]
    assert parts.reference is None and trainer.ref_is_base and trainer.ref_scorer.lm is parts.policy
    assert parts.inference is parts.policy
    names = adapter_names(parts.policy)
    assert len(names) == 14 and all(n.endswith((".lora_a", ".lora_b")) for n in names)  # 7 projections x A, B
    assert [p.name for p in trainer.updater.params] == names
    assert sorted(p.name for p in trainer.updater.state_parameters()) == \
        sorted(f"adam_{m}.{n}" for m in "mv" for n in names)


def test_a_step_moves_the_adapters_and_not_the_base(run):
    parts, m = run["parts"], run["metrics"]
    base = {k: v for k, v in model_state(parts.policy).items() if ".lora_" not in k}
    assert all(np.array_equal(base[k], run["base_before"][k]) for k in base)
    after = adapter_state(parts.policy)
    assert not any(v.any() for k, v in run["adapters_before"].items() if k.endswith("lora_b"))  # B starts at 0
    assert all(after[k].any() for k in after if k.endswith("lora_b"))
    assert m["grad_norm"] > 0 and m["reward_std"] > 0
    # B = 0 at the step's start: the policy is its base, so the reference pass (adapters off) gives its log-probs
    assert abs(m["kl"]) <= 1e-6


def test_the_ledger_and_the_plan_count_adapters_and_no_reference(run):
    parts = run["parts"]
    mcfg = parts.policy.config
    adapters = sum(lora_bytes(mcfg, run["cfg"].actor_config).values())
    assert adapters == sum(int(np.prod(p.shape)) * 4 for p in adapter_parameters(parts.policy))
    groups = {name: g.size() for name, g in parts.memory.groups.items()}
    assert "reference" not in groups
    assert groups["grads"] == adapters and groups["optimizer"] == 2 * adapters
    assert groups["policy"] == param_bytes(mcfg) + adapters + 4 * 7  # the weights, adapters, their scalings
    p = plan(run["cfg"], mcfg)
    for name in ("policy", "grads", "optimizer", "inference", "kv_cache"):
        assert p.groups[name] == groups[name], name
    assert "reference" not in p.groups and p.phases["reference"] == ["policy"]
    assert p.phase_bytes("reference", True) == parts.memory.phase_peaks["reference"]


def test_adapter_only_sync_and_the_merged_engine_equal_a_full_merged_model(run):
    """Greedy tokens identical, log-probs within 1e-5; the sync moved the adapters' bytes only."""
    sync = run["sync_metrics"]
    assert sync["sync/bytes"] == sum(int(np.prod(p.shape)) * 4 for p in adapter_parameters(run["parts"].policy))
    ref = run["rollouts"]["merged"]
    for name in ("policy", "copy"):
        for kind in ("greedy", "sampled"):
            ours, theirs = run["rollouts"][name][kind], ref[kind]
            assert [c.token_ids for c in ours] == [c.token_ids for c in theirs], (name, kind)
            for a, b in zip(ours, theirs):
                assert np.abs(a.logprobs - b.logprobs).max() <= 1e-5, (name, kind)


def test_checkpoint_holds_adapters_moments_base_reference_and_peft_folder(run, tmp_path):
    saved, parts, trainer = run["saved"], run["parts"], run["trainer"]
    files = sorted(os.listdir(saved))
    assert "lora.ckpt" in files and "optimizer.ckpt" in files and "adapter" in files
    assert "policy.ckpt" not in files and "reference.ckpt" not in files
    with open(os.path.join(saved, "manifest.json")) as f:
        listed = json.load(f)["files"]
    assert "adapter/adapter_config.json" in listed and "adapter/adapter_model.safetensors" in listed
    spec, state = read_adapter(os.path.join(saved, "adapter"))
    assert (spec.rank, spec.alpha) == (4, 8.0)
    assert all(np.array_equal(state[k], v) for k, v in adapter_state(parts.policy).items())
    with open(os.path.join(saved, "state.json")) as f:
        base = json.load(f)["lora_base"]
    assert os.path.isfile(base["path"]) and base["path"].endswith(base["sha256"][:16] + ".ckpt")
    assert os.path.isfile(os.path.join(os.path.dirname(base["path"]), "config.json"))  # loads on its own

    # resume: the base from its file (perturbed here first), the adapters and moments from the checkpoint
    policy = parts.policy
    kept = {p.name: p.asnumpy().copy() for p in policy.get_parameters()}
    moments = {p.name: p.asnumpy().copy() for p in trainer.updater.state_parameters()}
    w = policy.model.layers[0].attention.wq.weight
    w.set_data(ms.Tensor(np.zeros(w.shape, np.float32)))
    a = adapter_parameters(policy)[0]
    a.set_data(ms.Tensor(np.zeros(a.shape, np.float32)))
    trainer.resume(saved)
    assert all(np.array_equal(p.asnumpy(), kept[p.name]) for p in policy.get_parameters())
    assert all(np.array_equal(p.asnumpy(), moments[p.name]) for p in trainer.updater.state_parameters())
    # a base that changed since is refused, naming it
    shutil.copy(base["path"], str(tmp_path / "kept.ckpt"))
    try:
        raw = {k: v.asnumpy() for k, v in ms.load_checkpoint(base["path"]).items()}
        raw["model.norm_out.weight"] = raw["model.norm_out.weight"] * 2
        ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in raw.items()], base["path"])
        with pytest.raises(CheckpointError, match="has changed since it was saved"):
            trainer.resume(saved)
    finally:
        shutil.copy(str(tmp_path / "kept.ckpt"), base["path"])
    trainer.resume(saved)
