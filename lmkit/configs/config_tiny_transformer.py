"""A tiny character-level GPT for CPUs: nanoGPT's "baby GPT" CPU setting.

4 layers, 128 units, 4 heads, a 64-character window, batch 12: about 0.8M
parameters with a 65-character vocabulary (a plays corpus). Trains in
minutes on a laptop CPU; on such small models a step's fixed cost (op
dispatch, the host loop) is a large part of the time, which is what
``benchmarks/train_throughput.py`` measures with it.
"""
model = dict(
    name="transformer",
    vocab_size=65,
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    ffn_dim=512,
    max_positions=64,
    pre_layer_norm=True,
    tie_weights=True,
    init_scale=0.02,
    dropout=0.0,
)
data = dict(batch_size=12, num_steps=64)
optimization = dict(
    num_epochs=10,
    optimizer="adamw",
    optimizer_params={"beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8, "weight_decay": 0.1},
    learning_rate=1e-3,
    max_grad_norm=1.0,
    warmup_epochs=0.1,
    schedule="cosine",
    schedule_params={"warmup_start_factor": 0.0},
)
