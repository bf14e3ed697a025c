#!/usr/bin/env python3
"""Independent checks of edge-run's constrained outputs (tests/tests/constrained_output.rs).

Reads a JSON-lines file of {"check", "output", "complete", ...} records and checks each output
with a parser that knows nothing of edge-run: Python's `jsonschema` for JSON schemas and tool
call arguments, `json` for json.gbnf, `ast` for arithmetic.gbnf, regexes written from the
grammars for list/chess/english. "complete" is false for an output cut by the token limit: then
the complete units (lines, equations) are checked and the cut tail must be a prefix of one.
Prints one line per failure and a summary; exits 1 on any failure, 3 when jsonschema is missing.
"""
import ast
import json
import re
import sys

try:
    import jsonschema
except ImportError:
    print("the Python package jsonschema is missing: pip install jsonschema")
    sys.exit(3)


def check_schema(rec):
    value = json.loads(rec["output"])
    jsonschema.validate(value, rec["schema"])


def closers(text):
    """The brackets that close what `text` (outside strings) leaves open, and whether it ends
    inside a string."""
    stack, in_str, esc = [], False, False
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
        elif ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}":
            if stack:
                stack.pop()
    return "".join(reversed(stack)), in_str


def json_prefix_ok(text):
    """Whether `text` is the beginning of some JSON document: some completion of it parses."""
    for fix in ["", "0", '"', 'x"', "0\"", "u0000\"", "rue", "ue", "e", "alse", "lse", "se", "ull", "ll", "l"]:
        for mid in ["", ": 0", '": 0', '"x": 0', "0"]:
            head = text + fix + mid
            close, in_str = closers(head)
            if in_str:
                continue
            try:
                json.loads(head + close)
                return True
            except ValueError:
                pass
    return False


def check_json_gbnf(rec):
    want = dict if rec["grammar"] == "json" else list
    if not rec["complete"]:
        assert rec["output"].lstrip()[:1] == ("{" if want is dict else "["), "wrong start"
        assert json_prefix_ok(rec["output"]), "not the beginning of a JSON document"
        return
    v = json.loads(rec["output"])
    assert isinstance(v, want), f"expected a JSON {want.__name__}"


ARITH_TOKEN = re.compile(r"[a-z][a-z0-9_]*|[0-9]+|[-+*/()=]|[ \t\n]+")


def check_arith_expr(text):
    tree = ast.parse(text.strip(), mode="eval")
    for node in ast.walk(tree):
        ok = (ast.Expression, ast.BinOp, ast.Name, ast.Constant, ast.Load,
              ast.Add, ast.Sub, ast.Mult, ast.Div)
        assert isinstance(node, ok), f"not arithmetic: {ast.dump(node)}"
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int), "non-integer constant"


def check_arithmetic(rec):
    out = rec["output"]
    pos, toks = 0, []
    while pos < len(out):
        m = ARITH_TOKEN.match(out, pos)
        assert m, f"unexpected character {out[pos]!r} at {pos}"
        toks.append(m.group(0))
        pos = m.end()
    assert rec["complete"] is False or out.endswith("\n"), "an equation does not end the line"
    # Split into equations: expr "=" term, where term is a name, a number or a (group).
    eqs, cur, i = [], [], 0
    sig = [t for t in toks if t.strip()]
    while i < len(sig):
        if sig[i] == "=":
            lhs = cur
            i += 1
            if i >= len(sig):
                assert not rec["complete"], "nothing after ="
                cur = None
                break
            if sig[i] == "(":
                depth, j = 0, i
                while j < len(sig):
                    depth += {"(": 1, ")": -1}.get(sig[j], 0)
                    j += 1
                    if depth == 0:
                        break
                if depth != 0:
                    assert not rec["complete"], "unbalanced term"
                    cur = None
                    break
                rhs = sig[i:j]
                i = j
            else:
                rhs = [sig[i]]
                i += 1
            eqs.append((lhs, rhs))
            cur = []
        else:
            cur.append(sig[i])
            i += 1
    assert eqs, "no complete equation"
    if rec["complete"]:
        assert cur == [], "text after the last equation"
    for lhs, rhs in eqs:
        check_arith_expr(" ".join(lhs))
        check_arith_expr(" ".join(rhs))


