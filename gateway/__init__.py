"""tokenedge gateway: an OpenAI-compatible caching reverse proxy (see shared design §1-§7)."""
