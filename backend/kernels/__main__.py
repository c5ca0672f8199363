"""`python -m backend.kernels`: build tokenedge's kernel library for this machine (its AVX512 or AVX2 build, if
either can run here) and say which int4 kernel the backend will use, e.g. `int4 kernel: amx (AVX2 build,
avx2.1a2b3c4d)`. Exit status 0 either way: torch's kernel is the fallback, not an error."""

from __future__ import annotations

import logging

from backend.kernels.load import amx_unavailable, has_amx, int4_kernel, isa, kernel_id

_BUILDS = {"avx512": "AVX512 build", "avx2": "AVX2 build"}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    why = amx_unavailable()
    kernel = int4_kernel()
    if kernel == "amx":
        paths = ", AMX paths" if has_amx() else ""
        print(f"int4 kernel: amx ({_BUILDS[isa() or 'avx512']}{paths}, {kernel_id()})")
    else:
        print(f"int4 kernel: {kernel}" + (f" (tokenedge's kernel library not used: {why})" if why else ""))


if __name__ == "__main__":
    main()
