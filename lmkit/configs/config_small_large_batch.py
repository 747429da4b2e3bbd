"""config_small for many workers: the learning rate grows with the number of
workers (linear scaling), ramps up over the first epoch (Goyal et al. 2017),
and LARC keeps each layer's update within a trust ratio (OpenSeq2Seq)."""
model = dict(name="lstm", vocab_size=10000, hidden_size=200, num_layers=2, forget_bias=0.0, init_scale=0.1,
             dropout=0.0)
data = dict(batch_size=80, num_steps=20)
optimization = dict(
    num_epochs=13,
    optimizer="sgd",
    learning_rate=1.0,
    max_grad_norm=5.0,
    lr_decay=0.5,
    lr_decay_start_epoch=4,
    lr_scaling="sqrt",
    warmup_epochs=1.0,
    larc_params={"larc_eta": 0.002, "larc_mode": "clip", "min_update": 1e-7, "epsilon": 1e-7},
)
