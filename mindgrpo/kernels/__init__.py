"""CPU kernels of our own for MindSpore's CPU backend: fp32 matmuls over OpenBLAS's sgemm
(`ops.Custom` "aot" kernels), switched by MINDGRPO_CPU_KERNELS; MindSpore's own ops elsewhere.

`build.py` compiles `sgemm.cc` against the scipy-openblas32 wheel (scripts/setup_env.sh runs it);
`matmul.py` loads the library and gives a drop-in for `ops.MatMul` with its backward. The model does not use it
yet: on a 2-core AMD EPYC with AVX2 it ran 1.0-1.6x MindSpore's MatMul, not the clear margin that would justify
it there (DEVELOPERS.md, "Which kernel a MatMul runs"; `python -m benchmarks.matmul_peak`)."""
