"""A micro model that calls tools at once, for runs that must see conversations without a warm start (tests/parallel/
test_separate.py): the one-layer micro model, untied, made a bigram model whose samples often end a turn with
`</tool_call>` and a stop token (a call it never opened: the tools answer it with an error, as ToolTurns does).

Its decoder layer adds nothing (the attention's and the MLP's output projections are zero), so the logits of the next
token are the head against the current token's normalised embedding. The four tokens of `</tool_call>` and the stop
token form a chain: each chain token's embedding is a direction of its own, and the head's row of the next one points
along it (a logit of about 17: taken for sure). Every other token's embedding shares one more direction, along which
the head's row of the chain's first token gives it a probability of about 0.25 at temperature 1. The weights move
once GRPO trains them; it starts so.
"""

import os

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(REPO, "model_configs", "qwen_grpo", "tiny_tools", "tokenizer_config.json")
HERE = os.path.dirname(os.path.abspath(__file__))


def tool_calling_micro(folder: str, overrides) -> str:
    """The checkpoint's path (policy.ckpt with its config.yaml beside, in `folder`), for the tokenizer that
    scripts/grpo_one_stage.py builds with `overrides` (its default config; generate_config.tools, chat_template and
    the synthetic task: the tiny tokenizer learns their chat texts)."""
    from mindgrpo.config import GRPOConfig, load_config
    from mindgrpo.grpo.builder import Paths, build_tokenizer
    from mindgrpo.models.checkpoint import model_state, save_ms_checkpoint
    from mindgrpo.models.config import Qwen2Config
    from mindgrpo.models.qwen2 import Qwen2ForCausalLM
    from scripts.grpo_one_stage import DEFAULT_CONFIG

    os.makedirs(folder, exist_ok=True)
    cfg = load_config(GRPOConfig, DEFAULT_CONFIG, [o for o in overrides if "=" in o and not o.startswith("--")])
    tokenizer = build_tokenizer(cfg, Paths(output_dir=folder))
    chain = tokenizer.encode("</tool_call>") + [tokenizer.stop_token_ids[0]]
    assert len(set(chain)) == len(chain) and tokenizer.decode(chain[:-1]) == "</tool_call>"
    with open(os.path.join(HERE, "micro_qwen2.yaml")) as f:
        text = f.read().replace("num_hidden_layers: 2", "num_hidden_layers: 1").replace(
            "tie_word_embeddings: true", "tie_word_embeddings: false")
    config = os.path.join(folder, "config.yaml")
    with open(config, "w") as f:
        f.write(text)
    mcfg = Qwen2Config.load(config)
    state = model_state(Qwen2ForCausalLM(mcfg, seed=0))
    embed, head = state["model.tok_embeddings.embedding_weight"], state["lm_head.weight"]
    shared = len(chain)  # the direction every other token's embedding has
    embed[:, shared] += 1.0
    for k, token in enumerate(chain):
        embed[token] = 0.0
        embed[token, k] = 1.0
        if k + 1 < len(chain):
            head[chain[k + 1], k] += 3.0  # x sqrt(hidden 32) after the norm: a logit of about 17
    head[chain[0], shared] += 0.91  # about 5.1: e^5.1 / (e^5.1 + 511) ~ 0.25
    for name in state:
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
            state[name] = np.zeros_like(state[name])
    path = os.path.join(folder, "policy.ckpt")
    save_ms_checkpoint({name: ("F32", value) for name, value in state.items()}, path)
    return path
