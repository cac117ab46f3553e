"""benchmarks.harness.cpu_model: the name a results file gives the machine, from /proc/cpuinfo's first processor."""

from benchmarks.harness import cpu_model

ZEN2 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 fma avx f16c avx2

processor\t: 1
cpu family\t: 25
model\t\t: 17
model name\t: another CPU
flags\t\t: avx2 avx512f
"""
XEON = """processor\t: 0
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""


def test_the_first_processors_name_family_model_and_widest_vector_extension(tmp_path):
    (tmp_path / "zen2").write_text(ZEN2)
    (tmp_path / "xeon").write_text(XEON)
    (tmp_path / "bare").write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: sse sse2\n")
    assert cpu_model(str(tmp_path / "zen2")) == "AMD EPYC (family 23, model 49; AVX2)"
    assert cpu_model(str(tmp_path / "xeon")) == "Intel(R) Xeon(R) Processor (family 6, model 207; AVX-512 + AMX)"
    assert cpu_model(str(tmp_path / "bare")) == "Some CPU"
