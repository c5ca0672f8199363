"""Cache tiers: L1 in-process memory, L2 shared Redis, Redis Cluster or Memcached (behind the protocols of base.py),
the tiered reader/writer over both, the shared hot-key record (`hotrecord`), and `coherence/`: how the tiers of every
worker and replica stay coherent (the invalidation bus, pushed model revisions)."""
