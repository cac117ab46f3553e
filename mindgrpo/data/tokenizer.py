"""Qwen2 / Qwen2.5 byte-level BPE tokenizer on the `tokenizers` library.

Built from the plain `vocab.json` + `merges.txt` (+ `tokenizer_config.json` for the added tokens) that ship
with every Qwen2 checkpoint; ids are identical to transformers' `Qwen2Tokenizer` on the same files:

    NFC normalizer -> split on Qwen2's pre-tokenize regex -> byte-level alphabet (no prefix space) -> BPE,
    no BOS, no post-processor. Added tokens (`<|im_start|>`, ...) match as whole strings before that pipeline.

Without a tokenizer_config.json the three Qwen2 chat tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`
are added right after the BPE vocabulary (ids 151643..151645 for Qwen2.5, the same ids the config gives).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from mindgrpo.utils.staging import replace_dir, staging_dir

# Qwen2's pre-tokenizer split: contractions, letter runs (with one leading non-letter), single digits,
# punctuation runs (with their trailing newlines), newline runs, other whitespace.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
DEFAULT_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
CONFIG_FILE = "tokenizer_config.json"


@dataclass(frozen=True)
class AddedTokenSpec:
    """One entry of tokenizer_config.json's `added_tokens_decoder`."""

    id: int
    content: str
    special: bool = True


