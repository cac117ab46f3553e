"""CPU kernels of our own for MindSpore's CPU backend: fp32 matmuls over OpenBLAS's sgemm
(`ops.Custom` "aot" kernels), switched by MINDGRPO_CPU_KERNELS; MindSpore's own ops elsewhere.

`build.py` compiles `sgemm.cc` against the scipy-openblas32 wheel (scripts/setup_env.sh runs it);
`matmul.py` loads the library and gives a drop-in for `ops.MatMul` with its backward. The model does not use it
yet: on 2 AMD EPYC AVX2 cores it ran 0.8-1.7x MindSpore's MatMul (on a par one thread each), not a clear margin
(DEVELOPERS.md, "A matmul of our own"; `python -m benchmarks.matmul_peak`)."""
