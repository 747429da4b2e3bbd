"""An LSTM encoder-decoder with Luong attention that trains in minutes on a CPU.

A bidirectional 1-layer LSTM encoder of 128 units a direction, a 1-layer
LSTM decoder with Luong (multiplicative) attention and input feeding, one
vocabulary with shared embeddings; Adam. ``--set model.attention=bahdanau
--set model.cell=gru`` picks Bahdanau attention or GRUs (``docs/seq2seq.md``).
"""
model = dict(
    name="rnn_seq2seq",
    cell="lstm",
    attention="luong",
    bidirectional=True,
    vocab_size=8000,  # sentencepiece's size; the word, char and byte tokenizers set it from the text
    hidden_size=128,
    num_layers=1,
    max_positions=64,  # the longest target, its start or end id included
    max_source_positions=64,  # the longest source: lmkit's bound (the recurrent encoder itself has no limit)
    share_embeddings=True,
    tie_weights=True,
    init_scale=0.1,
    dropout=0.1,
)
data = dict(
    tokenizer="word",
    share_vocab=True,
    batch_size=64,
    num_steps=64,  # a language model's window; pairs have their own lengths (max_source_length, max_target_length)
)
optimization = dict(num_epochs=20, optimizer="adam", learning_rate=2e-3, max_grad_norm=5.0, schedule="constant")
