"""Hugging Face <-> MindSpore weights for Qwen2 and Qwen3: the one name table, checks, and file I/O.

Our parameter names are MindFormers' Qwen2 names, so a checkpoint from a MindFormers or
mindrlhf run loads unchanged. Safetensors are read with our own small reader (memory-mapped,
and bf16 included, which numpy has no type for) and written atomically.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Dict, Iterable, Tuple

import numpy as np

from mindgrpo.models.config import HF_HEAD_DIM, Qwen2Config

# (HF name, MindSpore name); {i} is the layer index.
NAME_TABLE: Tuple[Tuple[str, str], ...] = (
    ("model.embed_tokens.weight", "model.tok_embeddings.embedding_weight"),
    ("model.layers.{i}.input_layernorm.weight", "model.layers.{i}.attention_norm.weight"),
    ("model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.attention.wq.weight"),
    ("model.layers.{i}.self_attn.q_proj.bias", "model.layers.{i}.attention.wq.bias"),
    ("model.layers.{i}.self_attn.k_proj.weight", "model.layers.{i}.attention.wk.weight"),
    ("model.layers.{i}.self_attn.k_proj.bias", "model.layers.{i}.attention.wk.bias"),
    ("model.layers.{i}.self_attn.v_proj.weight", "model.layers.{i}.attention.wv.weight"),
    ("model.layers.{i}.self_attn.v_proj.bias", "model.layers.{i}.attention.wv.bias"),
    ("model.layers.{i}.self_attn.o_proj.weight", "model.layers.{i}.attention.wo.weight"),
    ("model.layers.{i}.self_attn.q_norm.weight", "model.layers.{i}.attention.q_norm.weight"),  # Qwen3
    ("model.layers.{i}.self_attn.k_norm.weight", "model.layers.{i}.attention.k_norm.weight"),  # Qwen3
    ("model.layers.{i}.post_attention_layernorm.weight", "model.layers.{i}.ffn_norm.weight"),
    ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.feed_forward.w1.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "model.layers.{i}.feed_forward.w2.weight"),
    ("model.layers.{i}.mlp.up_proj.weight", "model.layers.{i}.feed_forward.w3.weight"),
    ("model.norm.weight", "model.norm_out.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("score.weight", "score.weight"),  # a reward model's scalar head (HF's *ForSequenceClassification, 1 label)
    ("score.0.weight", "score.0.weight"),  # Qwen2ForRewardModel's head: Linear(H, H), ReLU, Linear(H, 1)
    ("score.0.bias", "score.0.bias"),
    ("score.2.weight", "score.2.weight"),
    ("score.2.bias", "score.2.bias"),
)

# What sits on top of the decoder: the vocabulary projection (a causal LM), or a reward model's head of one
# output (`mindgrpo/models/reward_model.py`), which replaces the lm_head whatever the config's tie_word_embeddings
# says (HF's reward models hold none): "score" a linear one (HF's *ForSequenceClassification), "score_mlp"
# Qwen2ForRewardModel's (Qwen2.5-Math-RM: Linear(H, H) with bias, ReLU, Linear(H, 1) with bias)
HEADS = ("lm_head", "score", "score_mlp")
REWARD_HEADS = ("score", "score_mlp")


def _compile(idx: int):
    out = []
    for hf, ms_ in NAME_TABLE:
        pat = re.escape(hf if idx == 0 else ms_).replace(r"\{i\}", r"(\d+)")
        out.append((re.compile(pat + "$"), ms_ if idx == 0 else hf))
    return out


_HF_TO_MS, _MS_TO_HF = _compile(0), _compile(1)


def _map(name: str, table) -> str:
    for pat, target in table:
        m = pat.match(name)
        if m:
            return target.replace("{i}", m.group(1)) if m.groups() else target
    raise KeyError(name)


def hf_to_ms_name(name: str) -> str:
    return _map(name, _HF_TO_MS)


def ms_to_hf_name(name: str) -> str:
    return _map(name, _MS_TO_HF)


def expected_shapes(cfg: Qwen2Config, head: str = "lm_head") -> Dict[str, Tuple[int, ...]]:
    """MindSpore name -> shape for every parameter of a Qwen2ForCausalLM (head "lm_head") or of a
    reward model (head "score", `HEADS`) with this config."""
    if head not in HEADS:
        raise ValueError(f"unknown model head {head!r}; valid: {', '.join(HEADS)}")
    h, i, v, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.d
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    per_layer = {"attention_norm.weight": (h,), "attention.wq.weight": (q, h), "attention.wk.weight": (kv, h),
                 "attention.wv.weight": (kv, h), "attention.wo.weight": (h, q), "ffn_norm.weight": (h,),
                 "feed_forward.w1.weight": (i, h), "feed_forward.w2.weight": (h, i), "feed_forward.w3.weight": (i, h)}
    if cfg.attention_bias:
        per_layer.update({"attention.wq.bias": (q,), "attention.wk.bias": (kv,), "attention.wv.bias": (kv,)})
    if cfg.qk_norm:
        per_layer.update({"attention.q_norm.weight": (d,), "attention.k_norm.weight": (d,)})
    shapes = {"model.tok_embeddings.embedding_weight": (v, h), "model.norm_out.weight": (h,)}
    for n in range(cfg.num_hidden_layers):
        shapes.update({f"model.layers.{n}.{k}": s for k, s in per_layer.items()})
    if head == "score":
        shapes["score.weight"] = (1, h)
    elif head == "score_mlp":
        shapes.update({"score.0.weight": (h, h), "score.0.bias": (h,), "score.2.weight": (1, h), "score.2.bias": (1,)})
    elif not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def head_of(names) -> str:
    """The head a state's tensor names hold: "score" or "score_mlp" when a reward model's, else "lm_head"."""
    if "score.0.weight" in names:
        return "score_mlp"
    return "score" if "score.weight" in names else "lm_head"


class WeightError(ValueError):
    """A checkpoint does not match the model: names the tensor."""


HEAD_DIM_SHAPED = ("attention.wq.", "attention.wk.", "attention.wv.", "attention.wo.", "attention.q_norm.",
                   "attention.k_norm.")  # the tensors whose shapes hold head_dim


def head_dim_hint(cfg: Qwen2Config) -> str:
    """Where the config's head_dim comes from, for a mis-shaped attention tensor."""
    if cfg.model_type in HF_HEAD_DIM:
        return f"head_dim {cfg.d}; HF's Qwen3 takes {HF_HEAD_DIM[cfg.model_type]} when config.json has none"
    return f"head_dim {cfg.d}: config.json's, else hidden_size / num_attention_heads"


