"""llama.cpp at its best on this machine: the same weights requantized with llama.cpp's own `llama-quantize` into
each of its 4-bit formats, measured with `llama-bench`, and the fastest one picked, so the peer is never measured on
a format it runs slowly (issue 36: on AVX-512 without AMX, Q4_1 gets none of llama.cpp's repacked layouts and Q4_0
does; decode 77 -> 125 tok/s at one thread from the format alone).

Fastest means batch-1 decode (`tg`) at the thread count the comparison runs, prefill (`pp`) breaking ties, since
decode is what a served request spends most of its time on. Requantizing from an already 4-bit file
(`--allow-requantize`) loses a little accuracy and nothing in speed, which is all these files are for. Files are
cached beside the build (`<cache>/requant/<build key>/`), named by source file name and size and format.

    python -m harness.peers.llamacpp_formats [--threads 1,2] [MODEL.gguf]
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf

from harness.peers.llamacpp_build import LlamaBuild, cache_root, ensure_build

FORMATS = ("Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS")  # llama-quantize's 4-bit types


@dataclass(frozen=True, slots=True)
class FormatRate:
    """One llama-bench row: a format at a thread count."""

    format: str
    threads: int
    pp_tok_s: float
    tg_tok_s: float
    path: Path


def shipped_format(model: Path) -> str:
    """The file's own weight format: the type most of its 2-D tensors have (`Q4_1` for the shipped SmolLM2)."""
    reader = gguf.GGUFReader(model)
    kinds = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) == 2)
    return kinds.most_common(1)[0][0]


def requantized(build: LlamaBuild, model: Path, fmt: str, shipped: str | None = None) -> Path:
    """`model` in `fmt`, made once by `llama-quantize`; the file itself where it already is `fmt`."""
    if fmt == (shipped or shipped_format(model)):
        return model
    folder = cache_root() / "requant" / build.directory.name
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{model.stem}-{model.stat().st_size}.{fmt}.gguf"
    if not target.exists():
        partial = target.with_suffix(".partial")
        argv = [str(build.quantize), "--allow-requantize", str(model), str(partial), fmt]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"llama-quantize {fmt} failed:\n{(done.stdout + done.stderr)[-2000:]}")
        partial.replace(target)
    return target


def bench_rows(
    build: LlamaBuild, files: dict[str, Path], threads: Sequence[int], prompt: int = 128, gen: int = 32
) -> list[FormatRate]:
    """One `llama-bench` run over every file and thread count (3 repetitions each)."""
    argv = [str(build.bench), *(a for path in files.values() for a in ("-m", str(path)))]
    argv += ["-t", ",".join(map(str, threads)), "-p", str(prompt), "-n", str(gen), "-r", "3", "-o", "json"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=3600)
    by_path = {str(path): fmt for fmt, path in files.items()}
    rates: dict[tuple[str, int], dict[str, float]] = {}
    for row in json.loads(done.stdout):
        fmt = by_path[row["model_filename"]]
        kind = "pp" if row["n_prompt"] else "tg"
        rates.setdefault((fmt, int(row["n_threads"])), {})[kind] = float(row["avg_ts"])
    return [
        FormatRate(fmt, t, r.get("pp", 0.0), r.get("tg", 0.0), files[fmt]) for (fmt, t), r in rates.items()
    ]


def fastest(rows: Sequence[FormatRate], threads: int) -> FormatRate:
    """The format llama.cpp decodes fastest at `threads` (prefill breaking ties)."""
    return max((r for r in rows if r.threads == threads), key=lambda r: (r.tg_tok_s, r.pp_tok_s))


def measure_formats(
    build: LlamaBuild, model: Path, threads: Sequence[int], formats: Sequence[str] = FORMATS
) -> list[FormatRate]:
    """Every 4-bit format of `model` (requantized where needed) at every thread count."""
    shipped = shipped_format(model)
    files = {fmt: requantized(build, model, fmt, shipped) for fmt in dict.fromkeys([shipped, *formats])}
    return bench_rows(build, files, threads)


def format_table(rows: Sequence[FormatRate], shipped: str, cpu: str) -> str:
    """The formats side by side per thread count, the fastest and the shipped one marked."""
    lines = [f"llama.cpp's 4-bit formats (llama-bench pp128 / tg32, 3 reps), {cpu}"]
    lines.append(f"{'format':<10} {'threads':>7} {'pp128 tok/s':>12} {'tg32 tok/s':>11}  note")
    for t in sorted({r.threads for r in rows}):
        best = fastest(rows, t)
        for r in sorted((r for r in rows if r.threads == t), key=lambda r: -r.tg_tok_s):
            notes = [n for n, on in (("fastest", r == best), ("shipped", r.format == shipped)) if on]
            lines.append(f"{r.format:<10} {t:>7} {r.pp_tok_s:>12.1f} {r.tg_tok_s:>11.1f}  {', '.join(notes)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from backend.loader import default_model_path
    from backend.runtime import cpu_model

    parser = argparse.ArgumentParser(prog="harness.peers.llamacpp_formats", description=__doc__)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("model", nargs="?")
    args = parser.parse_args(argv)
    model = Path(args.model) if args.model else default_model_path()
    build = ensure_build()
    rows = measure_formats(build, model, [int(t) for t in args.threads.split(",")])
    print(format_table(rows, shipped_format(model), cpu_model()))


if __name__ == "__main__":
    main()
