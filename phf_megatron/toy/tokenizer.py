"""A compact Qwen3 tokenizer for the toy task: the real BPE, restricted to the tokens it needs.

The toy task's texts (chat-templated prompts, reference solutions, responses) use ~100 distinct
Qwen3 tokens. A tiny model with the full 151,936-entry vocabulary would spend nearly all of its
CPU time in the output layer and the JSD over the vocabulary, so the toy model gets a vocabulary
of a few hundred entries instead: every token the toy texts produce, every intermediate token of
the BPE merges that build them, the 256 byte-level symbols and Qwen3's special tokens, renumbered
densely. The merges keep Qwen3's ranks, so on the toy texts the compact tokenizer splits text
exactly as the real one does (``check_equivalent`` verifies it on every text it was built from):
BPE applies the lowest-rank applicable merge, and every merge the real tokenizer applies to these
texts is one of the kept merges. The files are a normal HF tokenizer directory, so the trainer,
vLLM and transformers load them like any other (chat template included).
"""

from __future__ import annotations

import json
import os
from typing import Iterable

from ..tokenizer import load_qwen3_tokenizer, shipped_tokenizer_dir


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen byte-level alphabet: each byte → one printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _merge_closure(tokens: set[str], merges: list[tuple[str, str]]) -> tuple[set[str], list[int]]:
    """Tokens plus every BPE part that builds them; the ranks of the merges involved."""
    producers: dict[str, list[int]] = {}
    for rank, (a, b) in enumerate(merges):
        producers.setdefault(a + b, []).append(rank)
    keep, ranks, stack = set(), set(), list(tokens)
    while stack:
        tok = stack.pop()
        if tok in keep:
            continue
        keep.add(tok)
        for rank in producers.get(tok, ()):
            a, b = merges[rank]
            ranks.add(rank)
            stack += [a, b]
    return keep, sorted(ranks)


def build_compact_tokenizer(texts: Iterable[str], out_dir: str, source_dir: str | None = None) -> int:
    """Write a compact Qwen3 tokenizer covering ``texts`` into ``out_dir``; returns its size
    (regular + special tokens). ``source_dir``: the full tokenizer (default: the shipped one)."""
    source_dir = source_dir or shipped_tokenizer_dir()
    full = load_qwen3_tokenizer(source_dir)
    with open(os.path.join(source_dir, "tokenizer.json")) as f:
        spec = json.load(f)
    model = spec["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    id_to_token = {i: t for t, i in model["vocab"].items()}
    special_ids = {t["id"] for t in spec["added_tokens"]}
    used = {id_to_token[i] for text in texts for i in full(text, add_special_tokens=False)["input_ids"]
            if i not in special_ids}
    keep, ranks = _merge_closure(used | set(_bytes_to_unicode().values()), merges)
    regular = sorted(keep, key=lambda t: model["vocab"][t])
    vocab = {t: i for i, t in enumerate(regular)}
    remap = {}
    for tok in spec["added_tokens"]:
        remap[tok["id"]] = len(vocab) + len(remap)
        tok["id"] = remap[tok["id"]]
    model["vocab"] = vocab
    model["merges"] = [list(merges[r]) for r in ranks]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(spec, f, ensure_ascii=False)
    with open(os.path.join(source_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    config["added_tokens_decoder"] = {str(remap[int(k)]): v for k, v in config.get("added_tokens_decoder", {}).items()}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    return len(vocab) + len(remap)


def check_equivalent(texts: Iterable[str], compact_dir: str, source_dir: str | None = None) -> None:
    """Raise unless the compact tokenizer splits every text into the same token strings."""
    full, compact = load_qwen3_tokenizer(source_dir or shipped_tokenizer_dir()), load_qwen3_tokenizer(compact_dir)
    for text in texts:
        a = full.convert_ids_to_tokens(full(text, add_special_tokens=False)["input_ids"])
        b = compact.convert_ids_to_tokens(compact(text, add_special_tokens=False)["input_ids"])
        if a != b:
            raise ValueError(f"compact tokenizer in {compact_dir}: splits {text[:60]!r} as {b[:12]} "
                             f"instead of {a[:12]}")
