"""Cache tiers: L1 in-process memory, L2 shared Redis, and the tiered reader/writer over both."""
