"""triad's orchestrator: rollouts, rewards, advantages, the async-level guard, batches."""
