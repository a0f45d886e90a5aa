"""The contract between triad's services, in code (see docs/design.md).

Imports only the standard library, pydantic and pyarrow, so every service,
including a torch-free orchestrator, can use it.
"""
