"""Many upstreams: a pool of HTTP backends behind the one `UpstreamTransport` seam.

`pool.UpstreamPool` routes each miss to one backend (by default the least expected time to first token, `cost`,
from each engine's `pace`; placements shared with other workers and replicas through Redis, `share`), retries once
elsewhere when nothing reached the client yet, ejects failing backends
(`breaker`), probes them (`health`), and merges their `/v1/models` catalogs (`book`). A single configured URL
never builds a pool: the plain `gateway.upstream.http.Upstream` keeps today's path and cost.
"""
