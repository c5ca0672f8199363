"""The streaming pieces (design §1, §3): what a stream is made of, without the miss that drives it.

`sse` frames and parses events, `recorder` assembles the canonical completion from a stream, `replay` synthesizes a
stream from an entry, `responses` the Responses API's events, `broadcast` shares one upstream stream among identical
requests, `usage` splices the usage chunk. The drivers sit one level up: `misses.tee` drives the upstream into a
flight and stores on a clean end, and `misses.stream` is the per-request driver called by the completions route.
"""
