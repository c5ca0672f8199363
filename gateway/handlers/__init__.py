"""HTTP handlers: they parse, dispatch to the pure core and the tiers, and render; no cache logic lives here."""
