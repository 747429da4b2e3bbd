"""PTB "small" model of Zaremba et al. (2014), as in Texar's PTB example.

2-layer LSTM, 200 units, no dropout; 13 epochs of SGD at learning rate 1.0,
halved every epoch from epoch index 4 on. Valid perplexity about 120 after
13 epochs on one worker.
"""
model = dict(name="lstm", vocab_size=10000, hidden_size=200, num_layers=2, forget_bias=0.0, init_scale=0.1,
             dropout=0.0)
data = dict(
    batch_size=20,  # global batch: split across the workers
    num_steps=20,
)
optimization = dict(
    num_epochs=13,
    optimizer="sgd",
    learning_rate=1.0,
    max_grad_norm=5.0,
    lr_decay=0.5,
    lr_decay_start_epoch=4,  # decay once the epoch index passes 3
)
