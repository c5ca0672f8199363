"""`python -m backend.kernels`: build the AMX kernel for this machine (if it can run here) and say which int4
kernel the backend will use. Exit status 0 either way: torch's kernel is the fallback, not an error."""

from __future__ import annotations

import logging

from backend.kernels.load import amx_unavailable, int4_kernel


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    why = amx_unavailable()
    print(f"int4 kernel: {int4_kernel()}" + (f" (AMX kernel not used: {why})" if why else ""))


if __name__ == "__main__":
    main()
