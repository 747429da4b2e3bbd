"""A small transformer encoder-decoder that trains in minutes on a CPU.

2 encoder and 2 decoder layers of 128 units, 4 heads, pre-layer-norm, one
vocabulary for source and target with shared and tied embeddings; Adam with
a short warmup. Trains on line-aligned pairs (``--source_file``,
``--target_file``): translation, summarization, any transduction of
sentences up to 63 tokens (``docs/seq2seq.md``).
"""
model = dict(
    name="transformer_seq2seq",
    vocab_size=8000,  # sentencepiece's size; the word, char and byte tokenizers set it from the text
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    ffn_dim=512,
    max_positions=64,  # the longest target, its start or end id included
    max_source_positions=64,
    pre_layer_norm=True,
    share_embeddings=True,
    tie_weights=True,
    init_scale=0.05,
    dropout=0.1,
)
data = dict(
    tokenizer="word",
    share_vocab=True,
    batch_size=64,
    num_steps=64,  # a language model's window; pairs have their own lengths (max_source_length, max_target_length)
)
optimization = dict(
    num_epochs=20,
    optimizer="adam",
    optimizer_params={"beta1": 0.9, "beta2": 0.98, "epsilon": 1e-9},
    learning_rate=1e-3,
    max_grad_norm=1.0,
    warmup_epochs=1.0,
    schedule="cosine",
    schedule_params={"warmup_start_factor": 0.0},
)