def check_state(state: Dict[str, np.ndarray], cfg: Qwen2Config, source: str, head: str = "lm_head",
                hf_names: bool = False) -> Dict[str, np.ndarray]:
    """Validate a MindSpore-named state against the config and head (`HEADS`); returns it without a redundant
    tied lm_head. Raises WeightError naming the first missing, unexpected or mis-shaped tensor (by its HF name
    when `hf_names`: the state was read from an HF folder)."""
    def shown(name: str) -> str:
        return ms_to_hf_name(name) if hf_names else name

    want = expected_shapes(cfg, head)
    state = dict(state)
    if cfg.tie_word_embeddings and head == "lm_head" and "lm_head.weight" in state:
        head, emb = state.pop("lm_head.weight"), state.get("model.tok_embeddings.embedding_weight")
        if emb is not None and not np.array_equal(np.asarray(head), np.asarray(emb)):
            raise WeightError(f"{source}: lm_head.weight differs from the embedding but "
                              "tie_word_embeddings is true")
    for name in sorted(state):
        if name not in want:
            what = " (a reward model's head: load it as a reward model)" if name.startswith("score.") else ""
            raise WeightError(f"{source}: unexpected tensor {shown(name)!r} for this config{what}")
    for name, shape in want.items():
        if name not in state:
            raise WeightError(f"{source}: missing tensor {shown(name)!r} (expected shape {list(shape)})")
        got = tuple(state[name].shape)
        if got != shape:
            hint = f" ({head_dim_hint(cfg)})" if any(k in name for k in HEAD_DIM_SHAPED) else ""
            raise WeightError(f"{source}: tensor {shown(name)!r} has shape {list(got)}, expected {list(shape)}{hint}")
    return state


# ---------------------------------------------------------------- safetensors I/O

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
              "BF16": np.uint16}  # bf16 is read as its raw 16 bits; see bf16_to_f32


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does; returns the raw 16 bits (uint16)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = u + (0x7FFF + ((u >> 16) & 1))
    nan = np.isnan(x)
    out = (rounded >> 16).astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def _naturals(value) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and i >= 0 for i in value)


def _check_entry(path: str, name: str, info, data_bytes: int) -> None:
    """Raise WeightError unless one header entry describes a tensor inside the file's data."""
    if not (isinstance(info, dict) and isinstance(info.get("dtype"), str) and _naturals(info.get("shape"))
            and _naturals(info.get("data_offsets")) and len(info["data_offsets"]) == 2):
        raise WeightError(f"{path}: not a safetensors file (header entry {name!r} lacks dtype, shape or data_offsets)")
    if info["dtype"] not in _ST_DTYPES:
        raise WeightError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
    start, end = info["data_offsets"]
    if end > data_bytes:
        raise WeightError(f"{path}: truncated: tensor {name!r} ends at data byte {end}, the file holds {data_bytes}")
    need = int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(_ST_DTYPES[info["dtype"]]).itemsize
    if end - start != need:
        raise WeightError(f"{path}: tensor {name!r} of shape {info['shape']} {info['dtype']} needs {need} bytes, "
                          f"its data_offsets [{start}, {end}] give {end - start}")


