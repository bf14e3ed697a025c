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

# Tool calls, on the server started with a Hermes tool-call template (SmolLM2's own has none):
# with tool_choice "required" or a named function, every answer is a call of a given function
# (the named one) whose arguments validate (jsonschema) against its parameters; streamed, each
# call's id and name come in its first delta, then the argument fragments; a "tool" message
# in the history reaches the template.
try:
    client.chat.completions.create(
        model=model, messages=messages, max_tokens=8,
        tools=[{"type": "function", "function": {"name": "stop", "parameters": {"type": "object"}}}],
    )
    check(False, "tools with a template without a tool-call syntax are refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "--chat-template-file" in str(e), f"tools without a tool syntax -> 400 naming the fix: {e}")

TOOLS_BASE = os.environ.get("EDGE_RUN_TOOLS_BASE_URL")
if TOOLS_BASE:
    tc = OpenAI(base_url=TOOLS_BASE, api_key=KEY, max_retries=0, timeout=120)
    tdir = os.environ["EDGE_RUN_TOOL_SETS"]
    with open(os.path.join(tdir, "prompts.json")) as f:
        tool_prompts = _json.load(f)

    def valid_call(call, params, allowed, what):
        check(call["type"] == "function" and isinstance(call["id"], str) and call["id"], f"{what}: call id and type")
        name = call["function"]["name"]
        check(name in allowed, f"{what}: calls a given function ({name})")
        args = _json.loads(call["function"]["arguments"])
        try:
            jsonschema.validate(args, params[name])
            ok = True
        except jsonschema.ValidationError as e:
            print(e, file=sys.stderr)
            ok = False
        check(ok, f"{what}: arguments {call['function']['arguments']} valid for {name}")

    def streamed_calls(**kw):
        calls, finish, text = {}, None, ""
        for chunk in tc.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                if c.finish_reason:
                    finish = c.finish_reason
                if c.delta.content:
                    text += c.delta.content
                for d in c.delta.tool_calls or []:
                    if d.index not in calls:
                        check(d.id is not None and d.function.name is not None, "a streamed call opens with its id and name")
                        calls[d.index] = {"id": d.id, "type": d.type, "function": {"name": d.function.name, "arguments": ""}}
                    else:
                        check(d.id is None, "a streamed call's id comes once")
                    calls[d.index]["function"]["arguments"] += d.function.arguments or ""
        return [calls[i] for i in sorted(calls)], finish, text

    n_calls = 0
    for set_name, plist in tool_prompts.items():
        with open(os.path.join(tdir, f"{set_name}.json")) as f:
            tools = _json.load(f)
        params = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
        first = tools[0]["function"]["name"]
        named = {"type": "function", "function": {"name": first}}
        for p in plist:
            msgs = [{"role": "system", "content": "You control a robot."}, {"role": "user", "content": p}]
            base = dict(model=model, messages=msgs, tools=tools, max_tokens=160)
            what = f"{set_name}: {p!r}"
            r = tc.chat.completions.create(tool_choice="required", temperature=0, **base)
            m = r.choices[0].message
            check(r.choices[0].finish_reason == "tool_calls" and m.content is None and m.tool_calls, f"{what}: required -> finish_reason tool_calls, content null")
            whole = [c.model_dump() for c in m.tool_calls]
            for c in whole:
                valid_call(c, params, params, f"{what} required")
                n_calls += 1
            calls, finish, text = streamed_calls(tool_choice="required", temperature=0, **base)
            check(finish == "tool_calls" and text == "", f"{what}: streamed required -> tool_calls, no text")
            check([c["function"] for c in calls] == [c["function"] for c in whole], f"{what}: streamed greedy calls equal the whole answer's")
            calls, finish, _ = streamed_calls(tool_choice="required", temperature=0.9, seed=11, **base)
            check(finish == "tool_calls" and calls, f"{what}: streamed sampled required")
            for c in calls:
                valid_call(c, params, params, f"{what} required sampled streamed")
                n_calls += 1
            r = tc.chat.completions.create(tool_choice=named, temperature=0.9, seed=5, **base)
            check(r.choices[0].finish_reason == "tool_calls", f"{what}: named -> tool_calls")
            for c in r.choices[0].message.tool_calls:
                valid_call(c.model_dump(), params, [first], f"{what} named {first}")
                n_calls += 1
            r = tc.chat.completions.create(tool_choice="auto", temperature=0, **base)
            m = r.choices[0].message
            for c in m.tool_calls or []:
                valid_call(c.model_dump(), params, params, f"{what} auto")
            check(m.tool_calls or isinstance(m.content, str), f"{what}: auto gives text or calls")
    check(n_calls >= 3 * 12, f"{n_calls} tool calls checked (3 per prompt, 12 prompts)")

    # Several calls in one answer when parallel_tool_calls allows them; each is valid.
    with open(os.path.join(tdir, "home.json")) as f:
        tools = _json.load(f)
    params = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    r = tc.chat.completions.create(
        model=model, tools=tools, tool_choice="required", parallel_tool_calls=True, temperature=0, max_tokens=200,
        messages=[{"role": "user", "content": "Turn on the kitchen light and play some jazz."}],
    )
    calls = r.choices[0].message.tool_calls or []
    check(len(calls) >= 1 and len({c.id for c in calls}) == len(calls), f"parallel_tool_calls: {len(calls)} calls, distinct ids")
    for c in calls:
        valid_call(c.model_dump(), params, params, "parallel")

    # A round trip: the call, its result as a "tool" message, then the answer.
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    r1 = tc.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required", temperature=0, max_tokens=100)
    call = r1.choices[0].message.tool_calls[0]
    result = '{"temperature_c": 18, "sky": "sunny", "wind_kmh": 12, "note": "a fine spring day in Paris"}'
    history = ask + [
        r1.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    r2 = tc.chat.completions.create(model=model, messages=history, tools=tools, tool_choice="none", temperature=0, max_tokens=48)
    check(isinstance(r2.choices[0].message.content, str) and r2.choices[0].message.content and not r2.choices[0].message.tool_calls, "round trip: the answer after a tool result is text")
    # The history's call and result were rendered: the prompt grew by at least their tokens.
    grew = r2.usage.prompt_tokens - r1.usage.prompt_tokens
    check(grew >= 30, f"round trip: the call and the tool result reach the template (+{grew} prompt tokens)")
    try:
        tc.chat.completions.create(model=model, messages=ask, max_tokens=8, tools=[{"type": "function", "function": {"description": "no name"}}])
        check(False, "a function without a name is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "'tools'" in str(e) and "name" in str(e), f"a nameless function -> 400 naming tools: {e}")
    try:
        tc.chat.completions.create(model=model, messages=ask, max_tokens=8, tool_choice="required",
                                   tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}])
        check(False, "a parameters schema llguidance refuses is refused")
    except openai.BadRequestError as e:
        check("tools[0].function.parameters" in str(e) and "not" in str(e), f"a bad parameters schema -> 400 naming it: {e}")
    try:
        tc.chat.completions.create(model=model, messages=ask, max_tokens=8, tools=tools, tool_choice={"type": "function", "function": {"name": "fly"}})
        check(False, "tool_choice naming an unknown function is refused")
    except openai.BadRequestError as e:
        check("tool_choice" in str(e) and "fly" in str(e), f"unknown tool_choice function -> 400: {e}")
    print("ok: tool calls checked")

    # The schema set (tests/reference/json-schemas/, 5 prompts each), greedy and sampled, through
    # the server: every answer must finish (no max_tokens: the budget is the rest of the context,
    # more than any schema's longest output) and validate against its schema.
    from concurrent.futures import ThreadPoolExecutor

    sdir = os.environ["EDGE_RUN_SCHEMAS"]
    with open(os.path.join(sdir, "prompts.json")) as f:
        schema_prompts = _json.load(f)
    jobs = []
    for name in sorted(schema_prompts):
        with open(os.path.join(sdir, f"{name}.json")) as f:
            schema = _json.load(f)
        for p in schema_prompts[name]:
            for temp, seed in ((0, 1), (0.8, 7)):
                jobs.append((name, schema, p, temp, seed))

    def answer(job):
        name, schema, p, temp, seed = job
        r = tc.chat.completions.create(
            model=model, temperature=temp, seed=seed,
            messages=[{"role": "system", "content": "You control a robot. Answer with one JSON value only."}, {"role": "user", "content": p}],
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
        )
        out = r.choices[0].message.content
        try:
            jsonschema.validate(_json.loads(out), schema)
            return r.choices[0].finish_reason == "stop", out
        except Exception as e:  # noqa: BLE001 - any failure is an invalid output
            return False, f"{out!r}: {e}"

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(answer, jobs))
    bad = [(j[0], j[2], j[3], out) for j, (ok, out) in zip(jobs, results) if not ok]
    for b in bad:
        print("invalid:", b, file=sys.stderr)
    n_ok = len(jobs) - len(bad)
    check(len(jobs) >= 200 and not bad, f"schema set through the server: {n_ok}/{len(jobs)} valid ({len(schema_prompts)} schemas x 5 prompts, greedy and sampled)")

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
