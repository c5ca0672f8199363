"""What the gateway and the backend must agree on, in one place: neither package imports the other.

`framing` (the binary token transport), `tokenizer_version` (the tokenizer export hash), `pattern` (pre-tokenizer
regexes), `chat_template` (sandboxed chat-template rendering), `chat_schema` (the message rules both validate).
Pure, standard library plus jinja2/orjson; no torch, no aiohttp.
"""