def read_safetensors(path: str) -> Dict[str, Tuple[str, np.ndarray]]:
    """name -> (safetensors dtype string, array); BF16 arrays come as uint16 bits. Memory-mapped.

    The header (8-byte length, then JSON) is checked against the file's size before anything is read, so a
    file that is not safetensors, or is truncated, is a WeightError naming it."""
    size = os.path.getsize(path)
    if size < 8:
        raise WeightError(f"{path}: not a safetensors file ({size} bytes, shorter than its 8-byte header length)")
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        if header_len > size - 8:
            raise WeightError(f"{path}: not a safetensors file (its first 8 bytes give a header of {header_len} "
                              f"bytes, the file has {size})")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:  # not JSON, or not UTF-8
            raise WeightError(f"{path}: not a safetensors file (header: {e})") from None
    if not isinstance(header, dict):
        raise WeightError(f"{path}: not a safetensors file (header is not a JSON object)")
    data_bytes = size - 8 - header_len
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    for name, info in tensors.items():
        _check_entry(path, name, info, data_bytes)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len) if data_bytes else np.zeros(0, np.uint8)
    out = {}
    for name, info in tensors.items():
        start, end = info["data_offsets"]
        out[name] = (info["dtype"], data[start:end].view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"]))
    return out


def write_safetensors(path: str, tensors: Dict[str, Tuple[str, np.ndarray]], metadata=None) -> None:
    """tensors: name -> (dtype string, array with that dtype's bits). Atomic (temp file + rename)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for raw in blobs:
                f.write(raw)


class atomic_path:
    """`with atomic_path(final) as tmp:` write to tmp; renamed to final only if the block succeeds."""

    def __init__(self, final: str):
        self.final = final

    def __enter__(self) -> str:
        folder = os.path.dirname(os.path.abspath(self.final))
        os.makedirs(folder, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix="." + os.path.basename(self.final) + ".", dir=folder)
        os.close(fd)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            os.replace(self.tmp, self.final)
        elif os.path.exists(self.tmp):
            os.remove(self.tmp)
        return False


def is_hf_model_file(name: str) -> bool:
    """A file of an HF model folder that holds or describes its weights: config.json, safetensors shards and
    their index, PyTorch weights and their index. A conversion into the folder replaces these as a whole and
    keeps the rest (tokenizer, generation_config.json, README, ...)."""
    return (name == "config.json" or name.endswith((".safetensors", ".safetensors.index.json"))
            or (name.startswith("pytorch_model") and name.endswith((".bin", ".bin.index.json"))))


def hf_files(hf_dir: str) -> Iterable[str]:
    """The safetensors files of an HF model directory (sharded via index.json, or single)."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(f for f in os.listdir(hf_dir) if f.endswith(".safetensors"))
    if not files:
        raise WeightError(f"{hf_dir}: no .safetensors files")
    return [os.path.join(hf_dir, f) for f in files]


def read_hf_state(hf_dir: str) -> Dict[str, Tuple[str, np.ndarray]]:
    """HF-named tensors of a model directory: name -> (dtype string, array)."""
    state = {}
    for path in hf_files(hf_dir):
        for name, item in read_safetensors(path).items():
            if name in state:
                raise WeightError(f"{path}: tensor {name!r} appears in two files")
            state[name] = item
    return state


def hf_to_ms_state(hf_state: Dict[str, Tuple[str, np.ndarray]], source: str) -> Dict[str, Tuple[str, np.ndarray]]:
    out = {}
    for name, item in hf_state.items():
        if name.endswith("rotary_emb.inv_freq"):  # a recomputed buffer some exporters keep
            continue
        try:
            out[hf_to_ms_name(name)] = item
        except KeyError:
            raise WeightError(f"{source}: unexpected tensor {name!r} (not a Qwen2/Qwen3 weight)") from None
    return out


def to_float32(item: Tuple[str, np.ndarray]) -> np.ndarray:
    dtype, arr = item
    return bf16_to_f32(arr) if dtype == "BF16" else np.asarray(arr, np.float32)


def load_hf_model_state(hf_dir: str, cfg: Qwen2Config, head: str = "lm_head") -> Dict[str, np.ndarray]:
    """HF directory -> checked MindSpore-named fp32 arrays."""
    state = hf_to_ms_state(read_hf_state(hf_dir), hf_dir)
    if head in REWARD_HEADS and head_of(state) in REWARD_HEADS:
        head = head_of(state)
    return check_state({k: to_float32(v) for k, v in state.items()}, cfg, hf_dir, head, hf_names=True)
