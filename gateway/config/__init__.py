"""The configuration (`settings`: `GatewayConfig`, loaded from TOML and the environment; `sections`: one dataclass per
section; `show`: `python -m gateway config`; `cost`: the dashboard's price table).
"""
