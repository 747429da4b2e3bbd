"""A tiny character-level GPT for CPUs: nanoGPT's "baby GPT" CPU recipe.

4 layers, 128 units, 4 heads, a 64-character window, batch 12: about 0.8M
parameters with a 65-character vocabulary (a plays corpus). nanoGPT's
README trains it on a CPU for 2000 steps; so does this config, with the
same model and recipe: no biases, GPT-2's initialisation, exact GELU,
windows at random offsets, the loss per token, AdamW (0.9, 0.99) with weight
decay 0.1 on the matrices and embedding tables only, clipping at 1.0, 100
warmup steps from 1e-3 / 101 and a cosine to 1e-4 at step 2000.
``benchmarks/nanogpt_side_by_side.py`` trains both on the same ids
(docs/nanogpt.md). The step is compiled with XLA even on a CPU
(``jit_compile = True``): on 2 threads it ran this recipe at 1.06x
nanoGPT's steps/s, the plain step at 0.96x, with the same losses. Trains
in minutes on a laptop CPU; on such small models a step's fixed cost (op
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
    initialization="gpt2",  # normal(0, 0.02), residual projections / sqrt(2 * layers)
    use_bias=False,
    output_bias=False,
    activation="gelu_exact",
    dropout=0.0,
)
data = dict(batch_size=12, num_steps=64, sampling="random")
optimization = dict(
    max_steps=2000,
    warmup_steps=100,
    schedule="cosine",
    min_lr=1e-4,
    optimizer="adamw",
    optimizer_params={"beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8, "weight_decay": 0.1,
                      "exclude_from_weight_decay": "vectors"},
    learning_rate=1e-3,
    max_grad_norm=1.0,
    loss_reduction="mean",
)
compute = dict(jit_compile=True)  # XLA on CPUs too: faster on this recipe (docs/nanogpt.md)
