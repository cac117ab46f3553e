"""Our parallel layout of Qwen2/Qwen3 (Megatron style: tensor, data and pipeline parallel), as data.

World = pp * dp * tp ranks, MindSpore's order: pipeline stage s holds ranks [s*dp*tp, (s+1)*dp*tp),
and within a stage rank r holds tensor-parallel piece `r % tp` of data-parallel replica
`(r // tp) % dp`. Tensor-parallel groups are runs of consecutive ranks, the dp replicas of a
piece are identical, and the pp ranks with the same (dp, tp) coordinates pass activations on.

Stage s holds the decoder layers `stage_layers(s, L)` (contiguous, near-equal runs, the
earlier stages taking one more when pp does not divide L), stage 0 the embedding, the last
stage the final norm and the lm_head (pipeline stages need untied embeddings).

    column-parallel, split on dim 0:  wq/wk/wv weight and bias, w1 (gate), w3 (up),
                                      the embedding (vocab-parallel), lm_head
    row-parallel, split on dim 1:     wo, w2 (down)
    replicated:                       the RMSNorm weights (Qwen3's q_norm/k_norm over d included)

Each split is into tp contiguous, equal pieces. Optimizer moments (`adam_m.<name>`,
`adam_v.<name>`, see `mindgrpo/grpo/optim.py`) follow their parameter. `mindgrpo.parallel.strategy`
writes this layout as a MindSpore strategy file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes

# (pattern on the parameter name, split dim or None); the first match wins.
SPLIT_RULES: Tuple[Tuple[str, Optional[int]], ...] = (
    (r"model\.tok_embeddings\.embedding_weight", 0),
    (r"model\.layers\.\d+\.attention\.w[qkv]\.(weight|bias)", 0),
    (r"model\.layers\.\d+\.attention\.wo\.weight", 1),
    (r"model\.layers\.\d+\.feed_forward\.w[13]\.weight", 0),
    (r"model\.layers\.\d+\.feed_forward\.w2\.weight", 1),
    (r"model\.layers\.\d+\.(attention_norm|ffn_norm)\.weight", None),
    (r"model\.layers\.\d+\.attention\.[qk]_norm\.weight", None),  # Qwen3's QK-norm: (d,) per head
    (r"model\.norm_out\.weight", None),
    (r"lm_head\.weight", 0),
    (r"score\.(weight|[02]\.weight|[02]\.bias)", None),  # a reward model's head: whole on every rank
    # LoRA adapters, split with their projection: a column-parallel one's B (out, r) by output rows, its A whole;
    # a row-parallel one's A (r, in) by input columns, its B whole; the scalings whole
    (r"model\.layers\.\d+\.(attention\.w[qkv]|feed_forward\.w[13])\.lora_b", 0),
    (r"model\.layers\.\d+\.(attention\.w[qkv]|feed_forward\.w[13])\.lora_a", None),
    (r"model\.layers\.\d+\.(attention\.wo|feed_forward\.w2)\.lora_a", 1),
    (r"model\.layers\.\d+\.(attention\.wo|feed_forward\.w2)\.lora_b", None),
    (r"model\.layers\.\d+\.\w+\.w\w\.lora_scaling", None),
)
_RULES = tuple((re.compile(p + "$"), dim) for p, dim in SPLIT_RULES)
OPTIMIZER_PREFIXES = ("adam_m.", "adam_v.")  # moments of a parameter: same shape, same split


class LayoutError(ValueError):
    """A layout that does not fit the world or the model: the message names the culprit."""


@dataclass(frozen=True)
class ParallelLayout:
    dp: int = 1  # data_parallel
    tp: int = 1  # model_parallel
    pp: int = 1  # pipeline_stage

    def __post_init__(self):
        for key, value in (("data_parallel", self.dp), ("model_parallel", self.tp), ("pipeline_stage", self.pp)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"{key} must be an integer >= 1, got {value!r}")

    @classmethod
    def from_config(cls, parallel_config) -> "ParallelLayout":
        """From a `mindgrpo.config.sections.ParallelConfig` (or anything with its three fields)."""
        pc = parallel_config
        return cls(pc.data_parallel, pc.model_parallel, pc.pipeline_stage)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def check_world(self, world: int, where: str = "actor_config.parallel_config") -> None:
        if world != self.world_size:
            raise LayoutError(f"{where}: data_parallel*model_parallel*pipeline_stage = {self.world_size}, "
                              f"but the world size is {world}")

    # ------------------------------------------------------------------ ranks

    @property
    def stage_size(self) -> int:
        """Ranks per pipeline stage."""
        return self.dp * self.tp

    def coords(self, rank: int) -> Tuple[int, int]:
        """rank -> (dp_idx, tp_idx) within its pipeline stage."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside the world of {self.world_size} ranks")
        local = rank % self.stage_size
        return local // self.tp, local % self.tp

    def stage(self, rank: int) -> int:
        """rank -> its pipeline stage."""
        self.coords(rank)
        return rank // self.stage_size

    def rank(self, dp_idx: int, tp_idx: int, stage: int = 0) -> int:
        if not (0 <= dp_idx < self.dp and 0 <= tp_idx < self.tp and 0 <= stage < self.pp):
            raise LayoutError(f"(dp_idx, tp_idx, stage) = ({dp_idx}, {tp_idx}, {stage}) is outside dp={self.dp}, "
                              f"tp={self.tp}, pp={self.pp}")
        return stage * self.stage_size + dp_idx * self.tp + tp_idx

    def tp_group(self, rank: int) -> List[int]:
        """The ranks that together hold one full copy of rank's stage of the weights."""
        dp_idx, _ = self.coords(rank)
        return [self.rank(dp_idx, t, self.stage(rank)) for t in range(self.tp)]

    def dp_group(self, rank: int) -> List[int]:
        """The ranks holding the same tensor-parallel piece of the same stage as rank."""
        _, tp_idx = self.coords(rank)
        return [self.rank(d, tp_idx, self.stage(rank)) for d in range(self.dp)]

    def pp_group(self, rank: int) -> List[int]:
        """The ranks at rank's (dp, tp) coordinates in every stage, in stage order: the chain an
        activation travels."""
        dp_idx, tp_idx = self.coords(rank)
        return [self.rank(dp_idx, tp_idx, s) for s in range(self.pp)]

    def replica_group(self, rank: int) -> List[int]:
        """The ranks of rank's data-parallel replica: every stage and tensor-parallel piece, which
        together hold each weight exactly once (stage-major, then tp order)."""
        dp_idx, _ = self.coords(rank)
        return [self.rank(dp_idx, t, s) for s in range(self.pp) for t in range(self.tp)]

    # ------------------------------------------------------------------ pipeline stages

    def stage_layers(self, stage: int, num_layers: int) -> range:
        """The decoder layers of a pipeline stage."""
        if not 0 <= stage < self.pp:
            raise LayoutError(f"stage {stage} is outside pipeline_stage = {self.pp}")
        if num_layers < self.pp:
            raise LayoutError(f"pipeline_stage = {self.pp} is more than the {num_layers} decoder layers")
        runs = np.array_split(np.arange(num_layers), self.pp)[stage]
        return range(int(runs[0]), int(runs[-1]) + 1)

    def param_stage(self, name: str, num_layers: int) -> int:
        """The pipeline stage holding a parameter (or its optimizer moments)."""
        base = _strip_optimizer_prefix(name)
        m = re.match(r"model\.layers\.(\d+)\.", base)
        if m:
            layer = int(m.group(1))
            return next(s for s in range(self.pp) if layer in self.stage_layers(s, num_layers))
        if base.startswith("model.tok_embeddings."):
            return 0
        return self.pp - 1  # final norm, lm_head

    def stage_names(self, names: Sequence[str], stage: int, num_layers: int) -> List[str]:
        """The names among `names` held by a pipeline stage, in their order."""
        return [n for n in names if self.param_stage(n, num_layers) == stage]

    # ------------------------------------------------------------------ parameters

    @staticmethod
    def param_split(name: str) -> Optional[int]:
        """The dim a parameter is split on (0 column-parallel, 1 row-parallel), or None if replicated."""
        base = _strip_optimizer_prefix(name)
        for pattern, dim in _RULES:
            if pattern.match(base):
                return dim
        raise LayoutError(f"parameter {name!r} has no tensor-parallel rule (see SPLIT_RULES in {__name__})")

    def shard_shape(self, name: str, shape: Sequence[int]) -> Tuple[int, ...]:
        dim = self.param_split(name)
        shape = tuple(int(s) for s in shape)
        if dim is None:
            return shape
        if dim >= len(shape) or shape[dim] % self.tp:
            raise LayoutError(f"parameter {name!r} of shape {list(shape)}: dim {dim} cannot be split "
                              f"into model_parallel = {self.tp} equal pieces")
        return shape[:dim] + (shape[dim] // self.tp,) + shape[dim + 1:]

    def opt_shard_parts(self, name: str, shape: Sequence[int]) -> int:
        """Pieces of dim 0 that a parameter's AdamW moments are split into under optimizer sharding
        (ZeRO-1, `mindgrpo.grpo.optim.AdamW`): dp when dim 0 of this rank's piece divides by dp,
        else 1. A parameter that tp does not split stays whole when tp > 1: MindSpore's strategy
        format would put its optimizer pieces on the tp axis, which the dp group does not span."""
        piece = self.shard_shape(name, shape)
        split = self.tp == 1 or self.param_split(name) is not None
        return self.dp if split and self.dp > 1 and len(piece) > 0 and piece[0] % self.dp == 0 else 1

    def shard(self, name: str, full: np.ndarray, tp_idx: int) -> np.ndarray:
        """Piece tp_idx of a full parameter (a view when the split is on dim 0)."""
        if not 0 <= tp_idx < self.tp:
            raise LayoutError(f"tp_idx {tp_idx} is outside model_parallel = {self.tp}")
        local = self.shard_shape(name, full.shape)
        dim = self.param_split(name)
        if dim is None:
            return full
        n = local[dim]
        index = (slice(None),) * dim + (slice(tp_idx * n, (tp_idx + 1) * n),)
        return full[index]

    def merge(self, name: str, shards: Sequence[np.ndarray]) -> np.ndarray:
        """Inverse of shard: shards in tp order -> the full parameter."""
        if len(shards) != self.tp:
            raise LayoutError(f"parameter {name!r}: got {len(shards)} shards for model_parallel = {self.tp}")
        dim = self.param_split(name)
        if dim is None:
            return shards[0]
        shapes = {tuple(s.shape) for s in shards}
        if len(shapes) != 1:
            raise LayoutError(f"parameter {name!r}: shards have different shapes {sorted(shapes)}")
        return np.concatenate(shards, axis=dim)

    def check_divisible(self, cfg: Qwen2Config) -> None:
        """Raise LayoutError naming the first head count or parameter that tp does not divide,
        or the model setting that pipeline stages cannot serve."""
        for key in ("num_attention_heads", "num_key_value_heads"):
            if getattr(cfg, key) % self.tp:
                raise LayoutError(f"model_parallel = {self.tp} must divide {key} = {getattr(cfg, key)}")
        for name, shape in expected_shapes(cfg).items():
            self.shard_shape(name, shape)
        if self.pp > 1:
            if cfg.num_hidden_layers < self.pp:
                raise LayoutError(f"pipeline_stage = {self.pp} is more than num_hidden_layers = "
                                  f"{cfg.num_hidden_layers}")
            if cfg.tie_word_embeddings:
                raise LayoutError(f"pipeline_stage = {self.pp} needs tie_word_embeddings = false: the first stage "
                                  "holds the embedding and the last the lm_head")


def num_layers_of(names: Sequence[str]) -> int:
    """Decoder layers of a model, from its parameter names (optimizer moments included)."""
    ids = [int(m.group(1)) for n in names for m in [re.match(r"model\.layers\.(\d+)\.", _strip_optimizer_prefix(n))]
           if m]
    return max(ids) + 1 if ids else 0


def _strip_optimizer_prefix(name: str) -> str:
    for prefix in OPTIMIZER_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def reward_model_layout(world: int, model_parallel: int) -> ParallelLayout:
    """A reward model split over `model_parallel` ranks (reward_config.reward_models[i].model_parallel), the world's
    other ranks its data-parallel replicas (`parallel/replica_scores.py`)."""
    if model_parallel < 1 or world % model_parallel:
        raise LayoutError(f"reward_config.reward_models: model_parallel {model_parallel} does not divide the world of "
                          f"{world} ranks")
    return ParallelLayout(dp=world // model_parallel, tp=model_parallel)
