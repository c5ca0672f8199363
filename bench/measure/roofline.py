"""The memory roofline of batch-1 decode: each decode step reads every weight once, so a model whose weights take
B bytes cannot decode faster than bandwidth / B tokens a second on this machine. Measured here, not assumed: a
plain copy and a sum over arrays far larger than the caches, in 1 and in N processes at once (one per thread the
engines get), each process pinned to nothing and started on a barrier; the faster of the two read rates (a copy
reads and writes each byte, counted as two) is the bound, so a fraction of it is never flattered.

Bytes per token are the file's: every tensor once, the token embedding only where it is also the output head (a
tied head reads it whole; an untied embedding reads one row). Both engines repack what they load (ours its int4
tiles, llama.cpp its interleaved Q4_0), so this counts the bytes of the format each side ran, not of its layout;
the KV cache's reads (a few MB at these lengths) are left out and said to be.

    python -m bench.measure.roofline [--threads 1,2] [MODEL.gguf]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import gguf
import numpy as np

ARRAY_BYTES = 256 * 1024 * 1024  # per process: far past any last-level cache here
REPEATS = 5


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """Read bandwidth in bytes/s at `processes` processes at once, from a copy and from a sum."""

    processes: int
    copy_bytes_s: float
    sum_bytes_s: float

    @property
    def bound_bytes_s(self) -> float:
        return max(self.copy_bytes_s, self.sum_bytes_s)

    def describe(self) -> str:
        return (
            f"{self.processes} thread(s): copy {self.copy_bytes_s / 1e9:.1f} GB/s, sum {self.sum_bytes_s / 1e9:.1f}"
            f" GB/s -> bound {self.bound_bytes_s / 1e9:.1f} GB/s"
        )


def _worker(barrier: Barrier, out: Queue[tuple[float, float]]) -> None:
    src = np.ones(ARRAY_BYTES // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page before timing
    barrier.wait()
    copies, sums = [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        np.copyto(dst, src)
        copies.append(2 * ARRAY_BYTES / (time.perf_counter() - start))
        start = time.perf_counter()
        float(src.sum())
        sums.append(ARRAY_BYTES / (time.perf_counter() - start))
    out.put((statistics.median(copies), statistics.median(sums)))


def measure_bandwidth(processes: int) -> Bandwidth:
    """`processes` copies of the loop at once; their rates summed."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(processes)
    out: Queue[tuple[float, float]] = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(barrier, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return Bandwidth(processes, sum(r[0] for r in rates), sum(r[1] for r in rates))


def bytes_per_token(model: Path) -> int:
    """The bytes one decode step reads from the file's weights (see the module docstring)."""
    reader = gguf.GGUFReader(model)
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    return sum(int(t.n_bytes) for t in reader.tensors if t.name != "token_embd.weight" or tied)


def fraction(decode_tok_s: float, model_bytes: int, bandwidth: Bandwidth) -> float:
    """Batch-1 decode as a fraction of the roofline bound, bandwidth / bytes per token."""
    return decode_tok_s * model_bytes / bandwidth.bound_bytes_s


def roofline_line(label: str, decode_tok_s: float, model: Path, bandwidth: Bandwidth) -> str:
    model_bytes = bytes_per_token(model)
    bound = bandwidth.bound_bytes_s / model_bytes
    share = fraction(decode_tok_s, model_bytes, bandwidth)
    return (
        f"{label}: {decode_tok_s:.1f} tok/s = {share:.0%} of the bound {bound:.1f} tok/s "
        f"({model_bytes / 1e6:.0f} MB a token, {bandwidth.bound_bytes_s / 1e9:.1f} GB/s)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.measure.roofline", description=__doc__)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("model", nargs="?")
    args = parser.parse_args(argv)
    for t in (int(x) for x in args.threads.split(",")):
        print(measure_bandwidth(t).describe())
    if args.model:
        print(f"{args.model}: {bytes_per_token(Path(args.model)) / 1e6:.1f} MB read per decoded token")


if __name__ == "__main__":
    main()
