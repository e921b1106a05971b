"""A Hugging Face Qwen3 checkpoint directory, read lazily and validated before any use.

``HFCheckpoint(dir)`` reads ``config.json`` and the safetensors index (or the single
``model.safetensors``), then checks — from the shard headers alone, no tensor data — that every
tensor the config implies is present with the right shape, and that nothing else is there
(e.g. more layers than the config says). Errors name the file, tensor and shapes; a truncated or
corrupt file is an ``InputFileError`` naming it. ``get(name)``
then reads one tensor through ``safe_open`` (memory-mapped), so a conversion holds one tensor at
a time rather than the whole checkpoint.
"""

from __future__ import annotations

import os
from typing import Iterator

import torch

from phf_megatron.models.qwen3_arch import Qwen3Arch
from phf_megatron.convert.qwen3_mapping import hf_shapes
from phf_megatron.errors import InputFileError
from phf_megatron.input_files import missing_hf_config, open_safetensors, read_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "generation_config.json",
                   "chat_template.jinja")


class HFCheckpoint:
    """Lazy, validated reader of a HF Qwen3 safetensors checkpoint."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        if why := missing_hf_config(self.path):
            raise FileNotFoundError(f"hf_dir: {why}")
        config_path = os.path.join(self.path, "config.json")
        self.config = read_json(config_path)
        try:
            self.arch = Qwen3Arch.from_hf(self.config)
        except ValueError as err:  # the config names a model we cannot convert
            raise InputFileError(config_path, str(err)) from None
        self.weight_map = self._weight_map()
        self._handles: dict[str, object] = {}
        self._validate()

    def _weight_map(self) -> dict[str, str]:
        index = os.path.join(self.path, INDEX_FILE)
        if os.path.isfile(index):
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise InputFileError(index, "no 'weight_map'")
        elif os.path.isfile(os.path.join(self.path, SINGLE_FILE)):
            with open_safetensors(os.path.join(self.path, SINGLE_FILE)) as f:
                weight_map = {k: SINGLE_FILE for k in f.keys()}
        else:
            raise FileNotFoundError(f"hf_dir: neither {INDEX_FILE} nor {SINGLE_FILE} in {self.path}")
        missing_files = sorted({f for f in weight_map.values() if not os.path.isfile(os.path.join(self.path, f))})
        if missing_files:
            raise FileNotFoundError(f"hf_dir: shard file(s) listed in the index are missing: {missing_files}")
        return weight_map

    def _validate(self) -> None:
        expected = hf_shapes(self.arch)
        optional = {"lm_head.weight"} if self.arch.tie_word_embeddings else set()
        missing = sorted(set(expected) - set(self.weight_map))
        if missing:
            raise InputFileError(self.path, f"{len(missing)} tensor(s) the config implies are not in the "
                                            f"checkpoint (partial shards?), e.g. {missing[:5]}")
        unexpected = sorted(set(self.weight_map) - set(expected) - optional)
        if unexpected:
            raise InputFileError(self.path, f"{len(unexpected)} tensor(s) not implied by config.json "
                                            f"(config contradicts the weights?), e.g. {unexpected[:5]}")
        by_file: dict[str, list[str]] = {}
        for name, file in self.weight_map.items():
            by_file.setdefault(file, []).append(name)
        for file, names in by_file.items():
            with open_safetensors(os.path.join(self.path, file)) as f:
                present = set(f.keys())
                for name in names:
                    if name not in present:
                        raise InputFileError(os.path.join(self.path, file),
                                             f"the index lists {name} but the shard does not hold it")
                    shape = tuple(f.get_slice(name).get_shape())
                    want = expected.get(name, (self.arch.vocab_size, self.arch.hidden_size))
                    if shape != want:
                        raise InputFileError(os.path.join(self.path, file),
                                             f"{name} has shape {shape}, config.json implies {want}")
        if "lm_head.weight" in self.weight_map and self.arch.tie_word_embeddings:
            # A tied checkpoint may store the head too, but then it must be the embedding.
            if not torch.equal(self.get("lm_head.weight"), self.get("model.embed_tokens.weight")):
                raise InputFileError(self.path, "config.json says tie_word_embeddings=true but lm_head.weight "
                                                "differs from model.embed_tokens.weight (an untied model?)")

    def get(self, name: str) -> torch.Tensor:
        """One tensor, read from its shard."""
        if name not in self.weight_map:
            raise KeyError(f"{name}: not in the checkpoint at {self.path}")
        file = self.weight_map[name]
        if file not in self._handles:
            self._handles[file] = open_safetensors(os.path.join(self.path, file))
        return self._handles[file].get_tensor(name)

    def dtype(self) -> torch.dtype:
        return self.get("model.norm.weight").dtype

    def names(self) -> Iterator[str]:
        return iter(hf_shapes(self.arch))

    def tokenizer_files(self) -> list[str]:
        return [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(self.path, f))]
