"""triad's trainer: torchrun + FSDP2, batches from the run directory, weights back to it."""
