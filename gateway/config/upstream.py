"""The upstream's config section (`[upstream]`, with `[[upstream.backends]]`): one model server or many.

Apart from `gateway.config.sections` (which it builds on) so that file stays one screenful per section; the routing
fields (`routing_policy`, the deadlines, admission) are read by `gateway.upstream.routing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.config.sections import require


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """One model server behind the router (`[[upstream.backends]]`)."""

    url: str = ""  # required: http(s)://host:port of an OpenAI-compatible server
    weight: float = 1.0  # share of misses relative to the others (least outstanding requests / weight)
    models: tuple[str, ...] = ()  # only these models go here; empty: whatever its /v1/models lists
    name: str = ""  # what X-Tokenedge-Backend and the metrics call it; empty: its host:port
    slots: int = 0  # requests it runs at once (llama-server -np); 0: what its /slots reports, else 1
    prefill_tokens_per_s: float = 2000.0  # its prompt processing rate, for the expected time to first token
    max_outstanding: int = 0  # admission: at most this many in flight from this process (0: no cap)

    def __post_init__(self) -> None:
        require(
            self.url.startswith(("http://", "https://")),
            f"upstream backend url must be http(s)://..., got {self.url!r}",
        )
        require(self.weight > 0, f"upstream backend {self.url}: weight must be > 0, got {self.weight}")
        require(self.slots >= 0, f"upstream backend {self.url}: slots must be >= 0")
        require(
            self.prefill_tokens_per_s > 0, f"upstream backend {self.url}: prefill_tokens_per_s must be > 0"
        )
        require(self.max_outstanding >= 0, f"upstream backend {self.url}: max_outstanding must be >= 0")


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    url: str | tuple[str, ...] = "http://127.0.0.1:8000"  # or a list (a comma-separated string in the env)
    api_key: str = ""  # when set, injected upstream instead of forwarding the client's Authorization
    relay_routes: tuple[
        str, ...
    ] = ()  # extra /v1/ paths relayed untouched ("files", "files/*", "batches/**")
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 120.0  # per socket read (sock_read), never a total: long generations are not cut
    model_revision: str = ""  # used when the upstream's /v1/models reports none
    models_ttl_s: float = 30.0
    max_connections: int = 256
    revision_push: bool = (
        True  # follow the upstream's revision stream (GET /tokenedge/revisions) when offered
    )
    # Many backends (gateway/upstream/routing): [[upstream.backends]] tables win over `url` when present.
    backends: tuple[BackendConfig, ...] = ()
    health_path: str = (
        "/v1/models"  # GET every health_interval_s on each backend ("" turns active checks off)
    )
    health_interval_s: float = 2.0
    eject_after_failures: int = 3  # consecutive connect failures or 5xx answers eject a backend
    eject_base_s: float = 1.0  # first ejection lasts this long, doubling per repeat up to eject_max_s
    eject_max_s: float = 30.0
    retry_other_backend: bool = True  # a failure before any byte reached the client is retried once elsewhere
    affinity: bool = True  # prefix affinity for misses; false: least outstanding requests only
    affinity_block_chars: int = 64  # prompt text is hashed in chained blocks of this many characters
    affinity_block_tokens: int = 16  # token ids (the binary token path) in blocks of this many ids
    affinity_table_blocks: int = 200000  # router-side block-chain hash -> backend entries kept (LRU)
    affinity_load_factor: float = (
        1.25  # skip the affine backend above max(factor x mean, mean + 1) outstanding
    )
    routing_policy: Literal["cost", "affinity", "least_loaded", "round_robin", "random"] = (
        "cost"  # cost: the least expected time to first token (queue wait + unmatched prefill); others for A/B
    )
    queue_beside_idle_share: float = 0.15  # cost: queue beside an idle engine at most this share of busy time
    # cost: a batch of two or more on an engine that batches, beside an idle engine, spends that share as a queue
    # does (false: a free slot is free; more prefix reuse, more idle time: docs/deployment.md has both measured)
    pile_up_batches: bool = False
    share_placement: bool = True  # with a Redis L2: prefix placements shared by every worker and replica
    placement_ttl_s: float = 300.0  # a shared placement is forgotten this long after it was last published
    placement_wait_s: float = (
        0.02  # a miss waits at most this long for the shared placement (late: next time)
    )
    first_byte_timeout_s: float = 30.0  # a stream's first byte; missed: retried elsewhere, counts to ejection
    health_timeout_s: float = 2.0  # one check's own limit (a hung engine accepts connections, then stalls)
    engine_state: bool = True  # read llama-server's /slots with each health check (busy slots, slot count)
    admission_wait_s: float = 2.0  # every backend at max_outstanding: wait this long for one, then 503
    engine_salt: bool = False  # send cache_salt (a keyed hash of the tenant scope) to engines: vLLM, ours
    route_headers: bool = True  # X-Tokenedge-Backend and X-Tokenedge-Route on answers from a backend

    def __post_init__(self) -> None:
        if isinstance(self.url, list):  # a TOML array
            object.__setattr__(self, "url", tuple(self.url))
        if isinstance(self.url, str) and "," in self.url:
            object.__setattr__(self, "url", tuple(u.strip() for u in self.url.split(",") if u.strip()))
        require(
            isinstance(self.url, str | tuple),
            f"upstream.url must be a URL or a list of URLs, got {self.url!r}",
        )
        urls = (self.url,) if isinstance(self.url, str) else self.url
        require(bool(urls), "upstream.url must name at least one http(s):// URL")
        for url in urls:
            require(
                isinstance(url, str) and url.startswith(("http://", "https://")),
                f"upstream.url must be http(s)://..., got {url!r}",
            )
        require(
            not self.health_path or self.health_path.startswith("/"),
            f"upstream.health_path must start with '/', got {self.health_path!r}",
        )
        require(self.health_interval_s > 0, "upstream.health_interval_s must be > 0")
        require(self.eject_after_failures >= 1, "upstream.eject_after_failures must be >= 1")
        require(
            0 < self.eject_base_s <= self.eject_max_s, "upstream.eject_base_s must be in (0, eject_max_s]"
        )
        require(self.affinity_block_chars >= 1, "upstream.affinity_block_chars must be >= 1")
        require(self.affinity_block_tokens >= 1, "upstream.affinity_block_tokens must be >= 1")
        require(self.affinity_table_blocks >= 1, "upstream.affinity_table_blocks must be >= 1")
        require(self.affinity_load_factor >= 1.0, "upstream.affinity_load_factor must be >= 1")
        require(0 <= self.queue_beside_idle_share <= 1, "upstream.queue_beside_idle_share must be in [0, 1]")
        require(self.placement_ttl_s > 0, "upstream.placement_ttl_s must be > 0")
        require(self.placement_wait_s >= 0, "upstream.placement_wait_s must be >= 0")
        require(self.first_byte_timeout_s >= 0, "upstream.first_byte_timeout_s must be >= 0 (0: off)")
        require(self.health_timeout_s > 0, "upstream.health_timeout_s must be > 0")
        require(self.admission_wait_s >= 0, "upstream.admission_wait_s must be >= 0")
        require(self.connect_timeout_s > 0, "upstream.connect_timeout_s must be > 0")
        require(self.read_timeout_s > 0, "upstream.read_timeout_s must be > 0")
        require(self.models_ttl_s >= 0, "upstream.models_ttl_s must be >= 0")
        require(self.max_connections >= 1, "upstream.max_connections must be >= 1")
        for route in self.relay_routes:
            require(
                bool(route)
                and not route.startswith("/")
                and "**" not in route.split("/")[:-1]
                and all(s and s not in (".", "..") and not set(s) & set("\\;%?#") for s in route.split("/")),
                f"upstream.relay_routes: {route!r} must be a path under /v1/ like 'files' or 'files/*'",
            )

    @property
    def targets(self) -> tuple[BackendConfig, ...]:
        """The backends: `[[upstream.backends]]` when given, else one per `url` (weight 1, any model)."""
        if self.backends:
            return self.backends
        return tuple(BackendConfig(u) for u in ((self.url,) if isinstance(self.url, str) else self.url))

    @property
    def primary_url(self) -> str:
        return self.targets[0].url

    def __repr__(self) -> str:
        return f"UpstreamConfig(url={self.url!r}, api_key={'***' if self.api_key else ''!r})"
