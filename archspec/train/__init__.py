"""The shared training loop: data, optimisation, checkpoints, distributed."""
