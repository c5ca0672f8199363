"""Write the tokenizer golden corpus, `tests/backend/data/tokenizer_corpus.json`.

Hand-written strings cover the families that break tokenizers (CJK, emoji sequences, code, digit and
whitespace runs, special tokens inside text, bytes the vocabulary lacks); seeded random mixes of those
pieces add volume. The output is committed; `scripts/make_goldens.py` then asks llama.cpp for the ids.

    python scripts/make_goldens_corpus.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "backend" / "data" / "tokenizer_corpus.json"

ENGLISH = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll agree we've done what they'd want; it's fine.",
    "DON'T SHOUT, he said. Don't.",
    "What is the capital of France?",
    "Explain quantum computing in one sentence.",
    "A cat sat on the mat. The mat was flat.",
    "e.g. i.e. etc. vs. Mr. Mrs. Dr. St.",
    "well-known, state-of-the-art, up-to-date",
    "\"Quoted\" and 'single quoted' and `backticks`",
    "Semicolons; colons: dashes — en–dashes – ellipsis…",
    "ALLCAPS lowercase MiXeD CaSe camelCase snake_case kebab-case",
    "antidisestablishmentarianism",
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "a",
    "I",
    " ",
    "",
    "The year 2024 had 366 days.",
    "Call +1 (555) 123-4567 or email john.doe@example.com.",
    "https://example.com/path/to/page?query=1&other=two#frag",
    "Version 3.11.7 was released on 2023-12-04T10:15:00Z.",
    "Price: $1,234.56 (approx. €1.100,00 or £999)",
    "50% off! 3/4 cup, 1½ teaspoons, 2² = 4, x³",
    "Temperature is -40°C which equals -40°F.",
    "Roman numerals: Ⅻ ⅻ Ⅳ and circled ① ② ③",
    "café naïve résumé coöperate façade jalapeño",
    "Straße, Grüße, Mädchen, Ökonomie",
    "Ελληνικά κείμενο εδώ.",
    "Русский текст: Привет, мир!",
    "עברית: שלום עולם",
    "العربية: مرحبا بالعالم",
    "हिन्दी: नमस्ते दुनिया",
    "ไทย: สวัสดีชาวโลก",
    "Tiếng Việt: Xin chào thế giới",
    "한국어: 안녕하세요 세계",
]
CHINESE = [
    "你好，世界！",
    "中华人民共和国成立于1949年。",
    "我爱自然语言处理。",
    "今天天气很好，我们去公园散步吧。",
    "机器学习是人工智能的一个分支。",
    "北京、上海、广州和深圳是中国的大城市。",
    "《红楼梦》是中国古典四大名著之一。",
    "这个问题的答案是42。",
    "繁體中文：臺灣的資訊科技產業很發達。",
    "混合English和中文的句子。",
]
JAPANESE = [
    "こんにちは、世界！",
    "日本語の文章をトークン化します。",
    "東京は日本の首都です。",
    "カタカナとひらがなと漢字",
    "ｶﾀｶﾅ 半角カナ と 全角ＡＢＣ１２３",
    "吾輩は猫である。名前はまだ無い。",
    "令和6年4月1日（月曜日）",
    "すみません、駅はどこですか？",
]
EMOJI = [
    "😀😃😄😁",
    "I love pizza 🍕 and tacos 🌮!",
    "👍🏽 thumbs up with skin tone",
    "👨‍👩‍👧‍👦 family ZWJ sequence",
    "🏳️‍🌈 flag sequence 🇫🇷🇯🇵🇺🇸",
    "❤️ vs ❤ (variation selector)",
    "🔥🔥🔥 lit",
    "Keycaps: 1️⃣ 2️⃣ #️⃣",
    "🤖 + 🧠 = 💡",
    "emoji at end 🎉",
]
CODE = [
    "def add(a, b):\n    return a + b\n",
    'for (int i = 0; i < 10; ++i) {\n\tprintf("%d\\n", i);\n}',
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "const f = async (x) => { await g(x); return x ?? 0; };",
    '<div class="container"><p>Hello</p></div>',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "#!/usr/bin/env bash\nset -euo pipefail\necho \"$HOME\" | grep -v '^#'",
    'fn main() { let v: Vec<u8> = vec![0xFF, 0x00]; println!("{:?}", v); }',
    "x += 1; y -= 2; z *= 3; w /= 4; a **= 2; b //= 3",
    "if (a && b || !c) { return a != b ? a : b; }",
    "    indented with four spaces\n        and eight\n\t\ttwo tabs",
    'class Foo(Base):\n    """Docstring."""\n\n    def __init__(self) -> None:\n        super().__init__()\n',
    "matrix = [[1, 2], [3, 4]]  # 2x2",
    "0x1F600 0b1010 0o755 1e-10 3.14159 6.022e23",
    "```python\nprint('hi')\n```",
    "diff --git a/x.py b/x.py\n@@ -1,3 +1,4 @@\n-old\n+new",
    "user@host:~$ ls -la /var/log | wc -l",
    "a<b>c</b>&amp;&lt;&gt;",
    "regex: ^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$",
]
DIGITS = [
    "0",
    "7",
    "12",
    "123",
    "1234",
    "12345",
    "123456789",
    "3141592653589793238462643383279502884197",
    "000000",
    "1 2 3 4 5",
    "1,000,000",
    "1.000.000,50",
    "v1.2.3-rc.4",
    "abc123def456",
    "2024-01-01 00:00:00",
    "phone: 0800 123 456",
    "  42",
    "\n\n99 bottles",
    "١٢٣ Arabic-Indic digits ٤٥٦",
    "१२३ Devanagari digits",
    "０１２３ full-width digits",
    "x1y22z333",
]
WHITESPACE = [
    "two  spaces",
    "three   spaces",
    "many          spaces",
    "trailing space ",
    "trailing spaces   ",
    " leading space",
    "   leading spaces",
    "tab\there",
    "tabs\t\t\tthere",
    "new\nline",
    "two\n\nnewlines",
    "many\n\n\n\n\nnewlines",
    "windows\r\nline\r\nendings",
    "mixed \t \n \r\n whitespace",
    "\n",
    "\n\n",
    "\t",
    "    ",
    " \n ",
    "word \n\n word",
    "non-breaking\u00a0space and\u2003em space",
    "zero\u200bwidth\u200bspace",
    "ideographic\u3000space",
    "end with newline\n",
    "a  1",
    "a \t 1",
    "x\n 2",
]
SPECIAL = [
    "<|im_start|>user\nHello<|im_end|>\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "<|im_start|>assistant\nSure!<|im_end|>",
    "text before<|im_end|>text after",
    "<|endoftext|>",
    "<|endoftext|><|endoftext|>",
    "<|im_start|><|im_end|>",
    "<repo_name>tokenedge<file_sep>main.py",
    "<filename>src/app.py\n<gh_stars>100",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<issue_start>bug<issue_comment>fixed<issue_closed>",
    "almost special <|im_end| and <im_end|> and <|IM_END|>",
    "<|unknown_special|> is plain text",
    " <|im_end|> with spaces ",
    "\n<|im_start|>\n",
]
CONTROL = [
    "bell\x07 backspace\x08 escape\x1b[0m",
    "control \x04\x06 bytes without tokens",
    "\x13\x14\x16\x1d",
    "a\x04b",
    "nul\x00char",
    "\x7f delete",
    "private use \U000f0000 and \U00050000",
    "\ufeffBOM at start",
    "replacement \ufffd char",
    "combining e\u0301 vs é",
]
PIECES = [
    *["the", "The", " and", "model", "token", "cache", "edge", "GPU", "CPU", "llama", "SmolLM"],
    *["你好", "世界", "日本", "こんにちは", "東京", "😀", "🍕", "👍🏽", "🇫🇷", "é", "ß", "Ω", "Привет"],
    *["0", "1", "42", "2024", "3.14", "1,000", "½", "²", "٣"],
    *[" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n"],
    *["(", ")", "[", "]", "{", "}", ";", ":", ",", ".", "!", "?", "'s", "'ll", "'re", "...", "->", "==", "#"],
    *["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
    *["def", "return", "import", "x_1", "self.", "__init__", "//", "/*", "*/", "$", "@", "%"],
]


def random_mixes(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(2, 14))) for _ in range(count)]


def build() -> list[str]:
    corpus = ENGLISH + CHINESE + JAPANESE + EMOJI + CODE + DIGITS + WHITESPACE + SPECIAL + CONTROL
    corpus += [" " * n + "x" for n in range(1, 9)] + ["x" + "\n" * n + "y" for n in range(1, 6)]
    corpus += ["9" * n for n in range(1, 12)] + [" " + "5" * n for n in range(1, 6)]
    corpus += random_mixes(200, seed=20240601)
    seen: set[str] = set()
    return [s for s in corpus if not (s in seen or seen.add(s))]


def main() -> None:
    corpus = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"version": 1, "strings": corpus}, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(corpus)} strings to {OUT}")


if __name__ == "__main__":
    main()
