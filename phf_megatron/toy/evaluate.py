"""Greedy accuracy of a toy model on held-out problems, with and without the reference.

The four numbers of ``docs/toy_task.md``: ``noref_seen``, ``noref_unseen`` (the one PHF must
raise: held-out problems of cells the warm-up never showed), ``ref_seen``, ``ref_unseen``.
"""

from __future__ import annotations

import torch

from ..data import PromptConfig, build_prompt_pair
from ..data.toy import TOY_PROMPT_CONFIG, ToySplit, grade_toy
from ..tokenizer import load_qwen3_tokenizer


def load_toy_model(hf_dir: str, adapter_dir: str | None = None):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    if adapter_dir:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    return model.eval()


#: Greedy tokens per held-out answer: the reference solution's layout (18 tokens, which the SFT row
#: learns to write) and its end token, not only the response's (11): with 14 an SFT-trained model was
#: cut off before its ``\boxed{}`` and scored 0 on cells it answers (the toy table, 2026-11-26).
EVAL_MAX_NEW_TOKENS = 20


@torch.no_grad()
def greedy_accuracy(model, tokenizer, split: ToySplit, pairs, with_reference: bool,
                    prompt_config: PromptConfig = TOY_PROMPT_CONFIG, max_new_tokens: int = EVAL_MAX_NEW_TOKENS) -> float:
    rows = split.rows(pairs)
    prompts = [build_prompt_pair(tokenizer, r.problem, r.solution, prompt_config) for r in rows]
    ids = torch.tensor([p.teacher_ids if with_reference else p.student_ids for p in prompts])
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    return sum(grade_toy(t, r.answer) for t, r in zip(texts, rows)) / len(rows)


def toy_report(hf_dir: str, split: ToySplit, adapter_dir: str | None = None) -> dict[str, float]:
    """The four accuracies, with a bar over them on stderr."""
    from ..startup import progress_bar

    model, tok = load_toy_model(hf_dir, adapter_dir), load_qwen3_tokenizer(hf_dir)
    pairs = {seen: split.heldout_by_cell(seen) for seen in (True, False)}
    out = {}
    sets = [(seen, ref) for seen in (True, False) for ref in (False, True)]
    for seen, ref in progress_bar(sets, total=len(sets), desc="toy eval", unit="set"):
        name = f"{'ref' if ref else 'noref'}_{'seen' if seen else 'unseen'}"
        out[name] = greedy_accuracy(model, tok, split, pairs[seen], ref)
    return out
