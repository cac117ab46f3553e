"""LoRA adapters (mindgrpo/models/lora.py, lora_files.py) against PEFT on the same random HF Qwen2 and
Qwen3: the adapter PEFT makes and writes (its B set non-zero) loads into ours; logits, the adapters'
gradients of the GRPO loss (written here in torch), the merged weights (merge_and_unload); our adapter
written in PEFT's layout loads into PeftModel with the same logits; the model with its adapters off is
the base model bit for bit; only the adapters train (the updater's gradient buffers and AdamW moments)."""

import copy

import numpy as np
import pytest

import mindspore as ms

from hf_models import hf_logits, make_hf_model, padded_batch

from mindgrpo.grpo.ms_objective import GRPOLoss
from mindgrpo.grpo.optim import GradBuffer
from mindgrpo.grpo.train_graph import GRPOGradStep, PolicyLoss
from mindgrpo.models.checkpoint import load_model, model_state
from mindgrpo.models.convert import hf_to_ms_name
from mindgrpo.models.lora import (ALL_LINEAR, LoraSpec, adapter_parameters, adapter_state, adapters_off,
                                  add_adapters, load_adapter_state, merge_state, target_modules)
from mindgrpo.models.lora_files import read_adapter, write_adapter
from mindgrpo.models.scoring import SequenceLogits, TokenLogProbs

RANK, ALPHA = 4, 8.0
BETA = 0.04


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def pair(request, tmp_path_factory):
    """(PEFT model with B non-zero, its HF base directory, our model with PEFT's adapter loaded from PEFT's
    files, the adapter folder)."""
    return make_pair(tmp_path_factory.mktemp(request.param), request.param)


def make_pair(d, model_type, **shape):
    """`pair`'s four in folder d, the HF model made with `shape` (make_hf_model's keywords) beside its defaults."""
    import torch
    from peft import LoraConfig, get_peft_model

    hf = make_hf_model(str(d / "hf"), model_type=model_type, seed=3, **shape)
    peft_model = get_peft_model(copy.deepcopy(hf), LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                               target_modules=list(ALL_LINEAR)))
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    peft_model.eval()
    peft_model.save_pretrained(str(d / "peft_adapter"))
    spec, state = read_adapter(str(d / "peft_adapter"))
    assert (spec.rank, spec.alpha, spec.targets, spec.scaling) == (RANK, ALPHA, ALL_LINEAR, ALPHA / RANK)
    lm = load_model(str(d / "hf"))
    add_adapters(lm, spec, seed=0)
    load_adapter_state(lm, state, str(d / "peft_adapter"))
    return peft_model, str(d / "hf"), lm, d


def test_target_names_peft_and_short_and_refusal():
    assert target_modules(["q", "v_proj", "down"]) == ("q_proj", "v_proj", "down_proj")
    assert target_modules("all-linear") == ALL_LINEAR
    with pytest.raises(ValueError, match="lora_target_modules: 'qkv_proj' is not a module"):
        target_modules(["q_proj", "qkv_proj"])


