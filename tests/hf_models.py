"""Tiny HF Qwen2 / Qwen3 models with random weights, saved as HF directories, for parity tests."""

import os

import numpy as np


def make_hf_model(out_dir, *, tied=False, vocab=512, hidden=64, layers=2, heads=4, kv_heads=2,
                  inter=128, std=0.2, seed=0, max_pos=512, model_type="qwen2", head_dim=None):
    """model_type "qwen2" (Qwen2ForCausalLM) or "qwen3" (Qwen3ForCausalLM: QK-norm, no q/k/v bias,
    head_dim its own field: hidden // heads when None)."""
    import torch
    import transformers

    kind = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[model_type]
    extra = {} if head_dim is None else {"head_dim": head_dim}
    if model_type == "qwen3":
        extra.setdefault("head_dim", hidden // heads)  # HF's Qwen3 defaults it to 128, not H / nh
    cfg = getattr(transformers, kind + "Config")(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied, rope_theta=10000.0,
        rms_norm_eps=1e-6, max_position_embeddings=max_pos, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, kind + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger than HF's init so greedy choices are well separated
            p.normal_(0.0, std)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def hf_logits(model, ids, mask):
    import torch

    ids = torch.tensor(np.asarray(ids), dtype=torch.long)
    mask = torch.tensor(np.asarray(mask), dtype=torch.long)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits.numpy()


def padded_batch(rng, vocab, lengths, s):
    """Right-padded random ids (B, s) and their mask: row i holds lengths[i] tokens."""
    ids = np.zeros((len(lengths), s), np.int32)
    mask = np.zeros((len(lengths), s), np.int32)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, vocab, n)
        mask[i, :n] = 1
    return ids, mask


def hf_greedy(hf, prompt, new_tokens, stops=None):
    """transformers' greedy continuation of one prompt (stopping at any of stops)."""
    import torch

    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                          eos_token_id=list(stops) if stops else None)
    return out[0, len(prompt):].tolist()


def make_hf_reward_model(out_dir, *, model_type="qwen2", vocab=512, hidden=64, layers=2, heads=4, kv_heads=2,
                         inter=128, std=0.2, seed=0, max_pos=512, pad_token_id=0):
    """A random HF reward model, `Qwen2ForSequenceClassification` / `Qwen3ForSequenceClassification` with
    num_labels 1 (the decoder and `score.weight` (1, H)), saved as an HF directory."""
    import torch
    import transformers

    kind = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[model_type]
    extra = {"head_dim": hidden // heads} if model_type == "qwen3" else {}
    cfg = getattr(transformers, kind + "Config")(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, rope_theta=10000.0, rms_norm_eps=1e-6,
        max_position_embeddings=max_pos, num_labels=1, pad_token_id=pad_token_id, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, kind + "ForSequenceClassification")(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def hf_reward_scores(model, ids, mask):
    """transformers' scores (B,) of a padded batch, positions counting real tokens only (as TRL passes them)."""
    import torch

    mask = torch.tensor(np.asarray(mask), dtype=torch.long)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(np.asarray(ids), dtype=torch.long), attention_mask=mask,
                    position_ids=positions)
    return out.logits[:, 0].numpy()