LIST_ITEM = re.compile(r"- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n")
MOVE = r"(?:(?:[a-h]x)?[a-h][1-8](?:=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?"
CHESS_FIRST = re.compile(f"1\\. {MOVE} {MOVE}\n")
CHESS_LINE = re.compile(f"[1-9][0-9]?\\. {MOVE} {MOVE}\n")
EN_CHAR = r"[a-zA-Z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]"
ENGLISH = re.compile(f"{EN_CHAR}+(?:[ \t\n]{EN_CHAR}+)*")


def check_lines(rec, first, rest, min_lines):
    out = rec["output"]
    lines = out.split("\n")
    tail = lines.pop()  # "" when the output ends with a newline
    if rec["complete"]:
        assert tail == "", "the last line is not finished"
    assert len(lines) >= (min_lines if rec["complete"] else 1), f"fewer than {min_lines} lines"
    for n, line in enumerate(lines):
        rx = first if n == 0 else rest
        assert rx.fullmatch(line + "\n"), f"line {n + 1} does not match: {line!r}"


def check_english(rec):
    out = rec["output"]
    text = out if rec["complete"] else out.rstrip(" \t\n")
    assert ENGLISH.fullmatch(text), "not english.gbnf text"


def raw_calls(syntax, out):
    """The calls in `out`, read as the model's chat template documents its syntax: Hermes
    `<tool_call>\n{"name", "arguments"}\n</tool_call>` blocks, Llama 3 one
    `{"name", "parameters"}` object, Mistral `[TOOL_CALLS]` and a JSON list of
    `{"name", "arguments"}`."""
    if syntax == "hermes":
        blocks = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", out, re.S)
        assert re.sub(r"<tool_call>\n.*?\n</tool_call>\n?", "", out, flags=re.S).strip() == "", "text around the calls"
        return [(o["name"], o["arguments"]) for o in map(json.loads, blocks)]
    if syntax == "llama3":
        o = json.loads(out)
        assert set(o) == {"name", "parameters"}, f"keys {set(o)}"
        return [(o["name"], o["parameters"])]
    if syntax == "mistral":
        assert out.startswith("[TOOL_CALLS]"), "no [TOOL_CALLS] opening"
        lst = json.loads(out[len("[TOOL_CALLS]"):])
        assert isinstance(lst, list) and lst, "not a non-empty list"
        for o in lst:
            assert set(o) == {"name", "arguments"}, f"keys {set(o)}"
        return [(o["name"], o["arguments"]) for o in lst]
    raise AssertionError(f"unknown syntax {syntax}")


def check_tool_call(rec):
    calls = rec["calls"]
    assert calls, "no tool call"
    if rec.get("syntax"):
        raw = raw_calls(rec["syntax"], rec["output"])
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        assert raw == got, f"the output's calls {raw} are not the parsed ones {got}"
    tools = {t["function"]["name"]: t["function"] for t in rec["tools"]}
    for c in calls:
        name = c["function"]["name"]
        assert name in tools, f"unknown function {name}"
        if rec.get("choice") not in (None, "required", "auto"):
            assert name == rec["choice"], f"called {name}, not {rec['choice']}"
        args = json.loads(c["function"]["arguments"])
        jsonschema.validate(args, tools[name].get("parameters", {"type": "object"}))
        if rec.get("syntax") == "mistral":
            assert re.fullmatch(r"[A-Za-z0-9]{9}", c["id"]), f"bad Mistral id {c['id']}"
        else:
            assert re.fullmatch(r"call_[0-9a-f]{24}", c["id"]), f"bad id {c['id']}"
    assert len({c["id"] for c in calls}) == len(calls), "ids repeat"


def check(rec):
    kind = rec["check"]
    if kind == "schema":
        check_schema(rec)
    elif kind == "tool_call":
        check_tool_call(rec)
    elif rec["grammar"] in ("json", "json_arr"):
        check_json_gbnf(rec)
    elif rec["grammar"] == "arithmetic":
        check_arithmetic(rec)
    elif rec["grammar"] == "list":
        check_lines(rec, LIST_ITEM, LIST_ITEM, 1)
    elif rec["grammar"] == "chess":
        check_lines(rec, CHESS_FIRST, CHESS_LINE, 2)
    elif rec["grammar"] == "english":
        check_english(rec)
    else:
        raise AssertionError(f"no validator for {rec['grammar']}")


def main():
    records = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
    bad = 0
    for rec in records:
        try:
            check(rec)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            bad += 1
            print(f"FAIL {rec.get('name', '?')}: {type(e).__name__}: {e}: output {rec['output']!r}")
    print(f"checked {len(records)} outputs: {len(records) - bad} valid, {bad} invalid")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