def test_initialisation_as_peft_and_only_adapters_train(tmp_path):
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_ with a = sqrt(5)), B zeros, so the logits are the
    base's; every base parameter frozen. PEFT's own A on the same shapes has the same bound and spread."""
    import torch
    from peft import LoraConfig, get_peft_model

    hf = make_hf_model(str(tmp_path / "hf"), seed=1, layers=1)
    lm = load_model(str(tmp_path / "hf"))
    add_adapters(lm, LoraSpec(rank=8, alpha=16, targets=("q", "down")), seed=4)
    params = {p.name: p for p in adapter_parameters(lm)}
    assert sorted(params) == sorted(f"model.layers.0.{m}.{x}" for m in ("attention.wq", "feed_forward.w2")
                                    for x in ("lora_a", "lora_b"))
    assert [p.name for p in lm.get_parameters() if p.requires_grad] == [n for n in params]
    torch.manual_seed(0)
    theirs = get_peft_model(hf, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "down_proj"]))
    for ours, peft_name in (("model.layers.0.attention.wq", "q_proj"), ("model.layers.0.feed_forward.w2", "down_proj")):
        a = params[ours + ".lora_a"].asnumpy()
        ref = dict(theirs.named_parameters())[
            f"base_model.model.model.layers.0.{'self_attn' if 'q' in peft_name else 'mlp'}.{peft_name}.lora_A.default.weight"]
        ref = ref.detach().numpy()
        bound = 1 / np.sqrt(a.shape[1])
        assert a.shape == ref.shape and np.abs(a).max() <= bound and np.abs(ref).max() <= bound
        assert abs(a.std() - ref.std()) < 0.15 * ref.std()  # both uniform on the same bound: std bound / sqrt(3)
        assert not params[ours + ".lora_b"].asnumpy().any()


def test_logits_match_peft(pair):
    peft_model, _, lm, _ = pair
    ids, mask = padded_batch(np.random.default_rng(1), 512, [17, 9, 4], 17)
    ours = SequenceLogits(lm)(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()
    ref = hf_logits(peft_model, ids, mask)
    with peft_model.disable_adapter():
        base = hf_logits(peft_model, ids, mask)
    keep = mask.astype(bool)
    assert np.abs(ref - base)[keep].max() > 0.05  # the adapter changes the model
    assert np.abs(ours - ref)[keep].max() <= 1e-4


def test_logits_match_peft_at_many_rows(tmp_path):
    """4 x 150 = 600 token rows on a model 256 wide (MHA): the base projections take our CPU matmul (from 512 rows
    and 256 features, on by default), the rank-4 adapters MindSpore's, against PEFT on the same weights."""
    from mindgrpo.kernels.matmul import MIN_ROWS, MIN_WIDTH

    peft_model, _, lm, _ = make_pair(tmp_path, "qwen2", hidden=MIN_WIDTH, heads=4, kv_heads=4, inter=2 * MIN_WIDTH,
                                     std=0.05)
    ids, mask = padded_batch(np.random.default_rng(4), 512, [150, 97, 131, 64], 150)
    assert ids.size >= MIN_ROWS
    ours = SequenceLogits(lm)(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()
    ref = hf_logits(peft_model, ids, mask)
    assert np.abs(ours - ref)[mask.astype(bool)].max() <= 1e-4


def _torch_grpo_grads(peft_model, ids, mask, score_pos, labels, valid, adv, old, ref):
    """The GRPO loss (PPO clip 0.2, k3 KL to ref with BETA, token mean) of the PEFT model in torch; its
    lora_A / lora_B gradients by our names."""
    import torch

    peft_model.zero_grad()
    logits = peft_model(input_ids=torch.tensor(ids, dtype=torch.long),
                        attention_mask=torch.tensor(mask, dtype=torch.long)).logits
    logp_all = torch.log_softmax(logits.float(), -1)
    rows = torch.arange(ids.shape[0])[:, None]
    logp = logp_all[rows, torch.tensor(score_pos, dtype=torch.long), torch.tensor(labels, dtype=torch.long)]
    m = torch.tensor(valid, dtype=torch.float32)
    a = torch.tensor(adv)[:, None]
    ratio = torch.exp(logp - torch.tensor(old))
    pg = -torch.minimum(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a)
    d = torch.tensor(ref) - logp
    kl = torch.exp(d) - d - 1
    loss = ((pg * m).sum() + BETA * (kl * m).sum()) / m.sum()
    loss.backward()
    out = {}
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            parts = name.split(".")  # base_model.model.model.layers.<i>.<block>.<proj>.lora_A.default.weight
            block = {"self_attn": "attention", "mlp": "feed_forward"}[parts[5]]
            attr = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo", "gate_proj": "w1",
                    "up_proj": "w3", "down_proj": "w2"}[parts[6]]
            out[f"model.layers.{parts[4]}.{block}.{attr}.{parts[7].lower()}"] = p.grad.numpy().copy()
    return float(loss.detach()), out


def grpo_batch(rng, ids, mask, prompt, lp, r: int = 12):
    """A GRPO batch over padded rows ids / mask (B, S) whose first prompt[i] tokens are the prompt: the completion
    tokens' score positions, labels and validity (B, r), then old and reference log-probs (the current ones from lp
    (B, S, V), plus noise of 0.05 and 0.1) and advantages (B,)."""
    b = len(ids)
    score_pos, labels, valid = (np.zeros((b, r), np.int32), np.zeros((b, r), np.int32), np.zeros((b, r), np.float32))
    for i, n in enumerate(mask.sum(1)):
        k = n - prompt[i]
        score_pos[i, :k] = np.arange(prompt[i] - 1, n - 1)
        labels[i, :k] = ids[i, prompt[i]:n]
        valid[i, :k] = 1
    now = np.take_along_axis(lp[np.arange(b)[:, None], score_pos], labels[..., None], -1)[..., 0]
    old = (now + rng.normal(0, 0.05, now.shape)).astype(np.float32)
    ref = (now + rng.normal(0, 0.1, now.shape)).astype(np.float32)
    adv = rng.normal(0, 1, b).astype(np.float32)
    return score_pos, labels, valid, old, ref, adv


