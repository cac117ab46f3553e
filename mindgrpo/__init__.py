"""mindgrpo: MindSpore-native GRPO for Qwen2 / Qwen2.5.

Shape vocabulary, used in every shape comment and docstring of the package:

    B   batch (rows in one forward; for rollouts B = prompts * G)
    G   group size (samples per prompt)
    S   sequence length (prompt + response, padded)
    P   prompt length (padded)
    R   response length (padded)
    C   KV-cache capacity (slots)
    H   hidden size
    V   vocabulary size (of the embedding, >= the tokenizer's)
    nh  attention heads, nkv key/value heads, d head dim
    I   MLP intermediate size
"""

__version__ = "0.1.0"
