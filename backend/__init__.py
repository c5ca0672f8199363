"""tokenedge backend: the co-deployed OpenAI-compatible model server (DESIGN §8)."""
