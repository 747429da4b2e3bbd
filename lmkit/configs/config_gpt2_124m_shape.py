"""A transformer of GPT-2 small's shape (124M parameters with its vocabulary), trained from scratch.

12 layers, 768 units, 12 heads, a 1024-token context, pre-layer-norm, tied
embeddings; AdamW with warmup and cosine decay, as nanoGPT trains it. With
this config's 10k vocabulary it has 93M parameters. A GPU config: one step
is 8 x 1024 tokens (``benchmarks/train_throughput.py --device gpu`` measures
it and its model FLOPs utilisation); on a CPU a step takes seconds.
"""
model = dict(
    name="transformer",
    vocab_size=10000,
    hidden_size=768,
    num_layers=12,
    num_heads=12,
    ffn_dim=3072,
    max_positions=1024,
    pre_layer_norm=True,
    tie_weights=True,
    init_scale=0.02,
    dropout=0.0,
)
data = dict(batch_size=8, num_steps=1024)
optimization = dict(
    num_epochs=1,
    optimizer="adamw",
    optimizer_params={"beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8, "weight_decay": 0.1},
    learning_rate=6e-4,
    max_grad_norm=1.0,
    warmup_epochs=0.1,
    schedule="cosine",
    schedule_params={"warmup_start_factor": 0.0},
)
