"""The dashboard's data: history rings, hot keys, summaries and the sampler that fills them. Its page and JSON
routes are the shell's (`gateway.handlers.dashboard`)."""
