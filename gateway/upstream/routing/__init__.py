"""Many upstreams: a pool of HTTP backends behind the one `UpstreamTransport` seam.

`pool.UpstreamPool` routes each miss to one backend (prefix affinity, load-guarded, else least outstanding
requests per weight), retries once elsewhere when nothing reached the client yet, ejects failing backends
(`breaker`), probes them (`health`), and merges their `/v1/models` catalogs (`book`). A single configured URL
never builds a pool: the plain `gateway.upstream.http.Upstream` keeps today's path and cost.
"""
