#!/usr/bin/env python3
"""Tokenizer fixtures for strata's text module, produced by a reference no one here wrote.

Two modes:

  --assemble-corpus   (runs on the dev box) builds tests/data/tokenizer/corpus.txt from freely licensed
                      text found on a Debian machine (licence texts, Python stdlib source, gettext
                      translations) plus emoji lines generated from the Unicode database. Sources and
                      licences: docs/tokenizer.md.
  --out DIR           (runs on the H200 box: needs `tokenizers`, optionally `transformers`) trains a small
                      byte-level BPE with Hugging Face `tokenizers` exactly as Qwen2 configures it (NFC
                      normalizer, Split(qwen2 regex, isolated) + ByteLevel(add_prefix_space=False,
                      use_regex=False)), adds Qwen-style added tokens, and writes JSON fixtures:
                        tokenizer.json     the trained tokenizer (for anyone who wants to re-check)
                        gguf_vocab.json    what llama.cpp's converter would put in a GGUF
                                           (tokens in id order, token types, merges "a b", special ids)
                        encode_cases.json  strings and their reference ids (qwen2 and qwen35 splits),
                                           NFC forms and pre-token pieces
                        decode_cases.json  id sequences and the reference decoded text (lossy UTF-8)
                        chat_cases.json    chat templates rendered by transformers/jinja2

Everything is deterministic: fixed seeds, sorted iteration, training checked twice for equality.
"""
import argparse
import json
import os
import random
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "tests", "data", "tokenizer")

# The pre-tokenizer regexes (Qwen2 from the reference; Qwen3.5 adds \p{M} to the letter class).
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen marks <|...|> tokens special (CONTROL in GGUF); <think> and <tool_call> are plain added tokens
# (USER_DEFINED in GGUF).
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
VOCAB_SIZE = 3000

# ---------------------------------------------------------------------------------------------
# Corpus assembly (dev box)
# ---------------------------------------------------------------------------------------------
LICENCE_TEXTS = ["GPL-3", "Apache-2.0", "MPL-2.0", "Artistic", "GFDL-1.3"]
PYTHON_MODULES = ["textwrap.py", "heapq.py", "bisect.py", "fnmatch.py", "shlex.py", "colorsys.py",
                  "json/encoder.py", "json/decoder.py", "string.py"]
TRANSLATIONS = [  # (locale, domain) — gettext catalogues shipped by Debian packages
    ("zh_CN", "grep"), ("zh_CN", "sed"), ("zh_TW", "grep"), ("ja", "grep"), ("ja", "sed"),
    ("ko", "grep"), ("ko", "sed"), ("ru", "grep"), ("ru", "sed"), ("uk", "grep"), ("el", "grep"),
    ("he", "grep"), ("th", "grep"), ("ar", "apt"), ("hi", "glib20"), ("fa", "glib20"),
    ("vi", "grep"), ("de", "grep"), ("fr", "sed"), ("pl", "grep"), ("tr", "sed")]
TRANSLATION_BYTES_PER_CATALOGUE = 14000

OWN_TEXT = """\
Mixed-script notes written for strata's tokenizer tests (CC0).
Привет, мир! Hello, world! 你好，世界！ こんにちは、世界。 안녕하세요 세계! مرحبا بالعالم! שלום עולם!
Γειά σου Κόσμε! नमस्ते दुनिया! สวัสดีชาวโลก! Xin chào thế giới! Merhaba dünya! Witaj świecie!
Emoji in running text: I ❤️ tokenizers 🎉🎉, family 👨‍👩‍👧‍👦, flags 🇯🇵🇩🇪🇧🇷, thumbs 👍🏻👍🏿, rainbow 🏳️‍🌈.
Numbers: 3.14159, 2,718,281, 1e-9, ١٢٣٤, 一二三, ²³, ½, Ⅻ, ①②③.
Contractions: I'm sure you're right, we've seen it, she'll come, he'd know, it's fine, DON'T SHOUT.
Combining marks: café, naïve, Åström, São Paulo, Zürich, Dvořák, Nguyễn, Ελληνικά.
"""


