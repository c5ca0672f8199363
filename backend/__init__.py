"""tokenedge backend: the co-deployed OpenAI-compatible model server (design §8)."""