def test_adapter_gradients_of_the_grpo_loss_match_peft(pair):
    """The training graph's gradient buffers (one per adapter matrix, nothing else) against torch's."""
    peft_model, _, lm, _ = pair
    rng = np.random.default_rng(7)
    ids, mask = padded_batch(rng, 512, [16, 11, 7], 16)
    prompt = np.array([5, 3, 2])
    import torch

    with torch.no_grad():
        lp = torch.log_softmax(torch.tensor(hf_logits(peft_model, ids, mask)), -1).numpy()
    score_pos, labels, valid, old, ref, adv = grpo_batch(rng, ids, mask, prompt, lp)
    loss_ref, grads_ref = _torch_grpo_grads(peft_model, ids, mask, score_pos, labels, valid, adv, old, ref)

    params = [p for p in lm.get_parameters() if p.requires_grad]
    assert [p.name for p in params] == [p.name for p in adapter_parameters(lm)]
    buffer = GradBuffer(params)
    step = GRPOGradStep(PolicyLoss(lm, GRPOLoss(beta=BETA, kl_kind="k3"), detach_old=False, use_ref=True),
                        params, buffer)
    loss, _ = step(ms.Tensor(ids), ms.mutable((ms.Tensor(score_pos), ms.Tensor(labels))), ms.Tensor(valid),
                   ms.Tensor(adv), ms.Tensor(old), ms.Tensor(ref), ms.Tensor(np.float32(valid.sum())),
                   ms.Tensor(np.float32(3)), None)
    assert abs(float(loss.asnumpy()) - loss_ref) <= 1e-5
    grads = {p.name: b.asnumpy() for p, b in zip(params, buffer.bufs)}
    assert sorted(grads) == sorted(grads_ref)
    assert max(np.abs(g).max() for g in grads_ref.values()) > 1e-2  # gradients of some size
    worst = max(np.abs(grads[n] - grads_ref[n]).max() for n in grads)
    assert worst <= 1e-5, worst


def test_merged_weights_equal_merge_and_unload(pair):
    import torch

    peft_model, _, lm, _ = pair
    with torch.no_grad():
        merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    ref = {hf_to_ms_name(n): v.numpy() for n, v in merged.items()}
    base = {k: v for k, v in model_state(lm).items() if ".lora_" not in k}
    ours = merge_state(base, adapter_state(lm), lm.lora.scaling)
    assert sorted(ours) == sorted(k for k in ref if k in base) and len(ours) == len(base)
    for name in ours:
        np.testing.assert_allclose(ours[name], ref[name], rtol=0, atol=1e-6, err_msg=name)
    assert np.abs(ours["model.layers.0.attention.wq.weight"] - base["model.layers.0.attention.wq.weight"]).max() > 1e-3


def test_our_adapter_loads_into_peft_with_the_same_logits(pair):
    """Our adapter (B moved off PEFT's values) in PEFT's layout -> PeftModel.from_pretrained on the HF base."""
    import transformers
    from peft import PeftModel

    _, hf_dir, lm, d = pair
    state = adapter_state(lm)
    rng = np.random.default_rng(9)
    moved = {n: v + rng.normal(0, 0.05, v.shape).astype(np.float32) if n.endswith("lora_b") else v
             for n, v in state.items()}
    load_adapter_state(lm, moved, "test")
    try:
        folder = write_adapter(str(d / "ours"), lm.lora, adapter_state(lm), base_model=hf_dir)
        base = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
        theirs = PeftModel.from_pretrained(base, folder).eval()
        ids, mask = padded_batch(np.random.default_rng(2), 512, [12, 5], 12)
        ours = SequenceLogits(lm)(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()
        keep = mask.astype(bool)
        assert np.abs(ours - hf_logits(theirs, ids, mask))[keep].max() <= 1e-4
        spec, back = read_adapter(folder)
        assert spec == lm.lora and all(np.array_equal(back[n], v) for n, v in adapter_state(lm).items())
    finally:
        load_adapter_state(lm, state, "test")


def test_adapters_off_is_the_base_model_bit_for_bit(pair):
    """The reference pass: the policy's log-prob graph with every scaling 0 against a model without adapters."""
    _, hf_dir, lm, _ = pair
    base = load_model(hf_dir)
    ids, _ = padded_batch(np.random.default_rng(4), 512, [14, 14], 14)
    pos = np.tile(np.arange(3, 13, dtype=np.int32), (2, 1))
    labels = ids[:, 4:14].astype(np.int32)
    args = (ms.Tensor(ids), ms.Tensor(pos), ms.Tensor(labels))
    scorer = TokenLogProbs(lm, with_entropy=False)
    with_adapters = scorer(*args)[0].asnumpy()
    with adapters_off(lm):
        off = scorer(*args)[0].asnumpy()
    again = scorer(*args)[0].asnumpy()
    expected = TokenLogProbs(base, with_entropy=False)(*args)[0].asnumpy()
    assert np.array_equal(off, expected)
    assert np.abs(with_adapters - expected).max() > 1e-3 and np.array_equal(again, with_adapters)
