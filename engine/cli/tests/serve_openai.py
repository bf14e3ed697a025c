"""OpenAI's own Python client against `edge-run serve` (run by tests/serve.rs, which starts the
server and passes its URL and key): chat completions streamed and not (greedy text equal to
the CLI's `--chat --temp 0` answer), completions, models, and errors raised as the client's
own exception classes. Prints "ok: all checks passed" at the end; any failure raises."""

import os
import sys

import openai
from openai import OpenAI

BASE = os.environ["EDGE_RUN_BASE_URL"]
KEY = os.environ["EDGE_RUN_API_KEY"]
QUESTION = os.environ["EDGE_RUN_QUESTION"]
EXPECTED = os.environ["EDGE_RUN_EXPECTED"]

client = OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


models = client.models.list()
ids = [m.id for m in models.data]
check(ids == ["SmolLM2-135M-Instruct.Q4_1"], f"models.list gives the model ({ids})")
model = ids[0]

messages = [{"role": "user", "content": QUESTION}]
r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=32)
check(r.object == "chat.completion", "chat completion object")
text = r.choices[0].message.content
check(text == EXPECTED, f"greedy chat equals the CLI's: {text!r} vs {EXPECTED!r}")
check(r.choices[0].finish_reason in ("stop", "length"), "finish_reason")
check(r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage")

parts = []
finish = None
usage = None
stream = client.chat.completions.create(
    model=model, messages=messages, temperature=0, max_tokens=32, stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check("".join(parts) == EXPECTED, f"streamed greedy chat equals the CLI's: {''.join(parts)!r}")
check(finish in ("stop", "length"), f"streamed finish_reason {finish}")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, "streamed usage")

c = client.completions.create(model=model, prompt="1, 2, 3, 4, 5,", max_tokens=8, temperature=0)
check(c.choices[0].text.startswith(" 6, 7"), f"completion text {c.choices[0].text!r}")
check(c.choices[0].finish_reason == "length", "completion finish_reason length")
got = "".join(
    ch.choices[0].text
    for ch in client.completions.create(model=model, prompt="1, 2, 3, 4, 5,", max_tokens=8, temperature=0, stream=True)
    if ch.choices
)
check(got == c.choices[0].text, f"streamed completion equals the whole one: {got!r}")

# Seeded sampling is reproducible.
a = client.chat.completions.create(model=model, messages=messages, temperature=0.9, seed=7, max_tokens=16)
b = client.chat.completions.create(model=model, messages=messages, temperature=0.9, seed=7, max_tokens=16)
check(a.choices[0].message.content == b.choices[0].message.content, "the same seed gives the same text")

# Constrained output: response_format json_schema and json_object, checked by an independent
# validator (jsonschema), greedy and sampled; a bad schema is a 400 naming the field.
import json as _json
import jsonschema

ROBOT = {
    "type": "object",
    "properties": {
        "action": {"enum": ["move", "stop", "turn"]},
        "x": {"type": "number", "minimum": -1, "maximum": 1},
        "speed": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["action", "x"],
    "additionalProperties": False,
}
cmd = [{"role": "user", "content": "Give the robot a command to move a little to the left, as JSON."}]
for temp, seed in ((0, 1), (0.9, 3), (0.9, 4)):
    r = client.chat.completions.create(
        model=model, messages=cmd, temperature=temp, seed=seed, max_tokens=96,
        response_format={"type": "json_schema", "json_schema": {"name": "robot", "schema": ROBOT}},
    )
    out = r.choices[0].message.content
    try:
        jsonschema.validate(_json.loads(out), ROBOT)
        ok = True
    except Exception as e:  # noqa: BLE001 - any failure is the test failing
        ok = False
        print(e, file=sys.stderr)
    check(ok, f"response_format json_schema (temperature {temp}) gives valid JSON: {out!r}")
# json_object has no bounds: SmolLM2 may nest objects until the token limit. A finished answer
# must be an object; one cut by the limit must still be the start of one.
r = client.chat.completions.create(
    model=model, messages=cmd, temperature=0, max_tokens=96, response_format={"type": "json_object"},
)
out = r.choices[0].message.content
if r.choices[0].finish_reason == "stop":
    try:
        ok = isinstance(_json.loads(out), dict)
    except ValueError:
        ok = False
else:
    # Cut at the limit: it parses once the open strings, objects and arrays are closed.
    closers, in_str, esc = [], False, False
    for ch in out:
        if in_str:
            esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            closers.append("}" if ch == "{" else "]")
        elif ch in "}]":
            closers.pop()
    close = "".join(reversed(closers))
    fixes = ['"' + close, '":null' + close] if in_str else [close, "null" + close, "0" + close, ":null" + close]
    fixes += [lit[k:] + close for lit in ("true", "false", "null") for k in range(1, len(lit)) if out.endswith(lit[:k])]
    ok = out.lstrip().startswith("{")
    for fix in fixes:
        try:
            _json.loads(out + fix)
            break
        except ValueError:
            pass
    else:
        ok = False
check(ok, f"response_format json_object gives a JSON object (or its start, at the limit): {out!r}")
parts = []
for chunk in client.chat.completions.create(
    model=model, messages=cmd, temperature=0, max_tokens=96, stream=True,
    response_format={"type": "json_schema", "json_schema": {"name": "robot", "schema": ROBOT}},
):
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
try:
    jsonschema.validate(_json.loads("".join(parts)), ROBOT)
    ok = True
except Exception:  # noqa: BLE001
    ok = False
check(ok, f"streamed response_format json_schema gives valid JSON: {''.join(parts)!r}")
try:
    client.chat.completions.create(
        model=model, messages=cmd, max_tokens=8,
        response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "objekt"}}},
    )
    check(False, "a bad schema is refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "response_format" in str(e), "bad schema -> BadRequestError naming response_format")

# Errors come back as the client's exception classes.
try:
    client.chat.completions.create(model=model, messages=messages, temperature="hot")
    check(False, "a bad temperature is refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "temperature" in str(e), "bad temperature -> BadRequestError naming it")
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "word " * 2000}])
    check(False, "a prompt longer than the context is refused")
