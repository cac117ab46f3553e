"""Shared set-up for the benchmarks: the two tiny configs and HF <-> ours with identical weights."""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

CONFIGS = {
    # hidden 256, 4 layers, 4 heads, 2 kv heads, tied; Qwen2.5's vocabulary or a small one
    "tiny-qwen-vocab": dict(vocab_size=151936, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "tiny-small-vocab": dict(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"


def hf_model(name: str, seed: int = 0, overrides: dict = None):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**(overrides or CONFIGS[name]), rope_theta=1000000.0, rms_norm_eps=1e-6,
                      max_position_embeddings=4096)
    return Qwen2ForCausalLM(cfg).eval()


def ours_from_hf(hf):
    """Our model with the HF model's weights (through the converter's name table)."""
    from mindgrpo.models.checkpoint import load_state
    from mindgrpo.models.convert import check_state, hf_to_ms_name
    from mindgrpo.models.qwen2 import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config.from_hf_dict(hf.config.to_dict())
    lm = Qwen2ForCausalLM(cfg)
    state = {hf_to_ms_name(k): v.detach().numpy() for k, v in hf.state_dict().items()}
    load_state(lm, check_state(state, cfg, "hf"))
    return lm


def timed(fn, repeats: int = 3):
    """Median seconds of `repeats` calls (after the caller's warm-up) and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def run_stamp(script: str, argv=None) -> dict:
    """What a results file records about its run: the command that reproduces it (`script` is the
    benchmark's __file__, argv its arguments, sys.argv[1:] when None), the date, the machine and the
    load average."""
    args = sys.argv[1:] if argv is None else argv
    return {"command": f"python benchmarks/{os.path.basename(script)}" + "".join(f" {a}" for a in args),
            "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg())}


def write_results(json_path: str, res: dict, markdown: str) -> None:
    """res to json_path and markdown beside it (same name, .md), each through a temporary file and a
    rename, so an interrupted run leaves the previous results whole."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    for path, text in ((json_path, json.dumps(res, indent=1)), (os.path.splitext(json_path)[0] + ".md", markdown)):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