def apply_qwen2_pipeline(tok: Tokenizer) -> Tokenizer:
    """Install Qwen2's normalizer, pre-tokenizer and decoder on `tok` (shared with the tiny-tokenizer trainer)."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _first_line(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.readline(200).strip()


def _swapped_hint(path: str, looks_like: str) -> str:
    """A hint when the file at `path` looks like the other tokenizer file (the two paths swapped)."""
    first = _first_line(path)
    if looks_like == MERGES_FILE and (first.startswith("#version") or len(first.split(" ")) == 2):
        return f"; it looks like a {MERGES_FILE} (vocabulary and merges files swapped?)"
    if looks_like == VOCAB_FILE and first.startswith("{"):
        return f"; it looks like a {VOCAB_FILE} (vocabulary and merges files swapped?)"
    return ""


def read_vocab(path: str) -> Dict[str, int]:
    """vocab.json: a JSON object mapping each token to its id. Errors name the file."""
    try:
        with open(path, encoding="utf-8") as f:
            vocab = json.load(f)
    except ValueError as e:  # not JSON, or not UTF-8
        raise ValueError(f"{path}: not a {VOCAB_FILE} ({e}){_swapped_hint(path, MERGES_FILE)}") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise ValueError(f"{path}: not a {VOCAB_FILE} (expected a JSON object of token -> id)")
    return vocab


def read_merges(path: str) -> List[Tuple[str, str]]:
    """merges.txt as pairs; an optional `#version` header line and blank lines are skipped. Errors name the
    file and line."""
    merges = []
    with open(path, encoding="utf-8") as f:
        try:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line or (lineno == 1 and line.startswith("#version")):
                    continue
                parts = line.split(" ")
                if len(parts) != 2:
                    raise ValueError(f"{path}:{lineno}: not a {MERGES_FILE} line: expected 'left right', got "
                                     f"{line[:40]!r}{'...' if len(line) > 40 else ''}{_swapped_hint(path, VOCAB_FILE)}")
                merges.append((parts[0], parts[1]))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not a {MERGES_FILE} (not UTF-8 text: {e.reason})") from None
    return merges


def read_tokenizer_config(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as e:
        raise ValueError(f"{path}: not a {CONFIG_FILE} ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a {CONFIG_FILE} (expected a JSON object)")
    return config


def _token_content(value) -> Optional[str]:
    """tokenizer_config.json writes a token either as a string or as {"content": ...}."""
    if value is None or isinstance(value, str):
        return value
    return value["content"]


class QwenTokenizer:
    """Byte-level BPE tokenizer with Qwen2's pipeline. See the module docstring for the exact recipe."""

    def __init__(
        self,
        vocab: Dict[str, int],
        merges: Sequence[Tuple[str, str]],
        added_tokens: Sequence[AddedTokenSpec],
        *,
        eos_token: str = ENDOFTEXT,
        pad_token: str = ENDOFTEXT,
        config: Optional[dict] = None,
    ):
        self._vocab = dict(vocab)
        self._merges = [tuple(m) for m in merges]
        self._added = sorted(added_tokens, key=lambda t: t.id)
        self._config = dict(config) if config is not None else None

        self._tok = apply_qwen2_pipeline(
            Tokenizer(BPE(vocab=self._vocab, merges=self._merges, dropout=None, unk_token=None, fuse_unk=False))
        )
        for spec in self._added:
            # tokenizers numbers new added tokens in order after the vocabulary, so their ids must be
            # contiguous there; a token already in vocab.json keeps its id.
            expected = self._tok.token_to_id(spec.content)
            if expected is None:
                expected = self._tok.get_vocab_size(with_added_tokens=True)
            if spec.id != expected:
                raise ValueError(
                    f"added token {spec.content!r} has id {spec.id}, but the next free id is {expected}; "
                    "added tokens must follow the BPE vocabulary without gaps"
                )
            token = AddedToken(spec.content, special=spec.special, normalized=False, lstrip=False, rstrip=False)
            if spec.special:
                self._tok.add_special_tokens([token])
            else:
                self._tok.add_tokens([token])

        self.eos_token = eos_token
        self.pad_token = pad_token
        self.eos_token_id = self._require_id(eos_token, "eos_token")
        self.pad_token_id = self._require_id(pad_token, "pad_token")

    # ----------------------------------------------------------------- loading / saving
    @classmethod
    def from_files(cls, vocab: str, merges: str, tokenizer_config: Optional[str] = None) -> "QwenTokenizer":
        vocab_map = read_vocab(vocab)
        merge_pairs = read_merges(merges)
        if tokenizer_config is None:
            first = len(vocab_map)
            added = [AddedTokenSpec(first + i, tok) for i, tok in enumerate(DEFAULT_SPECIAL_TOKENS)]
            return cls(vocab_map, merge_pairs, added)
        config = read_tokenizer_config(tokenizer_config)
        added = [
            AddedTokenSpec(int(i), entry["content"], bool(entry.get("special", True)))
            for i, entry in config.get("added_tokens_decoder", {}).items()
        ]
        eos = _token_content(config.get("eos_token")) or ENDOFTEXT
        pad = _token_content(config.get("pad_token")) or eos
        return cls(vocab_map, merge_pairs, added, eos_token=eos, pad_token=pad, config=config)

    @classmethod
    def from_dir(cls, path: str) -> "QwenTokenizer":
        config = os.path.join(path, CONFIG_FILE)
        return cls.from_files(
            os.path.join(path, VOCAB_FILE),
            os.path.join(path, MERGES_FILE),
            config if os.path.exists(config) else None,
        )

    def save(self, path: str) -> None:
        """Write vocab.json, merges.txt and tokenizer_config.json into `path` (created if needed)."""
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, VOCAB_FILE), "w", encoding="utf-8") as f:
            json.dump(self._vocab, f, ensure_ascii=False)
        with open(os.path.join(path, MERGES_FILE), "w", encoding="utf-8") as f:
            f.writelines(f"{a} {b}\n" for a, b in self._merges)
        with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(self.tokenizer_config(), f, ensure_ascii=False, indent=2)

    def tokenizer_config(self) -> dict:
        """The tokenizer_config.json content: the loaded one kept as is, else a minimal Qwen2Tokenizer config."""
        config = dict(self._config) if self._config is not None else {}
        config["added_tokens_decoder"] = {
            str(t.id): {
                "content": t.content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": t.special,
            }
            for t in self._added
        }
        config.setdefault("add_bos_token", False)
        config.setdefault("add_prefix_space", False)
        config.setdefault("bos_token", None)
        config.setdefault("clean_up_tokenization_spaces", False)
        config.setdefault("errors", "replace")
        config.setdefault("split_special_tokens", False)
        config.setdefault("tokenizer_class", "Qwen2Tokenizer")
        config.setdefault("unk_token", None)
        config["eos_token"] = self.eos_token
        config["pad_token"] = self.pad_token
        return config

    # ----------------------------------------------------------------- encode / decode
    def encode(self, text: str) -> List[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        """Encode many texts in one call (parallel in Rust); the fast path for datasets."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> List[str]:
        lists = [[int(i) for i in ids] for ids in batch]
        return self._tok.decode_batch(lists, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> Optional[str]:
        return self._tok.id_to_token(int(token_id))

    # ----------------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (BPE vocabulary + added tokens), not the model's V."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special_token_ids(self) -> List[int]:
        return [t.id for t in self._added if t.special]

    @property
    def stop_token_ids(self) -> List[int]:
        """Ids that end a generation: `<|im_end|>` (end of a chat turn) first, then the eos token."""
        ids = []
        for token in (IM_END, self.eos_token):
            token_id = self._tok.token_to_id(token)
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        return ids

    @property
    def chat_template(self) -> Optional[str]:
        return None if self._config is None else self._config.get("chat_template")

    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (for offsets, padding helpers, ...)."""
        return self._tok

    def _require_id(self, token: str, role: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{role} {token!r} is not in the vocabulary or the added tokens")
        return token_id

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"QwenTokenizer(vocab_size={self.vocab_size}, eos={self.eos_token!r}, pad={self.pad_token!r})"


# ------------------------------------------------------------------ a model's tokenizer on disk

RUN_TOKENIZER_DIR = "tokenizer"  # a training run's tokenizer, beside its checkpoints' step folders
TOKENIZER_FLAG = "--tokenizer_dir"  # the flag of generate.py and evaluate.py that names a tokenizer folder


def has_tokenizer(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, name)) for name in (VOCAB_FILE, MERGES_FILE))


