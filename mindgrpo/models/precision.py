"""Mixed precision, declared once: what runs in the compute dtype and what stays fp32.

`actor_config.dtype` (the model config's `compute_dtype`) is the dtype of the model's matmuls: bfloat16 on
Ascend, float16 on CPU (the half precision MindSpore's CPU kernels have), float32 for neither. The parameters
are fp32 master weights whatever it is; each matmul casts its weight and input to the compute dtype. These
islands stay fp32, and `tests/test_primitive_audit.py` checks them in the compiled graphs of a one-step
float16 run (from their IR: every node of an island's primitives takes fp32 inputs only, every matmul of the
model takes the compute dtype, the optimiser's graphs hold no half-precision tensor at all):

| island | what | where |
|---|---|---|
| norm | RMSNorm's mean of squares and rsqrt (its weight multiplies in fp32, then casts back) | models/qwen2.py RMSNorm.normalize |
| softmax | attention scores after q.k^T, the additive mask, the softmax | models/qwen2.py Attention._attend, inference/graphs.py |
| logprobs | the LM head's logits and everything after them: log-softmax, the labels' log-probs, entropy, sampling | models/qwen2.py head, models/fused_head.py, inference/layers.py |
| loss | the policy loss, KL, the importance corrections, every masked mean and metric | grpo/ms_objective.py, grpo/ms_algos.py |
| optimizer | master weights, gradients as AdamW reads them, its moments, the global gradient norm | grpo/optim.py |

`FP32_PRIMITIVES` names, per island, the MindSpore primitives that compute it (those the test can find by name:
the loss's element-wise arithmetic shares its primitives with the model's and is checked by its graph scope,
`LOSS_SCOPE`, instead).
"""

from __future__ import annotations

from typing import Dict, Tuple

COMPUTE_DTYPES = ("float32", "bfloat16", "float16")  # `compute_dtype` / actor_config.dtype names
HALF_PRIMITIVES = ("MatMul", "BatchMatMul")  # the model's projections and attention products: the compute dtype
FP32_PRIMITIVES: Dict[str, Tuple[str, ...]] = {
    "norm": ("ReduceMean", "Rsqrt", "RsqrtGrad"),
    "softmax": ("Softmax", "SoftmaxBackward"),
    "logprobs": ("MatMulExt", "Log", "GatherD", "CumSum"),  # MatMulExt: the row sums of the fused log-softmax
    "loss": ("Exp",),  # the importance ratios exp(logp - old_logp)
    "optimizer": ("AdamWeightDecay", "Sqrt"),
}
FP32_GRAPHS = ("GradNorm", "AdamW")  # graphs (cells of grpo/optim.py) with no half-precision tensor at all
LOSS_SCOPE = "policy_loss"  # the training graph's loss cell; its nodes outside the model (`scorer`) are fp32


def half_precision(compute_dtype: str) -> bool:
    """Whether the matmuls run below fp32 (the islands above then matter)."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {list(COMPUTE_DTYPES)}, got {compute_dtype!r}")
    return compute_dtype != "float32"
