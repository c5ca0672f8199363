"""HTTP handlers, part of the shell: they parse, dispatch to the layers below and render; no cache logic lives here.
`dashboard.py` serves `/dashboard` (one self-contained page, `dashboard.html`) and `/dashboard/data`."""