def tokenizer_dirs(model: str) -> List[str]:
    """Where the tokenizer of the weights `model` (an HF folder, or a .ckpt) is looked for: the model's folder,
    then a training run's `tokenizer` folder beside the checkpoint's folder (checkpoints/step_N/policy.ckpt:
    checkpoints/tokenizer)."""
    folder = os.path.abspath(model if os.path.isdir(model) else os.path.dirname(os.path.abspath(model)))
    return [folder, os.path.join(os.path.dirname(folder), RUN_TOKENIZER_DIR)]


def default_tokenizer_dir(model: str) -> Optional[str]:
    """The first of `tokenizer_dirs(model)` holding vocab.json and merges.txt, else None."""
    return next((d for d in tokenizer_dirs(model) if has_tokenizer(d)), None)


def find_tokenizer_dir(model: str, given: Optional[str] = None) -> str:
    """The tokenizer folder of a command line: `given` (its --tokenizer_dir), else the default of the weights
    `model`; FileNotFoundError in one line naming what is missing and the flag."""
    if given:
        for name in (VOCAB_FILE, MERGES_FILE):
            if not os.path.isfile(os.path.join(given, name)):
                raise FileNotFoundError(f"{os.path.join(given, name)}: no such file; the tokenizer is read from "
                                        f"{TOKENIZER_FLAG}")
        return given
    found = default_tokenizer_dir(model)
    if found is None:
        raise FileNotFoundError(f"no tokenizer ({VOCAB_FILE}, {MERGES_FILE}) in {' or '.join(tokenizer_dirs(model))}; "
                                f"pass {TOKENIZER_FLAG} DIR, the folder of the tokenizer the model was trained with")
    return found


def write_run_tokenizer(tokenizer: QwenTokenizer, checkpoint_root: str) -> str:
    """A training run's tokenizer into <checkpoint_root>/tokenizer (vocab.json, merges.txt,
    tokenizer_config.json), where `default_tokenizer_dir` finds it for the run's checkpoints; written whole
    or not at all, replacing an earlier one. Returns the folder."""
    final = os.path.join(checkpoint_root, RUN_TOKENIZER_DIR)
    stage = staging_dir(final)
    try:
        tokenizer.save(stage)
        replace_dir(stage, final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # gone already when the swap succeeded
    return final
