"""The server in front of aiohttp's parser: `server` (head deadline, connection cap, the runner), `framing` (where
requests begin and end on a connection), `bodies` (body deadlines), `fastlane` (known hits answered from the read,
kept in order). `needs` is what it reads of the state and where it finds it on the app.
"""
