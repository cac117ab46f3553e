"""CPU kernels of our own for MindSpore's CPU backend: fp32 matmuls over OpenBLAS's sgemm and the packed rows'
attention of forward-only scoring (`ops.Custom` "aot" kernels), switched by MINDGRPO_CPU_KERNELS; MindSpore's own
ops elsewhere.

`build.py` compiles `sgemm.cc` and `attention.cc` against the scipy-openblas32 wheel (scripts/setup_env.sh runs it);
`attention.py` gives the reward scorer's attention (`models/block_attention.py`) its kernel;
`matmul.py` loads the library and gives a drop-in for `ops.MatMul` with its backward, and `rows_matmul`, which
the model's projections (with their LoRA adapters), its vocabulary head, the fused head and the rollout engine's
fused products and head use: ours for products of at least `MIN_ROWS` token rows (prefill-sized: training,
scoring, the reference, the rollout's prefill), MindSpore's for fewer (decode). docs/cpu_kernels.md, "The threshold", has the tables behind it
(`python -m benchmarks.matmul_peak --rows`)."""
