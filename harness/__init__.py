"""The real parts the tests and the benchmarks both run, so neither imports the other: loopback processes and
services (redis-server, memcached, gateway replicas and workers, in-process gateways, fake engines), the tiny and
random-weight models, the paged-equivalence oracle, the peers (llama.cpp, vLLM, bare aiohttp, nginx, LiteLLM) and
the GPU check."""
