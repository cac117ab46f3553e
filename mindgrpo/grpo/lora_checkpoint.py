"""LoRA's part of a training checkpoint (actor_config.lora_rank > 0):

    adapter.ckpt, optimizer.ckpt   the adapters and their AdamW moments (the groups the trainer saves)
    state.json: lora_base          {"path": the base weights, "sha256": of their values}: the base is referred
                                   to, not copied
    adapter/                       the adapters in PEFT's layout (`models/lora_files.py`), listed in the manifest:
                                   PeftModel.from_pretrained(hf_base, step_dir/adapter) loads them

The base is the file the policy was loaded from (--sft_path_train, actor_config.load_checkpoint), or, when the
run changed it (the SFT warm start) or drew it at random, a file written once beside the checkpoints,
`<checkpoints>/lora_base/<sha256[:16]>.ckpt`. Resuming loads the base from `path` and refuses one whose values
hash otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List, Optional

import numpy as np
import mindspore as ms

from mindgrpo.models.checkpoint import read_model_state
from mindgrpo.models.lora import adapter_state, lora_spec
from mindgrpo.models.lora_files import write_adapter
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.parallel.checkpoint_folders import CheckpointError
from mindgrpo.parallel.checkpoints import save_params

ADAPTER_DIR = "adapter"


def base_parameters(lm: Qwen2ForCausalLM) -> List[ms.Parameter]:
    """The model's weights without its adapters and their scalings."""
    return [p for p in lm.get_parameters() if ".lora_" not in p.name]


def fingerprint(params: List[ms.Parameter]) -> str:
    """sha256 of the parameters' names, shapes and fp32 values, in name order."""
    h = hashlib.sha256()
    for p in sorted(params, key=lambda q: q.name):
        v = p.astype(ms.float32).asnumpy() if p.dtype != ms.float32 else p.asnumpy()
        h.update(f"{p.name}{tuple(v.shape)}".encode())
        h.update(np.ascontiguousarray(v).tobytes())
    return h.hexdigest()


class LoraCheckpoint:
    """root: the run's checkpoint folder; base_path: where the policy's base was loaded from (None: drawn at
    random). `base_changed()` after the run changes the base (the warm start)."""

    def __init__(self, policy: Qwen2ForCausalLM, root: str, base_path: Optional[str]):
        self.policy, self.root = policy, root
        self.base_path = os.path.abspath(base_path) if base_path else None
        self.sha: Optional[str] = None  # of the base, once computed (the base does not train)

    def base_changed(self) -> None:
        self.base_path, self.sha = None, None

    def state(self) -> Dict[str, str]:
        """state.json's lora_base; writes the base file first when there is no file of it."""
        base = base_parameters(self.policy)
        if self.sha is None:
            self.sha = fingerprint(base)
        if self.base_path is None:
            path = os.path.join(self.root, "lora_base", self.sha[:16] + ".ckpt")
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = path[:-len(".ckpt")] + f".{os.getpid()}.tmp.ckpt"  # save_checkpoint wants the suffix
                save_params(base, tmp)
                os.replace(tmp, path)
                config = os.path.join(os.path.dirname(path), "config.json")  # so the file loads on its own
                with open(config + ".tmp", "w") as f:
                    json.dump(self.policy.config.to_hf_dict(), f, indent=2)
                os.replace(config + ".tmp", config)
            self.base_path = path
        return {"path": self.base_path, "sha256": self.sha}

    def write_adapter(self, folder: str) -> List[str]:
        """The adapters in PEFT's layout into folder/adapter; their paths relative to folder (the manifest's)."""
        out = write_adapter(os.path.join(folder, ADAPTER_DIR), lora_spec(self.policy), adapter_state(self.policy),
                            base_model=self.base_path)
        return [os.path.relpath(os.path.join(out, f), folder) for f in sorted(os.listdir(out))]

    def restore(self, saved: Dict[str, str], checkpoint: str) -> None:
        """Load the base that `saved` (a checkpoint's lora_base) names into the policy, and check its values."""
        path = saved["path"]
        if not os.path.exists(path):
            raise CheckpointError(f"checkpoint {checkpoint}: its LoRA base {path} does not exist (state.json lora_base)")
        base = base_parameters(self.policy)
        state = read_model_state(path, self.policy.config)  # an HF directory or a .ckpt, checked whole
        for p in base:
            p.set_data(ms.Tensor(np.ascontiguousarray(state[p.name], np.float32)).astype(p.dtype))
        sha = fingerprint(base)
        if sha != saved["sha256"]:
            raise CheckpointError(f"checkpoint {checkpoint}: the LoRA base {path} has changed since it was saved "
                                  f"(sha256 {sha[:16]}, state.json lora_base says {saved['sha256'][:16]})")
        self.base_path, self.sha = os.path.abspath(path), sha
