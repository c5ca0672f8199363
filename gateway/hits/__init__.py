"""The hit core: every way of answering a hit (the fast lane, the JSON path, the streamed hit, the GET alias) calls
these four pieces, so a hit rule is one edit (design §1):

- `verdict`: the pure decision "this entry answers this request now" (freshness, `max-age`, revision, conditionals);
- `scope`: the caller's key scope, derived from the request being answered, never from shared mutable state;
- `render`: the hit's headers, as a mapping or as the bytes of the whole response, from one header block;
- `record`: what a served hit counts (tokens and bytes saved, hot keys, the shared hot-key record).
"""
