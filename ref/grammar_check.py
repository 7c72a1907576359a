#!/usr/bin/env python3
"""Validate random walks of dsinfer's grammar engine with outside parsers.

Each case runs `dsinfer grammar sample SRC -m TOKDIR --seed S --count N` (random allowed tokens
of the real tokenizer, steered to an end after a random length) and checks every output:
  schema:FILE[:ws] / schemas:DIR[:ws]  json.loads (no duplicate keys) + jsonschema validation
                      (Draft 2020-12, formats date/time/date-time/email/uuid checked strictly);
                      compact: no whitespace outside strings
  json_object[:ws]    json.loads gives a dict
  regex:RE            re.fullmatch(RE, text, re.ASCII)   (ECMA-262 meaning of \\d \\w \\s)
  regexes:FILE        one regex per line
  ebnf-json:FILE      json.loads
  ebnf-arith:FILE     ast.parse(mode="eval") with only numbers, + - * / ** %, unary -, ( )
  ebnf-sql:FILE       sqlite3 EXPLAIN on a database with the grammar's tables
Exit 0 when every output is valid, 1 otherwise (each failure printed).

Usage: grammar_check.py --dsinfer build/dsinfer -m TOKDIR [--count N] [--seed S] CASE...
"""
import argparse
import ast
import datetime
import json
import os
import re
import sqlite3
import subprocess
import sys
import uuid

try:
    import jsonschema
except ImportError:  # pragma: no cover
    jsonschema = None

DATE_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$", re.ASCII)
TIME_RE = re.compile(r"^(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$", re.ASCII)


def is_date(s):
    m = DATE_RE.match(s)
    if not m:
        return False
    try:
        datetime.date(int(m[1]), int(m[2]), int(m[3]))
        return True
    except ValueError:
        return False


def is_time(s):
    m = TIME_RE.match(s)
    if not m:
        return False
    h, mi, se = int(m[1]), int(m[2]), int(m[3])
    if h > 23 or mi > 59 or se > 59:
        return False
    if m[5] != "Z":
        oh, om = int(m[5][1:3]), int(m[5][4:6])
        if oh > 23 or om > 59:
            return False
    return True


def is_datetime(s):
    if "T" not in s:
        return False
    d, _, t = s.partition("T")
    return is_date(d) and is_time(t)


EMAIL_RE = re.compile(r"^[^@\s]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+$", re.ASCII)


def is_email(s):
    return bool(EMAIL_RE.match(s))


def is_uuid(s):
    try:
        uuid.UUID(s)
    except ValueError:
        return False
    return len(s) == 36 and all(s[i] == "-" for i in (8, 13, 18, 23))


def format_checker():
    fc = jsonschema.FormatChecker(formats=())
    for name, fn in (("date", is_date), ("time", is_time), ("date-time", is_datetime),
                     ("email", is_email), ("uuid", is_uuid)):
        # a format applies to strings only (e.g. "type": ["string", "null"] with a null value)
        fc.checks(name)(lambda x, fn=fn: not isinstance(x, str) or fn(x))
    return fc


def openapi_nullable(s):
    """OpenAPI's "nullable": true (which dsinfer honours) as JSON Schema: add "null" to type."""
    if isinstance(s, dict):
        s = {k: openapi_nullable(v) for k, v in s.items()}
        if s.get("nullable") is True and "type" in s:
            t = s["type"] if isinstance(s["type"], list) else [s["type"]]
            s["type"] = t + ["null"]
    elif isinstance(s, list):
        s = [openapi_nullable(x) for x in s]
    return s


def no_dupes(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key in {keys}")
    return dict(pairs)


def ws_outside_strings(text):
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in " \t\n\r":
            return True
    return False


def sample(args, src, count):
    cmd = [args.dsinfer, "grammar", "sample", *src, "-m", args.model, "--seed", str(args.seed),
           "--count", str(count), "--max-tokens", str(args.max_tokens)]
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    return [json.loads(line) for line in r.stdout.decode().splitlines() if line.strip()]


ARITH_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult,
               ast.Div, ast.Pow, ast.Mod, ast.USub, ast.UAdd)

