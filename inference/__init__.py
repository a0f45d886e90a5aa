"""triad's inference service: vLLM's OpenAI server plus the `/admin` routes."""
