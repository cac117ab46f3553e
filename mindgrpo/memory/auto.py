"""`rl_config.memory`: the memory policy of a config on the memory a placement has (`choose`).

    policy = choose(cfg, mcfg, "CPU")                 # MemoryPolicy; available: this host's, measured now
    policy = choose(cfg, mcfg, "CPU", available=24 * 2**30)   # planned against a given size
    cfg = apply(cfg, policy)                          # the config with the policy's savers written in

`auto` plans the step (`mindgrpo/memory/plan.py`) for every set of the savers the user left unset that can
act in this config, fastest first (`policy.relative_time`), and keeps the first whose planned peak is at most
(1 - MARGIN) of the memory available; when none fits, every saver (the most it can do), said in the block. With
the layerwise update on and actor_config.recompute_num_layers left null, it then takes the fewest recomputed layers
that still fit (the others keep their activations: no second forward) where that is faster than recomputing every
layer (measured for LoRA; for full fine-tuning no gain was measured, and it stays null); `speed` recomputes none
where that is faster, `low` all.

Where the plan has figures: one device on MindSpore's CPU runtime, whose compiled graphs' buffers the plan
counts (measured, `plan.CPU_GRAPH_BUFFERS`), against the host's available memory (/proc/meminfo MemAvailable
plus what this process already holds, which the plan counts as the runtime's own). Under msrun (several
processes share the host; the plan has no graph figures for their layouts) `auto` leaves the savers off.

Ascend (NOT TESTED: written from MindSpore's documented API, no Ascend device was at hand): the device's HBM
(`mindspore.hal.get_device_properties(...).total_memory`, once the device is initialised) against the plan's
device peak with the config's swap (`MemoryPlan.peak`), and the host's MemAvailable against what swap keeps
there (every group); the savers' effects were measured on the CPU runtime only, so `auto` leaves them off
there and says whether the step fits.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from typing import Dict, Optional, Sequence, Tuple

from mindgrpo.config.grpo import GRPOConfig
from mindgrpo.config.loader import ConfigError
from mindgrpo.memory.plan import plan
from mindgrpo.memory.policy import SAVERS, MemoryPolicy, relative_time, update_layers_time
from mindgrpo.models.config import Qwen2Config

MARGIN = 0.10  # the planned peak stays below 90% of the memory available


def _get(cfg, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def apply(cfg: GRPOConfig, values: Dict[str, Optional[bool]]) -> GRPOConfig:
    """`cfg` with the dotted keys of `values` set (a MemoryPolicy's `overrides()`); the sections' checks run."""
    sections: Dict[str, dict] = {}
    for key, value in values.items():
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    return dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **kv) for s, kv in sections.items()})


def host_available() -> int:
    """Bytes this process could hold: /proc/meminfo's MemAvailable plus its own resident memory now."""
    from mindgrpo.utils.host_memory import status_bytes

    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return avail + status_bytes("VmRSS")


def device_available(device_target: str) -> Tuple[int, str]:
    """(bytes, what they are) for the placement's device."""
    if device_target == "Ascend":  # NOT TESTED (no Ascend device here): MindSpore's documented hal API
        import mindspore as ms

        props = ms.hal.get_device_properties(0, "Ascend")  # the device this process holds; 0 before init
        return int(getattr(props, "total_memory", 0) or 0), "the device's HBM"
    return host_available(), "this host's MemAvailable + this process"


def _settable(cfg: GRPOConfig) -> Tuple[Dict[str, bool], Tuple[str, ...], Tuple[str, ...]]:
    """(the user's savers and values, the unset savers that can act here, those that cannot): a saver can act
    where the config with it on passes the config's own checks (layouts, packing, beta ...)."""
    user = {k: bool(_get(cfg, key)) for k, (key, _) in SAVERS.items() if _get(cfg, key) is not None}
    free, inert = [], []
    for name, (key, _) in SAVERS.items():
        if name in user:
            continue
        try:
            apply(cfg, {key: True})
            free.append(name)
        except ConfigError:
            inert.append(name)
    return user, tuple(free), tuple(inert)


def _policy(cfg, mcfg, setting, on, user, inert, available, where, note="", cpu=True, reward_models=()) -> MemoryPolicy:
    switches = {**{k: k in on for k in SAVERS}, **user}
    set_by = tuple((k, "user" if k in user else "n/a" if k in inert else setting) for k in SAVERS)
    p = plan(apply(cfg, {SAVERS[k][0]: v for k, v in switches.items() if k not in inert}), mcfg,
             reward_models=reward_models)
    if cpu and p.cpu_graphs:  # the process on MindSpore's CPU runtime, graph buffers counted
        planned = p.cpu_phase_peaks(switches["release_graphs"])
    else:  # device memory: the ledger's groups and the update's activations (`MemoryPlan.total`)
        planned = {phase: p.total(phase, cfg.rl_config.swap) for phase in p.phases}
    return MemoryPolicy(setting=setting, set_by=set_by, planned=tuple(planned.items()),
                        peak=max(planned.values()), available=available, margin=MARGIN, where=where, note=note,
                        **{k: bool(v) for k, v in switches.items()}, layers=mcfg.num_hidden_layers,
                        **MemoryPolicy.update_settings(cfg))


def choose(cfg: GRPOConfig, mcfg: Qwen2Config, device_target: str = "CPU", one_device: bool = True,
           available: Optional[int] = None, reward_models: Sequence[Qwen2Config] = ()) -> MemoryPolicy:
    """The memory policy of `cfg` (rl_config.memory) for its model `mcfg` on `device_target`; `reward_models`: the
    model configs of reward_config.reward_models, in order (`memory.plan.plan`)."""
    policy = functools.partial(_policy, reward_models=reward_models)
    setting = cfg.rl_config.memory
    user, free, inert = _settable(cfg)
    where = "given"
    if available is None:
        available, where = device_available(device_target)
    cpu = device_target == "CPU"
    if setting == "speed":  # the layerwise update, if the user keeps it, recomputes no layer where that is faster
        faster = update_layers_time(0, mcfg.num_hidden_layers, cfg.actor_config.lora_rank > 0) < 1.0
        return _kept_layers(policy(cfg, mcfg, setting, (), user, inert, available, where, cpu=cpu),
                            0 if faster else None)
    if setting == "low":  # the layerwise update's layers all recompute (the least memory)
        return _kept_layers(policy(cfg, mcfg, setting, free, user, inert, available, where, cpu=cpu), None)
    if device_target != "CPU" or not one_device:
        why = ("the savers were measured on MindSpore's CPU runtime only" if device_target != "CPU"
               else "several processes share this host and the plan has no graph figures for their layouts")
        note = f"auto leaves the unset savers off here ({why}); set them by hand if the step does not fit"
        if device_target != "CPU" and cfg.rl_config.swap:  # NOT TESTED: swap parks every group on the host
            host, parked = host_available(), sum(plan(cfg, mcfg, reward_models=reward_models).groups.values())
            note += (f"; swap parks up to {parked / 2 ** 30:.1f} GiB on the host, which has {host / 2 ** 30:.1f} GiB "
                     + ("available" if parked <= (1 - MARGIN) * host else "available: NOT enough"))
        return policy(cfg, mcfg, setting, (), user, inert, available, where, note=note, cpu=cpu)
    subsets = [c for r in range(len(free) + 1) for c in itertools.combinations(free, r)]
    subsets.sort(key=lambda on: relative_time((*on, *(k for k, v in user.items() if v))))
    for on in subsets:
        chosen = policy(cfg, mcfg, setting, on, user, inert, available, where)
        if chosen.fits:
            return _fewest_recomputed(cfg, mcfg, chosen, policy, user, inert)
    return dataclasses.replace(
        policy(cfg, mcfg, setting, free, user, inert, available, where),
        note="no set of savers fits: every saver left to auto is on; lower max_num_seqs, micro_batch_size or the "
             "lengths, or free memory (scripts/plan_memory.py shows each phase)")


RECOMPUTE_KEY = "actor_config.recompute_num_layers"


def _kept_layers(chosen: MemoryPolicy, n: Optional[int]) -> MemoryPolicy:
    """`chosen` with actor_config.recompute_num_layers n decided by its setting, where the user left it null and the
    layerwise update is on (else as it was)."""
    if not chosen.layerwise_update or chosen.recompute_num_layers is not None:
        return chosen
    return dataclasses.replace(chosen, recompute_num_layers=n, recompute_by=chosen.setting)


def _fewest_recomputed(cfg, mcfg, chosen: MemoryPolicy, policy, user, inert) -> MemoryPolicy:
    """auto's savers `chosen` (they fit, every layer of a layerwise update recomputing): with the layerwise update on
    and actor_config.recompute_num_layers left null, the fewest recomputed layers whose plan still fits (each layer
    past them keeps its activations: `plan.saved_activation_bytes`), where that is faster than every layer
    recomputing (`policy.update_layers_time`: a recomputed layer beside kept ones is the slower); else null."""
    if not chosen.layerwise_update or cfg.actor_config.recompute_num_layers is not None:
        return chosen
    on = tuple(k for k in SAVERS if getattr(chosen, k) and k not in user)
    layers, lora = mcfg.num_hidden_layers, cfg.actor_config.lora_rank > 0
    for n in range(layers):
        if update_layers_time(n, layers, lora) >= 1.0:
            break  # more recomputed layers are slower still
        kept = policy(apply(cfg, {RECOMPUTE_KEY: n}), mcfg, chosen.setting, on, user, inert, chosen.available,
                      chosen.where)
        if kept.fits:
            return dataclasses.replace(kept, recompute_by=chosen.setting)
    return _kept_layers(chosen, None)  # every layer recomputes: null


def choose_for_run(cfg: GRPOConfig, mcfg: Qwen2Config, device_target: str, world_size: int,
                   reward_models: Sequence[Qwen2Config] = ()) -> MemoryPolicy:
    """The builder's call: the placement's device, whether it is one process, and rl_config.memory_budget_gb
    (a stated size instead of what the placement has now)."""
    budget = cfg.rl_config.memory_budget_gb
    return choose(cfg, mcfg, device_target, world_size == 1,
                  available=None if budget is None else int(budget * 2 ** 30), reward_models=reward_models)
