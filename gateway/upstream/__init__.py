"""Everything that talks to the model servers: `transport` (the `UpstreamTransport` seam), `http` (the aiohttp
client, forwarding rules), `catalog` (models and revisions), `routing/` (many backends: pool, affinity, health,
breakers).
"""
