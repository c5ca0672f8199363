"""tokenedge CDN integration: edge configs and purge clients."""
