"""The run's memory policy: which memory savers are on, and why (the resolved `rl_config.memory`).

`rl_config.memory` names a policy: `speed` (every saver off: the fastest step), `low` (every saver that
can act in this config on) or `auto` (the fastest set whose planned peak fits the memory this placement
has, with a margin: `mindgrpo/memory/auto.py`). A saver set in the config by the user (not null) keeps
the user's value whatever the policy. The result is this frozen object, which the builder logs once at
start-up and hands to the trainer, the rollout engine, the updater and the scorer instead of loose flags.

The savers, their config keys and their cost in time (measured on MindSpore 2.10's CPU runtime;
DEVELOPERS.md has the figures; `docs/memory.md` is the user's table):

    release_graphs       rl_config.release_graphs          each phase's compiled graphs dropped when it ends
                                                           (compiled again next step: the costliest)
    layerwise_update     actor_config.layerwise_update     the update as one decoder-layer graph run per layer
    reference_layerwise  ref_config.layerwise              the reference's scoring so too
    generate_layerwise   generate_config.layerwise         the rollout engine's graphs so too

No MindSpore and no config import here: this is plain data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

SETTINGS = ("auto", "speed", "low")

# policy field -> (config key, relative step time when on: the ordering `auto` uses to find the fastest set that
# fits). From the measured costs: release_graphs compiles the step's graphs again every step (the tiny default
# ~4x its step, the 0.5B shape at 2 layers 1.16x); the layerwise update 1.24x / 0.98x at 2 / 4 layers; the
# layerwise rollout's decode 1.3x (21.1 against 16.2 s at 24 layers); the layerwise reference, a forward pass
# only, least.
SAVERS: Dict[str, Tuple[str, float]] = {
    "layerwise_update": ("actor_config.layerwise_update", 1.10),
    "reference_layerwise": ("ref_config.layerwise", 1.05),
    "generate_layerwise": ("generate_config.layerwise", 1.20),
    "release_graphs": ("rl_config.release_graphs", 1.50),
}


# actor_config.recompute_num_layers n < N layers (`models/saved_layer.py`): a layer's update time against the same
# layer's with every layer recomputing, for LoRA and full fine-tuning. LoRA: one layer's graphs at the Qwen2.5-0.5B
# shape and 4 rows of 266 tokens took 0.55 s kept and 0.79 recomputed beside kept ones (the saving forward again)
# against 0.69, and the issue-20 LoRA update at 24 layers 61.6 s against 77.3 with none recomputing
# (benchmarks/results/lora_step_24_layers.md). Full fine-tuning: one layer's graphs 0.69 and 0.91 s against 0.82,
# but the issue-20 update (release_graphs on) took 106.8 s against 104.2 with none recomputing, at 3 GB more: no gain
# measured, so 1.0 (auto keeps every layer recomputing there)
KEPT_LAYER_TIME = {"lora": 0.80, "full": 1.0}
RECOMPUTED_LAYER_TIME = {"lora": 1.15, "full": 1.11}
# the update's share of a step, to weigh update_layers_time into the step's time: in the issue-20 step at 24 layers
# (benchmarks/results/HISTORY.md, 2026-12-01) LoRA's update was 64.8 of 127.5 s on padded rows (0.51) and 42.4 of 94.5
# with a shared prefix (0.45), full fine-tuning's 103.9 of 171.0 (0.61)
UPDATE_SHARE = 0.5


def update_layers_time(recompute_num_layers, layers: int, lora: bool) -> float:
    """The update's decoder-layer time with recompute_num_layers (None: every layer recomputes) against every layer
    recomputing; lora: the adapters train (the base frozen), else every weight."""
    n = layers if recompute_num_layers is None else min(recompute_num_layers, layers)
    if n >= layers:
        return 1.0
    kind = "lora" if lora else "full"
    return (n * RECOMPUTED_LAYER_TIME[kind] + (layers - n) * KEPT_LAYER_TIME[kind]) / layers


def relative_time(on, update_time: float = 1.0) -> float:
    """The step's planned time relative to every saver off, for the savers named in `on`; update_time: the layerwise
    update's decoder-layer time against every layer recomputing (`update_layers_time`), weighed by UPDATE_SHARE."""
    return math.prod(SAVERS[name][1] for name in on) * (1.0 - UPDATE_SHARE * (1.0 - update_time))


