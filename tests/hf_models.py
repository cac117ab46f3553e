"""Tiny HF Qwen2 models with random weights, saved as HF directories, for parity tests."""

import os

import numpy as np


def make_hf_model(out_dir, *, tied=False, vocab=512, hidden=64, layers=2, heads=4, kv_heads=2,
                  inter=128, std=0.2, seed=0, max_pos=512):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      tie_word_embeddings=tied, rope_theta=10000.0, rms_norm_eps=1e-6,
                      max_position_embeddings=max_pos)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
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