def _emoji_lines():
    lines = []
    for start, end in [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF)]:
        row = []
        for cp in range(start, end + 1):
            name = unicodedata.name(chr(cp), "")
            if not name:
                continue
            row.append(f"{chr(cp)} {name.lower()}")
            if len(row) == 6:
                lines.append("; ".join(row))
                row = []
        if row:
            lines.append("; ".join(row))
    zwj = ["👨‍👩‍👧‍👦", "👩‍💻", "🧑‍🚀", "🏳️‍🌈", "👁️‍🗨️", "❤️‍🔥", "🐻‍❄️"]
    tones = ["👋🏻", "👋🏼", "👋🏽", "👋🏾", "👋🏿"]
    flags = ["🇺🇸", "🇯🇵", "🇫🇷", "🇨🇳", "🇧🇷", "🇮🇳", "🇺🇦", "🇪🇬"]
    for i in range(60):
        lines.append(f"Message {i}: {zwj[i % len(zwj)]} waves {tones[i % 5]} from {flags[i % 8]}!"
                     f" {'🎉' * (1 + i % 3)}")
    return lines


def assemble_corpus():
    import gettext
    parts = []
    for name in LICENCE_TEXTS:
        with open(f"/usr/share/common-licenses/{name}", encoding="utf-8") as f:
            parts.append(f"=== licence text: {name} ===\n" + f.read())
    pydir = f"/usr/lib/python3.{sys.version_info.minor}"
    for name in PYTHON_MODULES:
        with open(os.path.join(pydir, name), encoding="utf-8") as f:
            parts.append(f"=== python source: {name} ===\n" + f.read())
    for locale, domain in TRANSLATIONS:
        path = f"/usr/share/locale/{locale}/LC_MESSAGES/{domain}.mo"
        with open(path, "rb") as f:
            catalogue = gettext.GNUTranslations(f)._catalog
        text, size = [], 0
        for key in sorted(k for k in catalogue if isinstance(k, str) and k):
            value = catalogue[key]
            if not isinstance(value, str) or value == key:
                continue
            text.append(value)
            size += len(value.encode("utf-8"))
            if size > TRANSLATION_BYTES_PER_CATALOGUE:
                break
        parts.append(f"=== translation: {locale}/{domain} ===\n" + "\n".join(text))
    parts.append("=== emoji (Unicode names) ===\n" + "\n".join(_emoji_lines()))
    parts.append("=== own text ===\n" + OWN_TEXT)
    corpus = "\n".join(parts) + "\n"
    os.makedirs(DATA, exist_ok=True)
    with open(os.path.join(DATA, "corpus.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(corpus)
    print(f"corpus.txt: {len(corpus.encode('utf-8'))} bytes, {corpus.count(chr(10))} lines")


# ---------------------------------------------------------------------------------------------
# Test strings
# ---------------------------------------------------------------------------------------------
def hard_strings():
    s = [
        # empty, whitespace runs, trailing whitespace, CR/LF
        "", " ", "  ", "   ", "\n", "\r\n", "\r", "\n\n\n", "\r\n\r\n", "a\r\nb", "a\rb", "x \n", "  \n",
        "trailing space ", "trailing spaces   ", "   leading", "tabs\tand\t\tmore", "\t\tx",
        "line1\nline2\n\nline4\n", "mixed \t \n  \r\n end", "spaces   before   words", "a  \n  b",
        "end with newline and spaces\n  ", " \n \n ", "\n x", "a\n\n\n\nb", "word \r\n\r\n next",
        # non-ASCII whitespace and look-alikes
        "\u00a0nbsp", "a\u00a0b", "ideographic\u3000space", "em\u2003space", "nel\u0085x",
        "zw\u200bsp", "mvs\u180ex", "vt\u000bff\u000cx", "fs\u001cgs\u001dx", "a \u00a0 b",
        " \u3000\n", "\u2028line\u2029para", "\u00a0\u00a0x", "x\u00a0", "\u205f\u202fy",
        # digits (\p{N} one at a time)
        "12345", "3.14159", "1,000,000", "year 2024!", "v1.2.3-rc4", "0x1F600", "٣٤٥ ١٢",
        "²³ ½ Ⅻ", "①②", "一二三", "abc123def", " 42", "$9.99", "१२३", "𝟙𝟚𝟛",
        # contractions, case-insensitive
        "I'm", "you're", "we've", "she'll", "he'd", "it's", "don't", "I'M", "YOU'RE", "We'Ve",
        "SHE'LL", "HE'D", "IT'S", "DON'T", "'s", "'S's", "rock'n'roll", "o'clock", "''", "' s",
        "‘quoted’", "it’s", "'sa", "'tis", "'RE'", " 's", "x'LL'd", "'ſ", "l'ſ", "'\u212a",
        # CJK and other scripts
        "你好，世界！", "今天是2026年8月13日", "日本語のテキストです。", "한국어 텍스트", "漢字かなカナ",
        "中文English混合", "Привет, мир! Hello, мир", "Ελληνικά και English", "العربية English 123",
        "abcПриветxyz", "שלום עולם", "नमस्ते दुनिया", "สวัสดีครับ ผมชื่ออเล็กซ์", "Xin chào thế giới",
        "𠀀𠀁 𪚥", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
        # emoji
        "👋", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🇯🇵🇺🇸", "😀😃😄", "I ❤️ NY", "a😀b", " 🎉", "🎉 🎉",
        "keycap 1️⃣ #️⃣", "©®™",
        # combining marks, NFC and NFD inputs
        "é", "e\u0301", "A\u030astro\u0308m", "ñ", "n\u0303", "k\u0301\u0300", "q\u0307\u0323",
        "\u0301abc", "x \u0301y", "Ǆ", "ﬁ", "\u2126", "\u212b", "\u1100\u1161\u11a8",
        "\u0958", "मَرْحَبًا", "مَرْحَبًا", "שָׁלוֹם", "e\u0301\u0301\u0301", "a\u0308\u0304",
        "Caf\u00e9 vs Cafe\u0301", "\u0300", " \u0300", "1\u0301", "\u0915\u093c", "o\u031b\u0323",
        # code
        'def f(x):\n    return x**2  # square\n', 'if (a && b) { c->d[0] = "str"; }',
        '<html><body class="x">Hi</body></html>', "x = [1, 2, 3]\n\tprint(x)\n",
        "#include <stdio.h>\nint main(void) { return 0; }\n", "SELECT * FROM t WHERE a='b';",
        "λx.x", "foo_bar-baz.qux", "C:\\path\\to\\file.txt", "https://example.com/a?b=c&d=e#f",
        "    indented\n        more\n", "a+=1;b-=2;;", "x!=y==z", "/* comment */\n", "`code` **bold**",
        "{\n  \"key\": [1, 2.5, null]\n}\n", "...!!!???", "--flag=value", "...\n\n...",
        # special / added tokens inside text
        "<|im_start|>user\nHello<|im_end|>\n", "<think>\nreasoning\n</think>\n\nanswer",
        "<tool_call>{\"name\": \"f\"}</tool_call>", "text<|endoftext|>text", "<|im_start|><|im_end|>",
        "<|im_start", "<|im_end|>>", " <|im_end|> ", "<<think>>", "<think></think>",
        "<|endoftext|><|endoftext|>", "a<|im_start|>b<think>c", "</think", "<tool_call><tool_call>",
        "e\u0301<think>\u0301", "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        # long runs
        "a" * 300, " " * 100 + "x", "\n" * 50, "ab" * 200, "1234567890" * 20, "😀" * 40,
        "x" + " " * 65 + "y", "\t" * 33, "é" * 80,
        # odd code points
        "nul\u0000byte", "\ufeffBOM", "\ud7ff", "\U000f0000private", "\U0001f000", "\ufffd", "\u00ad",
        "soft\u00adhyphen", "\u200d", "a\u200db", "\u202eRTL", "\U0001d400\U0001d401",
    ]
    return s


INTERESTING_CHARS = (list("abcXYZ ,.;'!?-_()[]{}<>/\\\"#$%&*+=@^`|~0123456789\t\n\r")
                     + ["'s", "'T", "'re", "'ll", " ", "  ", "\r\n", "\u00a0", "\u3000", "\u2003",
                        "é", "e\u0301", "\u0301", "\u0308", "ß", "ſ", "Ж", "я", "中", "文", "の", "한",
                        "ع", "\u064e", "ה", "\u05b8", "न", "\u094d", "\u093f", "ก", "\u0e31", "٣", "²",
                        "½", "Ⅻ", "😀", "👍", "\U0001f3fd", "\u200d", "\ufe0f", "🇯", "🇵", "€", "©",
                        "“", "”", "…", "—", "<think>", "</think>", "<|im_end|>", "<|im_start|>",
                        "\U00020000", "\U0001d400", "\u00ad", "\u0000"])


def random_mixed_strings(rng, count):
    out = []
    for _ in range(count):
        n = rng.randint(1, 24)
        out.append("".join(rng.choice(INTERESTING_CHARS) for _ in range(n)))
    return out


# ---------------------------------------------------------------------------------------------
# Chat conversations
# ---------------------------------------------------------------------------------------------
def conversations():
    tool_call_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    return [
        ("single_user", [{"role": "user", "content": "Hello!"}]),
        ("system_user", [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "Hi there"}]),
        ("multi_turn_think_history", [
            {"role": "system", "content": "Be helpful."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n2+2 = 4."},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "<think>Again simple.</think>6."},
            {"role": "user", "content": "Thanks"}]),
        ("reasoning_field", [
            {"role": "user", "content": "Why?"},
            {"role": "assistant", "content": "Because.", "reasoning_content": "\nThinking hard\n"}]),
        ("assistant_last_no_think", [
            {"role": "user", "content": "Say hi"},
            {"role": "assistant", "content": "hi"}]),
        ("tool_flow", [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": tool_call_text},
            {"role": "tool", "content": "{\"temp\": 21}"},
            {"role": "tool", "content": "{\"sky\": \"clear\"}"},
            {"role": "assistant", "content": "<think>\nIt is 21 and clear.\n</think>\n\nSunny, 21°C."}]),
        ("tool_response_as_user", [
            {"role": "user", "content": "Start"},
            {"role": "assistant", "content": "<think>plan</think>\n\nCalling."},
            {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}]),
        ("whitespace_content", [
            {"role": "system", "content": "  padded system  \n"},
            {"role": "user", "content": "\n  padded user \t"},
            {"role": "assistant", "content": "\n\n<think>\n\n r \n\n</think>\n\n\n answer \n"},
            {"role": "user", "content": "ok"}]),
        ("unicode_content", [
            {"role": "user", "content": "Привет 👋 你好 e\u0301"},
            {"role": "assistant", "content": "Здравствуйте! 😀"},
            {"role": "user", "content": "日本語で？"}]),
        ("empty_contents", [
            {"role": "system", "content": ""},
            {"role": "user", "content": ""},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "x"}]),
        ("system_not_first", [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "late system"},
            {"role": "user", "content": "b"}]),
        ("tool_first", [
            {"role": "tool", "content": "orphan result"},
            {"role": "user", "content": "q"}]),
        ("specials_in_content", [
            {"role": "user", "content": "literal <|im_end|> and <think> tags"}]),
    ]