@dataclass(frozen=True)
class MemoryPolicy:
    """The resolved memory policy. `set_by` says for each saver who chose it: "user" (set in the config),
    or the setting ("auto", "speed", "low"); "n/a" when it cannot act in this config (left off)."""

    setting: str = "speed"
    release_graphs: bool = False
    layerwise_update: bool = False
    reference_layerwise: bool = False
    generate_layerwise: bool = False
    set_by: Tuple[Tuple[str, str], ...] = ()
    planned: Tuple[Tuple[str, int], ...] = ()  # phase -> planned peak bytes of the process (CPU) or device
    peak: int = 0  # the planned peak, bytes (0: not planned)
    available: int = 0  # the memory planned against, bytes (0: unknown)
    margin: float = 0.10  # the planned peak must stay below (1 - margin) x available
    where: str = ""  # what `available` is ("host MemAvailable", "device HBM", ...)
    note: str = ""  # why the choice is what it is, when it is not simply "fits"
    # the update's own memory settings, as the config sets them (no setting chooses them): activation recompute per
    # decoder layer (actor_config.recompute) and, with layerwise_update, the rows of a micro-batch the vocabulary
    # head takes a graph call (actor_config.head_rows_per_graph; 0: all) and how many of the first decoder layers
    # run their forward again in their backward (actor_config.recompute_num_layers; None: all; the others keep
    # their activations)
    recompute: bool = False
    head_rows: int = 0
    recompute_num_layers: Optional[int] = None
    recompute_by: str = "user"  # who set recompute_num_layers: "user" (the config's value) or the setting
    layers: int = 0  # the model's decoder layers (0: not known) and whether LoRA trains: what the kept layers save
    lora: bool = False

    @classmethod
    def from_switches(cls, switches: Dict[str, bool | None], setting: str = "speed", **update) -> "MemoryPolicy":
        """The policy of explicit switches (a part built without the builder): each unset one off; `update`:
        recompute, head_rows, recompute_num_layers."""
        return cls(setting=setting, **{k: bool(switches.get(k)) for k in SAVERS},
                   set_by=tuple((k, "user" if switches.get(k) is not None else setting) for k in SAVERS), **update)

    @staticmethod
    def update_settings(cfg) -> Dict[str, object]:
        """recompute, head_rows, recompute_num_layers and lora as `cfg` (a GRPOConfig) sets them."""
        actor = cfg.actor_config
        return dict(recompute=actor.recompute, head_rows=actor.head_rows_per_graph,
                    recompute_num_layers=actor.recompute_num_layers, lora=actor.lora_rank > 0)

    @classmethod
    def of_config(cls, cfg) -> "MemoryPolicy":
        """The switches as `cfg` (a GRPOConfig) sets them, each unset one off: what a trainer built without the
        builder (tests, benchmarks) runs with. The builder resolves rl_config.memory instead (`memory/auto.py`)."""
        values = {}
        for name, (key, _) in SAVERS.items():
            section, field_name = key.split(".")
            values[name] = getattr(getattr(cfg, section), field_name)
        return cls.from_switches(values, setting="unset", **cls.update_settings(cfg))

    @property
    def on(self) -> Tuple[str, ...]:
        return tuple(k for k in SAVERS if getattr(self, k))

    @property
    def step_time(self) -> float:
        """The planned step time against every saver off (`relative_time`), with the kept layers of a layerwise
        update (recompute_num_layers below the model's layers) counted."""
        update = update_layers_time(self.recompute_num_layers, self.layers, self.lora) if self.layerwise_update else 1.0
        return relative_time(self.on, update)

    @property
    def fits(self) -> bool:
        return not self.available or self.peak <= (1 - self.margin) * self.available

    def overrides(self) -> Dict[str, object]:
        """config key -> value for every saver this policy decided (not the user's, not those that cannot act), and
        actor_config.recompute_num_layers where the setting decided it."""
        out = {SAVERS[k][0]: getattr(self, k) for k, who in self.set_by if who not in ("user", "n/a")}
        if self.recompute_by != "user":
            out["actor_config.recompute_num_layers"] = self.recompute_num_layers
        return out

    def summary(self) -> str:
        """The start-up block: the setting, each saver and who set it, the planned peak per phase."""
        gib = 2 ** 30
        lines = [f"memory: rl_config.memory={self.setting}"
                 + (f", planned against {self.available / gib:.1f} GiB ({self.where}) with a {self.margin:.0%} margin"
                    if self.available else "")]
        who = dict(self.set_by)
        for name, (key, cost) in SAVERS.items():
            lines.append(f"  {key:<32} {'on ' if getattr(self, name) else 'off'}  ({who.get(name, self.setting)}; "
                         f"~{cost:.2f}x step time when on)")
        if self.layerwise_update:
            n = self.recompute_num_layers
            what = ("every layer runs its forward again in its backward" if n is None else
                    "no layer runs its forward again: each keeps its activations" if n == 0 else
                    f"the first {n} layers run their forward again, the later ones keep their activations")
            lines.append(f"  {'actor_config.recompute_num_layers':<32} {'null' if n is None else n:<4} "
                         f"({self.recompute_by}; {what})")
        if self.planned:
            lines.append("  planned peak by phase: " + ", ".join(f"{p} {b / gib:.2f} GiB" for p, b in self.planned))
        if self.peak:
            lines.append(f"  planned peak {self.peak / gib:.2f} GiB: "
                         + ("fits" if self.fits else "does NOT fit")
                         + (f" in {(1 - self.margin) * self.available / gib:.1f} GiB" if self.available else "")
                         + f"; step time ~{self.step_time:.2f}x the fastest")
        if self.note:
            lines.append(f"  {self.note}")
        return "\n".join(lines)
