"""A reward model of the tiny task, trained here in torch (transformers' Qwen2ForSequenceClassification), saved as
an HF folder that `reward_config.reward_models` loads as it is.

    folder, held_out = train_tiny_reward_model(out_dir, tokenizer, task)

Its data are the task's training problems only (the validation problems the run measures are never shown): the
question's tokens followed by a worked solution in the warm start's R1 format, labelled 1 when its boxed result is
the problem's value and the solution is complete. The solutions are a student's (`_worked`): the warm start's
flawed teacher forgetting carries (too small by 10), and slips of either sign in a third of the chains; a fifth
are spoiled further (the boxed result not the steps' result, or the text cut short). Without the slips that make
a result too large, the policy learned to game the model: it wrote "8 + 1 = 10, 10 + 1 = 19" (inflated steps score
high when the only mistakes ever shown were forgotten carries) and held-out accuracy fell from 0.26 to 0.02 while
the model's score rose. The label is the arithmetic's truth, not the rule reward's verdict; the training loss is
the logistic loss of the score at the last token.
`held_out` is the model's accuracy (score > 0 against the label) on the same kind of data drawn from the validation
problems, for the test to check the fixture did its job.
"""

import os
import re
from typing import List, Sequence, Tuple

import numpy as np

from mindgrpo.data.synthetic import ArithmeticTask, arithmetic_rows, forgets_carry
from mindgrpo.grpo.sft import R1_TARGET


def _worked(answer: str, rng) -> Tuple[str, str]:
    """A worked solution of the chain `answer` ("3 + 8 = 11, 11 + 5 = 16") as a student might write it, and its
    final value: each carrying addition forgets the carry with probability 0.5 (the warm start's flawed teacher),
    and in a third of the chains one step's result slips by 1 to 10 either way; later steps go on from what was
    written."""
    steps = [tuple(map(int, re.fullmatch(r"(\d+) \+ (\d+) = (\d+)", t).groups())) for t in answer.split(", ")]
    slip = int(rng.integers(0, len(steps))) if rng.random() < 1 / 3 else -1
    value, out = steps[0][0], []
    for k, (_, b, _) in enumerate(steps):
        new = value + b
        if forgets_carry(value, b) and rng.random() < 0.5:
            new -= 10
        if k == slip:
            new = max(0, new + int(rng.choice([-1, 1])) * int(rng.integers(1, 11)))
        out.append(f"{value} + {b} = {new}")
        value = new
    return ", ".join(out), str(value)


def _examples(rows, tokenizer, rng, n: int, cache: dict) -> Tuple[List[List[int]], np.ndarray]:
    """n (prompt + completion token ids, label) pairs drawn from rows; cache: text -> token ids."""
    stop = tokenizer.stop_token_ids[0]

    def encode(text):
        if text not in cache:
            cache[text] = tokenizer.encode(text)
        return cache[text]

    seqs, labels = [], []
    for k in rng.integers(0, len(rows), n):
        row = rows[int(k)]
        answer, value = _worked(row.answer, rng)
        spoil = rng.random()
        if spoil < 0.1:  # a boxed result that is not the worked steps' result
            value = str(max(0, int(value) + int(rng.choice([-1, 1])) * int(rng.integers(1, 20))))
        text = R1_TARGET.format(answer=answer, solution=value)
        completion = encode(text) + ([stop] if rng.random() < 0.8 else [])
        cut = 0.1 <= spoil < 0.2
        if cut:  # an unfinished solution (the rollout's token limit): never right
            completion = completion[: int(rng.integers(1, len(completion) - 3))]
        seqs.append(encode(row.question) + completion)
        labels.append(float(value == row.solution and not cut))
    return seqs, np.asarray(labels, np.float32)


def _batch(seqs: Sequence[Sequence[int]], pad_id: int):
    import torch

    s = max(map(len, seqs))
    ids = torch.full((len(seqs), s), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), s), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, :len(q)] = torch.tensor(q)
        mask[i, :len(q)] = 1
    return ids, mask


def _scores(model, seqs, pad_id):
    """The score at each sequence's last token (right padding: positions 0 .. n-1 as the trainer numbers them)."""
    import torch

    ids, mask = _batch(seqs, pad_id)
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, S, H)
    last = mask.sum(1) - 1
    return model.score(hidden[torch.arange(len(seqs)), last]).squeeze(-1)  # (B,)


def train_tiny_reward_model(out_dir: str, tokenizer, task: ArithmeticTask, *, steps: int = 1500,
                            batch_size: int = 64, seed: int = 0) -> Tuple[str, float]:
    """Train and save the reward model; returns (its HF folder, held-out accuracy)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: two threads mostly wait for each other
    rng = np.random.default_rng(seed)
    train, val = arithmetic_rows(task)
    pad = tokenizer.pad_token_id
    cfg = transformers.Qwen2Config(vocab_size=tokenizer.vocab_size, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=False, num_labels=1, pad_token_id=pad)
    model = transformers.Qwen2ForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps, pct_start=0.1)
    model.train()
    cache = {}
    for _ in range(steps):
        seqs, labels = _examples(train, tokenizer, rng, batch_size, cache)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(_scores(model, seqs, pad), torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    seqs, labels = _examples(val, tokenizer, np.random.default_rng(seed + 1), 1000, {})
    with torch.no_grad():
        held_out = float(((_scores(model, seqs, pad).numpy() > 0) == (labels > 0.5)).mean())
    torch.set_num_threads(threads)
    folder = os.path.join(out_dir, "tiny_rm")
    model.save_pretrained(folder, safe_serialization=True)
    return folder, held_out
