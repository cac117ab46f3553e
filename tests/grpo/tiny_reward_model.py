"""A reward model of the tiny task, trained here in torch (transformers' Qwen2ForSequenceClassification), saved as
an HF folder that `reward_config.reward_models` loads as it is.

    on_policy = policy_samples(policy_ckpt, tokenizer_dir, tokenizer, train_rows, n=4)
    folder, held_out = train_tiny_reward_model(out_dir, tokenizer, task, on_policy=on_policy, init_from=POLICY_HF,
                                               held_out_policy=policy_samples(..., val_rows, n=4))

The reward model starts from the policy it will judge (`init_from`: the policy converted to HF), as RLHF's do.

Its data are the task's training problems only (the validation problems the run measures are never shown), the
question's tokens followed by a solution, from two sources mixed in every batch:
- the policy's own samples (`policy_samples`): the warm-started policy's completions of the training problems,
  sampled by scripts/generate.py, labelled 1 when the completion ended with its stop token and its boxed value is
  the problem's value (parsed here with this file's own regex, not by the reward code under test);
- a student's worked solutions (`_worked`): forgotten carries (too small by 10) like the warm start's flawed
  teacher, and slips of either sign in half of the chains (off by one in half of those); a fifth spoiled further
  (the boxed result not the steps' result, or the text cut short). These show mistakes the warm start rarely makes
  (a result too large), which the policy would otherwise be free to drift to: a model shown only forgotten carries
  scored "8 + 1 = 10, 10 + 1 = 19" above the right answer, and the policy learned to write it.
Labels are the arithmetic's truth; the loss is the logistic loss of the score at the last token.
`held_out` is the model's accuracy (score > 0 against the label) on the same kinds of data drawn from the
validation problems: the student's solutions, and the policy's samples when `held_out_policy` is given.
"""

import json
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.data.synthetic import ArithmeticTask, arithmetic_rows, forgets_carry
from mindgrpo.grpo.sft import R1_TARGET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOXED = re.compile(r"\\boxed\{(\d+)\}")  # the tiny task's answers are whole numbers >= 0

Examples = Tuple[List[List[int]], np.ndarray]  # (prompt + completion token ids, label 0/1 (N,))


def policy_samples(policy: str, tokenizer_dir: str, tokenizer, rows, *, n: int, temperature: float = 1.0,
                   max_tokens: int = 40, seed: int = 0, chunk: int = 1000) -> Examples:
    """n completions of each row's question sampled from the policy checkpoint by scripts/generate.py (the raw
    prompt template, as the tiny recipe's), each as the question's tokens followed by the completion's (its stop
    token included when it ended), labelled 1 when it ended (not cut at max_tokens) and its last boxed value is the
    row's solution. `chunk` questions a generate.py call."""
    seqs, labels = [], []
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        cmd = [sys.executable, os.path.join(REPO, "scripts", "generate.py"), "--model", policy,
               "--tokenizer_dir", tokenizer_dir, "--n", str(n), "--temperature", str(temperature),
               "--max_tokens", str(max_tokens), "--seed", str(seed + start)]
        for row in part:
            cmd += ["--prompt", row.question]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"generate.py failed: {r.stderr[-2000:]}")
        by_question = {row.question: row for row in part}
        out = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        if len(out) != n * len(part):
            raise RuntimeError(f"generate.py gave {len(out)} completions for {len(part)} questions x {n}")
        for c in out:
            row = by_question[c["prompt"]]
            boxed = _BOXED.findall(c["completion"])
            seqs.append(tokenizer.encode(row.question) + list(c["token_ids"]))
            labels.append(float(c["finish_reason"] == "stop" and bool(boxed) and boxed[-1] == row.solution))
    return seqs, np.asarray(labels, np.float32)


def _worked(answer: str, rng) -> Tuple[str, str]:
    """A worked solution of the chain `answer` ("3 + 8 = 11, 11 + 5 = 16") as a student might write it, and its
    final value: each carrying addition forgets the carry with probability 0.5 (the warm start's flawed teacher),
    and in half of the chains one step's result slips either way, by 1 in half of the slips, else by 2 to 10; later
    steps go on from what was written."""
    steps = [tuple(map(int, re.fullmatch(r"(\d+) \+ (\d+) = (\d+)", t).groups())) for t in answer.split(", ")]
    slip = int(rng.integers(0, len(steps))) if rng.random() < 0.5 else -1
    value, out = steps[0][0], []
    for k, (_, b, _) in enumerate(steps):
        new = value + b
        if forgets_carry(value, b) and rng.random() < 0.5:
            new -= 10
        if k == slip:  # off by one in half of the slips: the mistake hardest to see
            size = 1 if rng.random() < 0.5 else int(rng.integers(2, 11))
            new = max(0, new + int(rng.choice([-1, 1])) * size)
        out.append(f"{value} + {b} = {new}")
        value = new
    return ", ".join(out), str(value)


def _examples(rows, tokenizer, rng, n: int, cache: dict) -> Examples:
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


def _accuracy(model, examples: Examples, pad_id: int, batch: int = 256) -> float:
    """Share of examples whose score is > 0 exactly when their label is 1."""
    import torch

    seqs, labels = examples
    with torch.no_grad():
        scores = np.concatenate([_scores(model, seqs[k:k + batch], pad_id).numpy() for k in range(0, len(seqs), batch)])
    return float(((scores > 0) == (labels > 0.5)).mean())


def train_tiny_reward_model(out_dir: str, tokenizer, task: ArithmeticTask, *, on_policy: Optional[Examples] = None,
                            policy_share: float = 0.5, held_out_policy: Optional[Examples] = None,
                            init_from: Optional[str] = None, steps: int = 1500, lr: float = 1e-3, batch_size: int = 64,
                            seed: int = 0) -> Tuple[str, Dict[str, float]]:
    """Train and save the reward model; returns (its HF folder, held-out accuracy: {"student": on the student's
    solutions of the validation problems, "policy": on `held_out_policy` when given}). Each batch draws
    `policy_share` of its rows from `on_policy` (the policy's samples of training problems), the rest from the
    student's solutions. `init_from`: an HF causal-LM folder (the policy converted) whose decoder the reward model
    starts from, its score head new (InstructGPT's reward model starts from the SFT policy); else a random 4-layer
    decoder."""
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
    if init_from is None:
        model = transformers.Qwen2ForSequenceClassification(cfg)
    else:
        model = transformers.Qwen2ForSequenceClassification.from_pretrained(init_from, num_labels=1, pad_token_id=pad)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    cache = {}
    from_policy = int(round(batch_size * policy_share)) if on_policy is not None else 0
    for _ in range(steps):
        seqs, labels = _examples(train, tokenizer, rng, batch_size - from_policy, cache)
        if from_policy:
            pick = rng.integers(0, len(on_policy[0]), from_policy)
            seqs = seqs + [on_policy[0][int(k)] for k in pick]
            labels = np.concatenate([labels, on_policy[1][pick]])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(_scores(model, seqs, pad), torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    held_out = {"student": _accuracy(model, _examples(val, tokenizer, np.random.default_rng(seed + 1), 1000, {}), pad)}
    if held_out_policy is not None:
        held_out["policy"] = _accuracy(model, held_out_policy, pad)
    torch.set_num_threads(threads)
    folder = os.path.join(out_dir, "tiny_rm")
    model.save_pretrained(folder, safe_serialization=True)
    return folder, held_out
