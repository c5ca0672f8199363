"""The gateway's token path: tokenizers per model, a request-level token-id cache, line-anchored phrase
splicing, token budgets (context length, tokens per minute) and the binary token-id transport to a backend.

Token ids are always those the model's own encoder would produce for the exact text sent upstream; every
cache here is keyed by the tokenizer version, so a tokenizer upgrade can never return stale ids.
"""