except openai.BadRequestError as e:
    check(e.code == "context_length_exceeded", "long prompt -> BadRequestError context_length_exceeded")
try:
    client.embeddings.create(model=model, input="hello")
    check(False, "embeddings from a decoder are refused")
except openai.BadRequestError:
    check(True, "embeddings on a decoder -> BadRequestError")
try:
    OpenAI(base_url=BASE, api_key="wrong", max_retries=0).models.list()
    check(False, "a wrong key is refused")
except openai.AuthenticationError as e:
    check(e.status_code == 401, "wrong key -> AuthenticationError")
try:
    client.models.retrieve("no-such-model")
    check(False, "an unknown model is not found")
except openai.NotFoundError:
    check(True, "unknown model -> NotFoundError")

# Embeddings, with an encoder model's server (the client asks for base64 by default).
EMBED_BASE = os.environ.get("EDGE_RUN_EMBED_BASE_URL")
if EMBED_BASE:
    import json

    texts = json.loads(os.environ["EDGE_RUN_EMBED_TEXTS"])
    want = json.loads(os.environ["EDGE_RUN_EMBED_EXPECTED"])
    ec = OpenAI(base_url=EMBED_BASE, api_key="unused", max_retries=0)
    import base64
    import struct

    def floats(v):
        # Asked for explicitly, base64 comes back as the string (the client decodes only its own default).
        if isinstance(v, str):
            raw = base64.b64decode(v)
            return list(struct.unpack(f"<{len(raw) // 4}f", raw))
        return v

    for fmt in ("base64", "float"):
        e = ec.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format=fmt)
        got = [floats(d.embedding) for d in e.data]
        worst = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w))
        check(len(got) == len(want) and all(len(g) == len(w) for g, w in zip(got, want)), f"embedding shapes ({fmt})")
        check(worst < 1e-6, f"embeddings equal the CLI's ({fmt}): max difference {worst}")
    e = ec.embeddings.create(model="all-MiniLM-L6-v2", input=texts[0])
    check(len(e.data) == 1 and e.usage.prompt_tokens > 0, "one text, default encoding")

print("ok: all checks passed")
