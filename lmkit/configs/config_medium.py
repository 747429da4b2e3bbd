"""PTB "medium" model of Zaremba et al. (2014): 2 x 650 LSTM, dropout 0.5."""
model = dict(name="lstm", vocab_size=10000, hidden_size=650, num_layers=2, forget_bias=0.0, init_scale=0.05,
             dropout=0.5)
data = dict(batch_size=20, num_steps=35)
optimization = dict(
    num_epochs=39,
    optimizer="sgd",
    learning_rate=1.0,
    max_grad_norm=5.0,
    lr_decay=0.8,
    lr_decay_start_epoch=6,  # decay once the epoch index passes 5
)
