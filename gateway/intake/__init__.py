"""Intake: a request becomes (decision, scope, key) here, once, for every lane, the alias and explain (design §2.1)."""
