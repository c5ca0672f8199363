"""Pre-tokenizer regexes, one tiktoken pattern per family.

llama.cpp and Hugging Face apply some pre-tokenizers in sequence (first split digits one by one, then the
GPT-2 regex on each piece). tiktoken runs a single regex, so the sequence is folded into one pattern
that yields the same pieces: a digit is its own piece, letters and punctuation stop at digits, and
whitespace before a digit is kept whole (the digit split ended the piece there, so GPT-2's `\\s+(?!\\S)`
saw the end of its input).
"""

from __future__ import annotations

GPT2 = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Digits(individual_digits=True) followed by ByteLevel(use_regex=True): SmolLM, StarCoder.
GPT2_SINGLE_DIGITS = r"""\p{N}|'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?=\p{N})|\s+(?!\S)|\s+"""

# Llama 3 (tiktoken cl100k-like, digits in runs of up to three).
LLAMA3 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# llama.cpp's `tokenizer.ggml.pre` names -> pattern.
_GGUF_PRE: dict[str, str] = {
    "default": GPT2,
    "gpt-2": GPT2,
    "gpt2": GPT2,
    "smollm": GPT2_SINGLE_DIGITS,
    "starcoder": GPT2_SINGLE_DIGITS,
    "refact": GPT2_SINGLE_DIGITS,
    "llama-bpe": LLAMA3,
    "llama3": LLAMA3,
}


def pattern_for_gguf_pre(pre: str) -> str:
    try:
        return _GGUF_PRE[pre]
    except KeyError:
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r} (known: {sorted(_GGUF_PRE)})") from None


def pattern_for_hf_pre_tokenizer(spec: dict | None) -> str:
    """Map a tokenizer.json `pre_tokenizer` to one pattern (Split regex, ByteLevel, Digits)."""
    if spec is None:
        return GPT2
    parts = spec["pretokenizers"] if spec.get("type") == "Sequence" else [spec]
    split_regex: str | None = None
    single_digits = False
    byte_level_regex = False
    for part in parts:
        kind = part.get("type")
        if kind == "Split":
            split_regex = part["pattern"].get("Regex") or part["pattern"].get("String")
        elif kind == "Digits":
            single_digits = bool(part.get("individual_digits", False))
        elif kind == "ByteLevel":
            byte_level_regex = bool(part.get("use_regex", True))
        else:
            raise ValueError(f"unsupported pre-tokenizer step {kind!r}")
    if split_regex is not None:
        if single_digits or byte_level_regex:
            raise ValueError("unsupported pre-tokenizer: Split combined with Digits or a ByteLevel regex")
        return split_regex
    if single_digits:
        return GPT2_SINGLE_DIGITS
    return GPT2