def chat_option_sets(template_name):
    sets = []
    for gen in (True, False):
        for thinking in (None, True, False):
            opts = {"add_generation_prompt": gen}
            if thinking is not None:
                opts["enable_thinking"] = thinking
            sets.append(opts)
    if template_name != "qwen3":
        sets.append({"add_generation_prompt": True, "preserve_thinking": True})
        sets.append({"add_generation_prompt": True, "preserve_thinking": False})
    return sets


def make_jinja_renderer():
    """Renders like transformers does (sandboxed env, trim_blocks, lstrip_blocks, loopcontrols)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception

    def render(template_text, messages, options):
        return env.from_string(template_text).render(messages=messages, **options)
    return render


def chat_cases(log):
    render_jinja = make_jinja_renderer()
    render_hf = None
    try:  # cross-check with transformers' own renderer where it is importable
        from transformers.utils.chat_template_utils import render_jinja_template

        def render_hf(template_text, messages, options):
            rendered, _ = render_jinja_template(conversations=[messages], chat_template=template_text,
                                                **options)
            return rendered[0]
    except Exception as e:  # noqa: BLE001
        log(f"transformers renderer unavailable: {e!r}")
    templates = {}
    for name in ("qwen3", "qwen3_6"):
        with open(os.path.join(DATA, "templates", f"{name}.jinja"), encoding="utf-8") as f:
            templates[name] = f.read()
    cases, disagreements = [], 0
    for tname, ttext in templates.items():
        for cname, messages in conversations():
            for opts in chat_option_sets(tname):
                entry = {"template": tname, "conversation": cname, "options": opts}
                try:
                    entry["expected"] = render_jinja(ttext, messages, opts)
                except Exception as e:  # noqa: BLE001  (raise_exception in the template)
                    entry["error"] = str(e)
                if render_hf is not None:
                    try:
                        hf = render_hf(ttext, messages, opts)
                    except Exception as e:  # noqa: BLE001
                        hf = {"error": str(e)}
                    if hf != entry.get("expected", {"error": entry.get("error")}):
                        disagreements += 1
                        entry["transformers"] = hf
                cases.append(entry)
    log(f"chat cases: {len(cases)}, jinja vs transformers disagreements: {disagreements}"
        f" (transformers renderer {'used' if render_hf else 'absent'})")
    return {"conversations": {n: m for n, m in conversations()}, "cases": cases,
            "transformers_cross_checked": render_hf is not None}


# ---------------------------------------------------------------------------------------------
# Training and reference encodings (H200 box)
# ---------------------------------------------------------------------------------------------
def build_pipeline(regex):
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return normalizers.NFC(), pre, decoders.ByteLevel()


def train(corpus_lines):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer, tok.pre_tokenizer, tok.decoder = build_pipeline(QWEN2_REGEX)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(corpus_lines, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in USER_TOKENS])
    return tok


def gguf_view(tok):
    """What convert_hf_to_gguf.py would store: tokens by id, types, merges as 'a b'."""
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    added = {a["id"]: a for a in spec["added_tokens"]}
    n = max(list(vocab.values()) + list(added)) + 1
    tokens, types = [None] * n, [1] * n
    for text, i in vocab.items():
        tokens[i] = text
    for i, a in added.items():
        tokens[i] = a["content"]
        looks_special = a["content"].startswith("<|") and a["content"].endswith("|>")
        types[i] = 3 if (a["special"] or looks_special) else 4
    assert all(t is not None for t in tokens), "vocab ids have holes"
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    return {"model": "gpt2", "pre": "qwen2", "tokens": tokens, "token_type": types, "merges": merges,
            "bos_token_id": None, "eos_token_id": ids["<|im_end|>"],
            "padding_token_id": ids["<|endoftext|>"]}


def split_pieces(regex, text):
    from tokenizers import Regex, pre_tokenizers
    split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
    return [p for p, _ in split.pre_tokenize_str(text)]


def make_fixtures(out, log):
    import tokenizers
    from tokenizers import Tokenizer
    log(f"tokenizers {tokenizers.__version__}")
    with open(os.path.join(DATA, "corpus.txt"), encoding="utf-8") as f:
        corpus = f.read()
    lines = corpus.split("\n")
    tok = train(lines)
    again = train(lines)
    if tok.to_str() != again.to_str():
        raise SystemExit("training is not deterministic: two runs differ")
    log(f"trained: vocab {tok.get_vocab_size()} (deterministic across two runs)")
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=False))
    view = gguf_view(tok)
    with open(os.path.join(out, "gguf_vocab.json"), "w", encoding="utf-8") as f:
        json.dump(view, f, ensure_ascii=False, separators=(",", ":"))

    tok35 = Tokenizer.from_str(tok.to_str())
    _, tok35.pre_tokenizer, _ = build_pipeline(QWEN35_REGEX)

    rng = random.Random(20240613)
    candidates = sorted({ln for ln in lines if ln.strip() and not ln.startswith("=== ")})
    corpus_lines = rng.sample(candidates, 200)
    mixed = random_mixed_strings(rng, 200)
    groups = [("hard", hard_strings()), ("corpus_line", corpus_lines), ("random_mixed", mixed)]
    cases = []
    for group, strings in groups:
        for s in strings:
            nfc = tok.normalizer.normalize_str(s)
            case = {"group": group, "text": s, "nfc": nfc,
                    "ids": tok.encode(s, add_special_tokens=False).ids,
                    "ids_qwen35": tok35.encode(s, add_special_tokens=False).ids,
                    "decoded": tok.decode(tok.encode(s, add_special_tokens=False).ids,
                                          skip_special_tokens=False)}
            if group == "hard":
                case["pieces_qwen2"] = split_pieces(QWEN2_REGEX, nfc)
                case["pieces_qwen35"] = split_pieces(QWEN35_REGEX, nfc)
            cases.append(case)
    with open(os.path.join(out, "encode_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"regex_qwen2": QWEN2_REGEX, "regex_qwen35": QWEN35_REGEX, "cases": cases}, f,
                  ensure_ascii=False, separators=(",", ":"))
    log(f"encode cases: {len(cases)}")

    # Decode cases: every prefix of some multi-byte encodings (incomplete UTF-8 at the end), single
    # tokens of every byte, and random id soups (invalid sequences in the middle).
    decode = []
    for s in ["👨‍👩‍👧‍👦 family", "你好，世界！", "e\u0301 ñ", "𠀀x", "Привет"]:
        ids = tok.encode(s, add_special_tokens=False).ids
        for k in range(1, len(ids) + 1):
            decode.append({"ids": ids[:k], "text": tok.decode(ids[:k], skip_special_tokens=False)})
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = sorted(ByteLevel.alphabet())
    for ch in alphabet:
        i = tok.token_to_id(ch)
        decode.append({"ids": [i], "text": tok.decode([i], skip_special_tokens=False)})
    n = tok.get_vocab_size()
    for _ in range(100):
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 12))]
        decode.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(out, "decode_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"cases": decode}, f, ensure_ascii=False, separators=(",", ":"))
    log(f"decode cases: {len(decode)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assemble-corpus", action="store_true")
    ap.add_argument("--chat-only", action="store_true", help="only chat_cases.json (needs jinja2)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.assemble_corpus:
        assemble_corpus()
        return
    out = args.out or DATA
    os.makedirs(out, exist_ok=True)
    log_lines = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)
    try:
        import transformers
        log(f"transformers {transformers.__version__}")
    except Exception as e:  # noqa: BLE001
        log(f"transformers not importable: {e!r}")
    chat = chat_cases(log)
    with open(os.path.join(out, "chat_cases.json"), "w", encoding="utf-8") as f:
        json.dump(chat, f, ensure_ascii=False, indent=0)
    if not args.chat_only:
        make_fixtures(out, log)
    with open(os.path.join(out, "fixtures_log.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
