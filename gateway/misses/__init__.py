"""What fills the cache: `fill` and `answer` (a miss asked once, its entry, stale-if-error), `singleflight`,
`lease` + `lease_fill` (across replicas), `tee` and `stream` (a streamed miss or hit), `streaming/` (the SSE
pieces), `warm` (the start-up L1 fill), `reask` (`python -m gateway warm`). `needs` is what it reads of the state.
"""
