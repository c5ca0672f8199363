"""The HTTP vocabulary every layer speaks: `aioseam` (every private aiohttp name the gateway uses, each with why),
`errors` (the OpenAI-style error tree and its JSON), `paths` (the path normal form). The lowest layer: it imports
nothing of the gateway.
"""
