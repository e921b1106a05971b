"""The toy task's tiny Qwen3: a compact tokenizer, a random model, and its supervised warm-up.

``prepare_toy(out_dir, ...)`` writes everything the toy run needs and nothing more:

* ``hf/``: a HF Qwen3 directory (config, safetensors, compact tokenizer with the Qwen3 chat
  template) holding the model *after* the supervised warm-up on ``seen`` cells
  (``docs/toy_task.md``): it copies a reference given in context and knows half of the table;
* ``train.jsonl``: training problems of all cells with reference solutions (the OPSD set);
* ``heldout.jsonl``: held-out problems with answers (for ``tools/eval_avg_at_k.py``).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch

from ..data import PromptConfig, build_distill_batch, build_prompt_pair
from ..data.prompts import render_student_prompt, render_teacher_prompt
from ..data.toy import TOY_PROMPT_CONFIG, ToySplit, make_toy_split, toy_response
from ..output_files import atomic_dir, output_modes, write_jsonl
from ..tokenizer import load_qwen3_tokenizer
from .tokenizer import build_compact_tokenizer, check_equivalent


@dataclass(frozen=True)
class ToyModelConfig:
    layers: int = 2
    hidden: int = 64
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 32
    vocab_multiple: int = 64
    """pad the vocabulary to a multiple of this (tensor parallelism splits it evenly)."""


def toy_texts(split: ToySplit, tokenizer, prompt_config: PromptConfig) -> list[str]:
    """Every text the toy run tokenizes: both rendered prompts and the response of each problem."""
    texts = []
    for a, b in split.train + split.heldout:
        row = split.rows([(a, b)])[0]
        texts += [render_student_prompt(tokenizer, row.problem, prompt_config),
                  render_teacher_prompt(tokenizer, row.problem, row.solution, prompt_config), toy_response(a, b)]
    return texts


def make_toy_model(hf_dir: str, split: ToySplit, cfg: ToyModelConfig, prompt_config: PromptConfig, seed: int) -> None:
    """A random-init tiny Qwen3 with the compact tokenizer, saved as a HF directory."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    texts = toy_texts(split, load_qwen3_tokenizer(), prompt_config)
    size = build_compact_tokenizer(texts, hf_dir)
    check_equivalent(texts[:: max(1, len(texts) // 500)], hf_dir)
    tok = load_qwen3_tokenizer(hf_dir)
    vocab = -(-size // cfg.vocab_multiple) * cfg.vocab_multiple
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=cfg.hidden, intermediate_size=4 * cfg.hidden,
                         num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                         num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, max_position_embeddings=512,
                         tie_word_embeddings=True, rope_theta=10000.0,
                         bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                         eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[config.eos_token_id, config.bos_token_id],
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(hf_dir)
    output_modes(hf_dir)  # save_pretrained's weight files are owner-only


def ramped_adamw(model, lr: float, ramp: int):
    """AdamW with a linear learning-rate ramp: a fresh Adam's first steps move every weight by ~lr."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(1, ramp)))


def supervised_step(model, opt, schedule, batch) -> float:
    """One warm-up step: cross-entropy of the correct response after both prompts (student, teacher)."""
    loss = 0.0
    for side in ("student", "teacher"):
        logits = model(batch.input_ids(side), attention_mask=batch.attention_mask(side).long()).logits
        loss = loss + torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), batch.shifted_labels(side).flatten(), ignore_index=-100) / 2
    opt.zero_grad()
    loss.backward()
    opt.step()
    schedule.step()
    return loss.item()


def warm_up(hf_dir: str, split: ToySplit, prompt_config: PromptConfig, *, steps: int = 300, batch: int = 64,
            lr: float = 3e-3, ramp: int = 10, seed: int = 0, log=print) -> None:
    """Supervised warm-up on ``seen`` cells, both prompt formats → the correct response; saved in place."""
    from transformers import Qwen3ForCausalLM

    tok = load_qwen3_tokenizer(hf_dir)
    model = Qwen3ForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").train()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pairs = split.warmup_pairs()
    memo: dict = {}

    def encoded(a, b):
        if (a, b) not in memo:
            row = split.rows([(a, b)])[0]
            pp = build_prompt_pair(tok, row.problem, row.solution, prompt_config)
            memo[(a, b)] = (pp.student_ids, pp.teacher_ids, tok(toy_response(a, b), add_special_tokens=False)["input_ids"] + [eos])
        return memo[(a, b)]

    opt, schedule = ramped_adamw(model, lr, ramp)
    rng = random.Random(seed)
    for step in range(steps):
        s, t, y = zip(*(encoded(*pairs[rng.randrange(len(pairs))]) for _ in range(batch)))
        loss = supervised_step(model, opt, schedule, build_distill_batch(s, t, y, pad_id=tok.pad_token_id))
        if step % 50 == 0 or step == steps - 1:
            log({"phase": "warmup", "step": step + 1, "of": steps, "loss": round(loss, 5)})
    model.save_pretrained(hf_dir)
    output_modes(hf_dir)  # save_pretrained's weight files are owner-only


def prepare_toy(out_dir: str, *, seed: int = 0, warmup_steps: int = 300, model_config: ToyModelConfig = ToyModelConfig(),
                prompt_config: PromptConfig = TOY_PROMPT_CONFIG, log=print) -> dict[str, str]:
    """Write ``train.jsonl``, ``heldout.jsonl`` and, last, ``hf/`` (warmed-up model) into ``out_dir``.

    Each appears complete or not at all (``output_files``): ``hf/model.safetensors`` existing means
    the toy is ready (what ``examples/train_phf_tiny.sh`` checks).
    """
    split = make_toy_split(seed)
    paths = {"hf_dir": os.path.join(out_dir, "hf"), "train": os.path.join(out_dir, "train.jsonl"),
             "heldout": os.path.join(out_dir, "heldout.jsonl")}
    write_jsonl(paths["train"], ({"problem": r.problem, "solution": r.solution, "answer": r.answer}
                                 for r in split.rows(split.train)))
    write_jsonl(paths["heldout"], ({"id": f"toy-{a}+{b}", "problem": r.problem, "answer": r.answer}
                                   for (a, b), r in zip(split.heldout, split.rows(split.heldout))))
    with atomic_dir(paths["hf_dir"]) as hf_dir:
        make_toy_model(hf_dir, split, model_config, prompt_config, seed)
        warm_up(hf_dir, split, prompt_config, steps=warmup_steps, seed=seed, log=log)
    return paths
