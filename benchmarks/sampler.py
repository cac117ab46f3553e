"""The sampler's whole-vocabulary draw: MindSpore's fused softmax against exp(logits - max) in separate ops.

    python -m benchmarks.sampler            # batch 16, vocabularies 151936 and 4096

`mindgrpo.inference.sampling.Sampler.draw` scales its threshold by the row's total, so it would not
need normalised weights; this measures whether dropping the normalisation pays in MindSpore's CPU graph
mode (it does not: the fused softmax kernel makes one cache-friendly pass per row). Both variants run the
same `draw`; medians of 5 rounds of 50 calls, alternating. Writes benchmarks/results/sampler.md.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from benchmarks.harness import RESULTS, alternate, command, machine, write_text


def main() -> int:
    import mindspore as ms
    from mindspore import Tensor, ops

    from mindgrpo.inference.sampling import Sampler, SamplingParams

    ms.set_context(mode=ms.GRAPH_MODE)

    class Softmax(Sampler):
        def construct(self, logits, u):
            return self.draw(ops.softmax(logits, -1), u)

    class ExpMinusMax(Sampler):
        def construct(self, logits, u):
            return self.draw(ops.exp(logits - logits.max(axis=-1, keepdims=True)), u)

    params = SamplingParams(max_tokens=8, temperature=1.0, top_k=0, top_p=1.0)
    rng = np.random.default_rng(0)
    rows = []
    for vocab in (151936, 4096):
        x = Tensor(rng.standard_normal((16, vocab)).astype(np.float32))
        u = Tensor(rng.random(16).astype(np.float32))
        cells = {"softmax": Softmax(params, vocab), "exp(logits - max)": ExpMinusMax(params, vocab)}
        for cell in cells.values():
            cell(x, u).asnumpy()  # compile
        def fifty(cell):
            for _ in range(50):
                cell(x, u).asnumpy()

        times = alternate({name: (lambda cell=cell: fifty(cell)) for name, cell in cells.items()}, 5)
        med = {k: float(np.median(v)) / 50 * 1e3 for k, v in times.items()}
        rows.append((vocab, med["softmax"], med["exp(logits - max)"]))
        print(f"vocab {vocab}: softmax {med['softmax']:.2f} ms, exp(logits - max) {med['exp(logits - max)']:.2f} ms")
    lines = ["# Whole-vocabulary draw: fused softmax against exp(logits - max)", "",
             f"    {command('benchmarks.sampler', [])}", "",
             f"Date {time.strftime('%Y-%m-%d')}, batch 16, fp32, MindSpore graph mode on CPU "
             f"({machine()}); ms per draw, medians of 5 x 50 calls.", "",
             "| vocabulary | softmax + draw | exp(logits - max) + draw |", "|---|---|---|"]
    lines += [f"| {v} | {a:.2f} | {b:.2f} |" for v, a, b in rows]
    write_text(os.path.join(RESULTS, "sampler.md"), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
