"""tokenedge gateway: an OpenAI-compatible caching reverse proxy (see shared DESIGN §1-§7)."""
