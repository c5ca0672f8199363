"""What a request is and what is stored under its key (design §2, §4): `canonical` (levels and canonical forms),
`derive` (the versioned hashed key), `policy` (what may be cached, for how long), `cache_control` (request
directives), `validate` (intake: content type, body, limits), `memo` (parsed bodies by their bytes), `entry` (the
versioned stored record), `sizing`. Pure: no I/O, no state.
"""
