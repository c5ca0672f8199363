"""Streaming cache (DESIGN §1, §3): tee a streamed miss into a recorder, replay hits as SSE, coalesce streams.

`sse` frames and parses events, `recorder` assembles the canonical completion from a stream, `replay` synthesizes a
stream from an entry, `broadcast` shares one upstream stream among identical requests, `tee` drives the upstream
into a flight and stores on a clean end, and `handler` is the per-request driver called by the completions route.
"""
