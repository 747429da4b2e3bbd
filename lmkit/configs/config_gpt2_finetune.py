"""Fine-tuning a pretrained GPT-2 (``lmkit train --init_from <folder or hf:gpt2>``) on your text.

The model's sizes below are placeholders: ``--init_from`` replaces them with
the checkpoint's (n_layer, n_head, n_embd, n_positions, vocab_size) and its
tokenizer. What stays is the fine-tuning recipe: AdamW with weight decay, a
warmup over the first tenth of an epoch and a cosine decay, windows of 128
tokens, 8 of them per step (split across the workers).
"""
model = dict(
    name="gpt2",
    vocab_size=50257,
    hidden_size=768,
    num_layers=12,
    num_heads=12,
    max_positions=1024,
    tie_weights=True,
    init_scale=0.02,
    dropout=0.1,
)
data = dict(batch_size=8, num_steps=128)
optimization = dict(
    num_epochs=3,
    optimizer="adamw",
    optimizer_params={"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "weight_decay": 0.01},
    learning_rate=5e-5,
    max_grad_norm=1.0,
    warmup_epochs=0.1,
    schedule="cosine",
    schedule_params={"warmup_start_factor": 0.0},
)
