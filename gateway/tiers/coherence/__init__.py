"""Cache coherence across workers and replicas: the invalidation bus and the pushed model revisions."""
