"""A discrete-event model of triad's pipeline (`triad simulate`): pure Python, no torch, and no
import of the services it models (it reads `shared/` only). See docs/simulate.md."""
