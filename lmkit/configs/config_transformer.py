"""A small GPT-2-style transformer language model for PTB.

4 layers, 256 units, 4 heads, pre-layer-norm, tied embeddings; Adam with a
linear warmup and cosine decay.
"""
model = dict(
    name="transformer",
    vocab_size=10000,
    hidden_size=256,
    num_layers=4,
    num_heads=4,
    ffn_dim=1024,
    max_positions=128,
    pre_layer_norm=True,
    tie_weights=True,
    init_scale=0.05,
    dropout=0.1,
)
data = dict(batch_size=32, num_steps=64)
optimization = dict(
    num_epochs=10,
    optimizer="adam",
    optimizer_params={"beta1": 0.9, "beta2": 0.98, "epsilon": 1e-9},
    learning_rate=5e-4,
    max_grad_norm=1.0,
    warmup_epochs=1.0,
    schedule="cosine",
    schedule_params={"warmup_start_factor": 0.0},  # warm up from 0 even on one worker
)
