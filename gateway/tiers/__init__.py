"""Cache tiers: L1 in-process memory, L2 shared Redis or Memcached (behind the protocols of base.py), and the
tiered reader/writer over both."""
