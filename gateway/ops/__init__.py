"""What operators read: `metrics` (the Prometheus families), `routing_metrics`, `tally` (batched counters), `timing`
(stage timers), `accesslog`, `ratelog` (rate-limited warnings), `reqrecord` (the per-request record), and
`dashboard/` (its history rings, hot keys, summaries and the sampler).
"""
