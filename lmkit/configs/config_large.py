"""PTB "large" model of Zaremba et al. (2014): 2 x 1500 LSTM, dropout 0.65."""
model = dict(name="lstm", vocab_size=10000, hidden_size=1500, num_layers=2, forget_bias=0.0, init_scale=0.04,
             dropout=0.65)
data = dict(batch_size=20, num_steps=35)
optimization = dict(
    num_epochs=55,
    optimizer="sgd",
    learning_rate=1.0,
    max_grad_norm=10.0,
    lr_decay=1 / 1.15,
    lr_decay_start_epoch=15,  # decay once the epoch index passes 14
)
