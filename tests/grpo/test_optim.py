"""AdamW (+ accumulation, clipping, no decay on biases/norms) against torch.optim.AdamW."""

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor

from mindgrpo.grpo.optim import AccumulateGrads, AdamW, GradBuffer, adam_scalars, lr_at, no_decay

SHAPES = {"layers.0.attention.wq.weight": (6, 4), "layers.0.attention.wq.bias": (6,),
          "layers.0.attention_norm.weight": (4,), "lm_head.weight": (5, 4)}


def torch_adamw(init, weight_decay, betas):
    """torch.optim.AdamW over copies of `init` (name -> array), no decay on biases and norms, lr 1e-2."""
    import torch

    tparams = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in init.items()}
    groups = [{"params": [p for k, p in tparams.items() if not no_decay(k)], "weight_decay": weight_decay},
              {"params": [p for k, p in tparams.items() if no_decay(k)], "weight_decay": 0.0}]
    return tparams, torch.optim.AdamW(groups, lr=1e-2, betas=betas, eps=1e-8)


@pytest.mark.parametrize("max_norm", [0.0, 0.5])
def test_adamw_matches_torch(max_norm):
    import torch

    rng = np.random.default_rng(0)
    init = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
    params = [Parameter(Tensor(v.copy()), name=k) for k, v in init.items()]
    buf = GradBuffer(params)
    acc, opt = AccumulateGrads(buf), AdamW(params, buf, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)

    tparams, topt = torch_adamw(init, 0.1, (0.9, 0.95))
    for step in range(1, 4):
        lr = lr_at(step - 1, 1e-2, total_steps=3, warmup_steps=1, schedule="cosine", min_lr=1e-3)
        micro = [{k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(2)]
        for g in micro:
            acc(tuple(Tensor(g[k]) for k in SHAPES))
        bc1, bc2 = adam_scalars(step, 0.9, 0.95)
        norm = opt(Tensor(np.float32(lr)), bc1, bc2, Tensor(np.float32(max_norm)), None).asnumpy()

        for k, p in tparams.items():
            p.grad = torch.tensor(micro[0][k] + micro[1][k])
        ref_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in tparams.values())).item()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(list(tparams.values()), max_norm)
        for group in topt.param_groups:
            group["lr"] = lr
        topt.step()
        assert abs(float(norm) - ref_norm) <= 1e-5 * ref_norm
        for p in params:
            np.testing.assert_allclose(p.asnumpy(), tparams[p.name].detach().numpy(), rtol=0, atol=2e-6)
        assert all(not b.asnumpy().any() for b in buf.bufs)  # zeroed after the step


def test_no_decay_names():
    assert no_decay("model.layers.3.attention.wq.bias")
    assert no_decay("model.layers.3.attention_norm.weight") and no_decay("model.norm_out.weight")
    assert not no_decay("model.layers.3.attention.wq.weight") and not no_decay("lm_head.weight")
    assert not no_decay("model.tok_embeddings.embedding_weight")


def test_lr_schedule_hand_values():
    assert lr_at(0, 1.0, 10, warmup_steps=4) == 0.25
    assert lr_at(3, 1.0, 10, warmup_steps=4) == 1.0
    assert lr_at(4, 1.0, 10, warmup_steps=4, schedule="cosine") == 1.0
    assert abs(lr_at(7, 1.0, 10, warmup_steps=4, schedule="cosine") - 0.5) < 1e-12  # half-way
    assert lr_at(10, 1.0, 10, warmup_steps=4, schedule="cosine", min_lr=0.1) == pytest.approx(0.1)
    with pytest.raises(KeyError, match="constant"):
        lr_at(0, 1.0, 10, schedule="nope")


@pytest.mark.slow  # its graphs loop over 400 parameters: ~60 s of compiling, the quick loop's longest test
def test_adamw_over_hundreds_of_parameters_matches_torch():
    """400 parameters: one loop over them in a graph passed MindSpore's call-depth limit (a 24-layer model's
    LoRA adapters did not compile); the step, the norm, accumulation and zeroing run in spans of them."""
    import torch

    from mindgrpo.utils.spans import SPAN

    n = 400
    assert n > 3 * SPAN
    rng = np.random.default_rng(1)
    names = [f"model.layers.{i // 4}.{['mlp.w1.weight', 'attention.wq.bias', 'ffn_norm.weight', 'x.lora_B'][i % 4]}"
             for i in range(n)]
    init = {k: rng.normal(size=(3, 2) if k.endswith("weight") else (3,)).astype(np.float32) for k in names}
    params = [Parameter(Tensor(v.copy()), name=k) for k, v in init.items()]
    buf = GradBuffer(params)
    acc, opt = AccumulateGrads(buf), AdamW(params, buf, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.05)
    tparams, topt = torch_adamw(init, 0.05, (0.9, 0.99))
    for step in (1, 2):
        grads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in init.items()}
        acc(tuple(Tensor(grads[k]) for k in names))
        ref_norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads.values())))
        assert abs(float(opt.grad_norm().asnumpy()) - ref_norm) <= 1e-5 * ref_norm
        bc1, bc2 = adam_scalars(step, 0.9, 0.99)
        opt(Tensor(np.float32(1e-2)), bc1, bc2, Tensor(np.float32(1.0)), None)
        for k, p in tparams.items():
            p.grad = torch.tensor(grads[k])
        torch.nn.utils.clip_grad_norm_(list(tparams.values()), 1.0)
        topt.step()
        for p in params:
            np.testing.assert_allclose(p.asnumpy(), tparams[p.name].detach().numpy(), rtol=0, atol=2e-6)
        assert all(not b.asnumpy().any() for b in buf.bufs)
    acc(tuple(Tensor(np.ones_like(init[k])) for k in names))
    opt.zero_grads()
    assert all(not b.asnumpy().any() for b in buf.bufs)
