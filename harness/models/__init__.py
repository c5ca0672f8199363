"""Models made here, nothing downloaded: the tiny random-weight Llama of the backend tests and random-weight GGUFs
of real shapes (speed only)."""
