"""The built-in dashboard: `/dashboard` (one self-contained HTML page) and `/dashboard/data` (its JSON)."""
