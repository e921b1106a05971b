"""A small demo of the PHF objective on a tiny random Qwen3 (CPU, seconds).

    python examples/objective_demo.py

A student sequence [prompt ; rollout] and a privileged teacher sequence
[prompt + reference ; rollout] share the rollout tokens; the flow loss compares the hidden
transitions of both at a window of rollout positions at every layer, the JSD their next-token
distributions on the rollout.
"""

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from phf_megatron.objectives import ObjectiveConfig, hidden_flow_loss, opsd_loss, phf_objective, select_window


def main() -> None:
    torch.manual_seed(0)
    cfg = ObjectiveConfig()
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=32))
    rollout = torch.randint(0, 256, (2, 40))
    student_ids = torch.cat([torch.randint(0, 256, (2, 10)), rollout], 1)  # plain prompt (10 tokens)
    teacher_ids = torch.cat([torch.randint(0, 256, (2, 25)), rollout], 1)  # prompt + reference (25 tokens)

    out_s = model(student_ids, output_hidden_states=True)
    with torch.no_grad():
        out_t = model(teacher_ids, output_hidden_states=True)

    generated = torch.zeros(2, 40, dtype=torch.bool)
    generated[0, :40] = True
    generated[1, :17] = True  # a shorter rollout
    positions, valid = select_window(generated, budget=16)
    # hidden_states[0] is the embedding output; layers 1..L are the transformer layers' outputs.
    # (HF applies the final norm to the last entry; the trainer captures it before the norm.)
    rows = lambda hs, offset: torch.stack([h[torch.arange(2)[:, None], positions + offset] for h in hs[1:]])
    flow = hidden_flow_loss(rows(out_s.hidden_states, 10), rows(out_t.hidden_states, 25), valid, variant=cfg.flow_variant)
    # logits at t predict token t+1: the rollout tokens are predicted from the position before each.
    jsd = opsd_loss(out_s.logits[:, 9:-1], out_t.logits[:, 24:-1], generated, beta=cfg.jsd_beta,
                    temperature=cfg.jsd_temperature, clip=cfg.jsd_clip)
    loss = phf_objective(jsd, flow, cfg.flow_alpha)
    loss.backward()
    grad_norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None))
    print(f"window {tuple(positions.shape)}  L_OPSD {jsd.item():.5f}  L_flow {flow.item():.5f}  "
          f"L_PHF {loss.item():.5f}  |grad| {grad_norm.item():.4f}")


if __name__ == "__main__":
    main()
