"""The evaluation prompt is the official OPSD one, through Qwen3's chat template."""

from phf_megatron.eval.prompts import eval_prompt_ids, eval_user_message
from phf_megatron.tokenizer import load_qwen3_tokenizer


def test_prompt_text_and_chat_template():
    msg = eval_user_message("Find $x$.")
    assert msg == "Find $x$.\n\nPlease reason step by step, and put your final answer within \\boxed{}."
    tok = load_qwen3_tokenizer()
    on = tok.decode(eval_prompt_ids(tok, "Find $x$.", thinking=True))
    off = tok.decode(eval_prompt_ids(tok, "Find $x$.", thinking=False))
    assert on == f"<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"
