"""LoRA's part of a training checkpoint (actor_config.lora_rank > 0), on one device and under msrun:

    lora.ckpt, optimizer.ckpt      the adapters and their AdamW moments (the groups the trainer saves; under msrun
                                   lora/rank_<k>/lora.ckpt and optimizer/rank_<k>/optimizer.ckpt: every rank its
                                   pieces, split as their projection, `parallel/layout.py` SPLIT_RULES)
    state.json: lora_base          {"path": the base weights, "sha256": of their values}: the base is referred
                                   to, not copied
    adapter/                       the adapters whole in PEFT's layout (`models/lora_files.py`), listed in the
                                   manifest: PeftModel.from_pretrained(hf_base, step_dir/adapter) loads them

The base is the file the policy was loaded from (--sft_path_train, actor_config.load_checkpoint), or, when the
run changed it (the SFT warm start) or drew it at random, a file written once beside the checkpoints,
`<checkpoints>/lora_base/<sha256[:16]>.ckpt` (the base whole, with its config.json). The sha256 is of the whole
base (names, full shapes, fp32 values in name order), so it does not depend on the layout: under msrun each
parameter's tensor-parallel pieces are made whole first and, with pipeline stages, brought from the stage that holds
it (`placement.whole`, one parameter at a time), and what is written once (the base file, the PEFT folder) rank 0
writes. Resuming loads (each rank its piece of) the base
from `path` and refuses one whose values hash otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms

from mindgrpo.models.ckpt_codec import write_ckpt
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.lora import adapter_parameters, adapter_shapes, lora_spec
from mindgrpo.models.lora_files import write_adapter
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.parallel.checkpoint_folders import CheckpointError
from mindgrpo.parallel.one_device import OneDevice
from mindgrpo.parallel.placement import Placement

ADAPTER_DIR = "adapter"  # PEFT's folder in a step folder
GROUP = "lora"  # the adapters' group of a checkpoint (lora.ckpt; under msrun lora/rank_<k>/lora.ckpt)


def base_parameters(lm: Qwen2ForCausalLM) -> List[ms.Parameter]:
    """The model's weights without its adapters and their scalings, in name order."""
    return sorted((p for p in lm.get_parameters() if ".lora_" not in p.name), key=lambda p: p.name)


def fingerprint(arrays: Iterable[Tuple[str, np.ndarray]]) -> str:
    """sha256 of (name, whole fp32 values) pairs, in the order given (name order): names, shapes and bytes."""
    h = hashlib.sha256()
    for _ in _hashed(arrays, h):
        pass
    return h.hexdigest()


def _hashed(arrays: Iterable[Tuple[str, np.ndarray]], h) -> Iterator[Tuple[str, str, np.ndarray]]:
    """The arrays as .ckpt entries, each added to the hash `h` on the way (`fingerprint`)."""
    for name, v in arrays:
        v = np.ascontiguousarray(v, np.float32)
        h.update(f"{name}{tuple(v.shape)}".encode())
        h.update(v.tobytes())
        yield name, "Float32", v


class LoraCheckpoint:
    """root: the run's checkpoint folder; base_path: where the policy's base was loaded from (None: drawn at
    random); placement: where the policy's pieces live (`parallel/placement.py`; OneDevice by default).
    `base_changed()` after the run changes the base (the warm start). Under msrun every rank calls every method
    together (they gather over the ranks)."""

    def __init__(self, policy: Qwen2ForCausalLM, root: str, base_path: Optional[str],
                 placement: Optional[Placement] = None):
        self.policy, self.root = policy, root
        self.placement = placement or OneDevice()
        self.base_path = os.path.abspath(base_path) if base_path else None
        self.sha: Optional[str] = None  # of the base, once computed (the base does not train)
        # the whole model's base and adapters (name -> full shape): a pipeline stage holds its layers' only
        self.base_shapes = dict(sorted(expected_shapes(policy.config).items()))
        self.adapter_shapes = adapter_shapes(policy)

    def _whole_base(self) -> Iterator[Tuple[str, np.ndarray]]:
        """(name, whole fp32 values) of the whole base, in name order (a collective under msrun)."""
        return self.placement.whole(base_parameters(self.policy), self.base_shapes)

    def base_changed(self) -> None:
        self.base_path, self.sha = None, None

    def groups(self, optimizer: Sequence[ms.Parameter]) -> Dict[str, list]:
        """A checkpoint's parameter groups: the adapters (this rank's pieces) and their AdamW moments."""
        return {GROUP: adapter_parameters(self.policy), "optimizer": list(optimizer)}

    def state(self) -> Dict[str, str]:
        """state.json's lora_base; writes the base file first when there is no file of it (rank 0)."""
        if self.sha is None and self.base_path is not None:
            self.sha = fingerprint(self._whole_base())
        if self.base_path is None:
            self.base_path = self._write_base()
        return {"path": self.base_path, "sha256": self.sha}

    def _write_base(self) -> str:
        """The base whole into <root>/lora_base/<sha256[:16]>.ckpt (rank 0; under msrun every rank gathers); its
        path. Written under a temporary name while it is hashed, then renamed, its config.json beside it."""
        h = hashlib.sha256()
        folder = os.path.join(self.root, "lora_base")
        tmp = os.path.join(folder, f".base.{os.getpid()}.tmp.ckpt")
        arrays = self._whole_base()
        if self.placement.writer:
            os.makedirs(folder, exist_ok=True)
            write_ckpt(tmp, _hashed(arrays, h))
            self.sha = h.hexdigest()
        else:
            self.sha = fingerprint(arrays)
        path = os.path.join(folder, self.sha[:16] + ".ckpt")
        if self.placement.writer:
            if os.path.exists(path):
                os.remove(tmp)
            else:
                os.replace(tmp, path)
            config = os.path.join(folder, "config.json")  # so the file loads on its own
            with open(config + ".tmp", "w") as f:
                json.dump(self.policy.config.to_hf_dict(), f, indent=2)
            os.replace(config + ".tmp", config)
        self.placement.barrier()  # every rank sees the file before a checkpoint names it
        return os.path.abspath(path)

    def write_adapter(self, folder: str) -> List[str]:
        """The adapters whole in PEFT's layout into folder/adapter (rank 0; under msrun every rank gathers); their
        paths relative to folder (the manifest's; none on the other ranks)."""
        state = dict(self.placement.whole(adapter_parameters(self.policy), self.adapter_shapes))
        if not self.placement.writer:
            return []
        out = write_adapter(os.path.join(folder, ADAPTER_DIR), lora_spec(self.policy), state,
                            base_model=self.base_path)
        return [os.path.relpath(os.path.join(out, f), folder) for f in sorted(os.listdir(out))]

    def restore(self, saved: Dict[str, str], checkpoint: str) -> None:
        """Load the base that `saved` (a checkpoint's lora_base) names into the policy (each rank its piece), and
        check its values."""
        path = saved["path"]
        if not os.path.exists(path):
            raise CheckpointError(f"checkpoint {checkpoint}: its LoRA base {path} does not exist (state.json lora_base)")
        base = base_parameters(self.policy)
        self.placement.load_weights("policy", self.policy, path, [p.name for p in base])
        sha = fingerprint(self._whole_base())
        if sha != saved["sha256"]:
            raise CheckpointError(f"checkpoint {checkpoint}: the LoRA base {path} has changed since it was saved "
                                  f"(sha256 {sha[:16]}, state.json lora_base says {saved['sha256'][:16]})")
        self.base_path, self.sha = os.path.abspath(path), sha