SQL_SCHEMA = """
CREATE TABLE users (id INTEGER, name TEXT, age INTEGER, email TEXT);
CREATE TABLE orders (id INTEGER, user_id INTEGER, total REAL, status TEXT);
"""


def check_outputs(kind, target, outputs, ws):
    """Returns a list of (text, reason) failures."""
    bad = []
    validator = None
    if kind == "schema":
        schema = openapi_nullable(json.load(open(target, encoding="utf-8")))
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator = cls(schema, format_checker=format_checker())
    db = None
    if kind == "ebnf-sql":
        db = sqlite3.connect(":memory:")
        db.executescript(SQL_SCHEMA)
    for text in outputs:
        try:
            if kind in ("schema", "json_object", "ebnf-json"):
                v = json.loads(text, object_pairs_hook=no_dupes)
                if kind == "schema":
                    errs = sorted(validator.iter_errors(v), key=str)
                    if errs:
                        raise ValueError(errs[0].message)
                if kind == "json_object" and not isinstance(v, dict):
                    raise ValueError("not an object")
                if ws == "compact" and ws_outside_strings(text):
                    raise ValueError("whitespace in compact output")
                if kind != "ebnf-json" and text != text.strip():
                    raise ValueError("whitespace around the value")
            elif kind == "regex":
                if not re.fullmatch(target, text, re.ASCII):
                    raise ValueError("no full match")
            elif kind == "ebnf-arith":
                tree = ast.parse(text, mode="eval")
                for node in ast.walk(tree):
                    if not isinstance(node, ARITH_NODES):
                        raise ValueError(f"unexpected {type(node).__name__}")
            elif kind == "ebnf-sql":
                db.execute("EXPLAIN " + text)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            bad.append((text, f"{type(e).__name__}: {e}"))
    return bad


def expand(cases):
    out = []
    for c in cases:
        kind, _, rest = c.partition(":")
        if kind == "schemas":
            d, _, ws = rest.partition(":")
            for f in sorted(os.listdir(d)):
                if f.endswith(".json"):
                    out.append(("schema", os.path.join(d, f), ws or "flexible"))
        elif kind == "schema":
            f, _, ws = rest.partition(":")
            out.append(("schema", f, ws or "flexible"))
        elif kind == "json_object":
            out.append(("json_object", None, rest or "flexible"))
        elif kind == "regexes":
            for line in open(rest, encoding="utf-8"):
                line = line.rstrip("\n")
                if line and not line.startswith("#"):
                    out.append(("regex", line, None))
        elif kind in ("regex", "ebnf-json", "ebnf-arith", "ebnf-sql"):
            out.append((kind, rest, None))
        else:
            raise SystemExit(f"unknown case {c}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsinfer", default="build/dsinfer")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=600)
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args()
    if jsonschema is None and any(c.startswith("schema") for c in args.cases):
        print("SKIP: python jsonschema not installed (pip install jsonschema)", file=sys.stderr)
        sys.exit(3)
    failed = total = 0
    for kind, target, ws in expand(args.cases):
        if kind == "schema":
            src = ["--schema", target, "--ws", ws]
        elif kind == "json_object":
            src = ["--json-object", "--ws", ws]
        elif kind == "regex":
            src = ["--regex", target]
        else:
            src = ["--ebnf", target]
        label = f"{kind}:{target}" + (f":{ws}" if ws else "")
        try:
            outs = sample(args, src, args.count)
        except RuntimeError as e:
            print(f"FAIL {label}: {e}", file=sys.stderr)
            failed += 1
            continue
        bad = check_outputs(kind, target, outs, ws)
        total += len(outs)
        if bad or len(outs) != args.count:
            failed += 1
            print(f"FAIL {label}: {len(bad)}/{len(outs)} invalid", file=sys.stderr)
            for text, why in bad[:3]:
                print(f"   {why}: {text[:300]!r}", file=sys.stderr)
        else:
            print(f"ok   {label}: {len(outs)} outputs", file=sys.stderr)
    print(f"grammar check: {total} outputs, {failed} failing cases")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
