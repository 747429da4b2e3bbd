"""GPT-2 small (124M parameters) from scratch, planned in steps as nanoGPT trains it on OpenWebText.

    lmkit train --config config_gpt2_124m --tokenizer hf:gpt2 --train_file 'owt/train/*.parquet' \\
        --valid_file owt/val.parquet --model_dir runs/gpt2_124m

The real GPT-2 small: GPT-2's own tokenizer (``--tokenizer hf:gpt2``, its
50,257 ids; the embedding is padded to 50,304, a multiple of 64, as nanoGPT
pads it), a 1,024-token context, 12 layers of 768 units and 12 heads, GELU,
pre-layer-norm, tied embeddings (``lmkit export`` writes a Hugging Face
GPT-2 folder). nanoGPT's recipe (its config/train_gpt2.py): 491,520 tokens a
step (480 windows of 1,024: 12 a micro-batch, 40 micro-batches: on 8 GPUs pass
``--grad_accum_steps 5``), 600,000 steps (about 295B tokens), a warmup of
2,000 steps, a cosine decay to 6e-5, AdamW (0.9, 0.95, weight decay 0.1),
clipping at 1.0, no dropout, bfloat16 arithmetic; 200 batches of validation
data every 1,000 steps. A GPU config: on a CPU one step takes minutes.
"""
model = dict(
    name="gpt2",
    vocab_size=50304,
    hidden_size=768,
    num_layers=12,
    num_heads=12,
    max_positions=1024,
    tie_weights=True,
    init_scale=0.02,
    dropout=0.0,
)
data = dict(batch_size=480, num_steps=1024, eval_batch_size=12)
optimization = dict(
    max_steps=600000,
    warmup_steps=2000,
    min_lr=6e-5,
    learning_rate=6e-4,
    schedule="cosine",
    optimizer="adamw",
    optimizer_params={"beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8, "weight_decay": 0.1},
    max_grad_norm=1.0,
    grad_accum_steps=40,
)
compute = dict(precision="mixed_bfloat16")
run = dict(eval_every_steps=1000, eval_steps=200, log_every_steps=10)
