"""The official `openai` Python client against a running `tandem serve` (started by
tests/server_api.rs, test `openai_python_client`).

    python tests/server/openai_client.py --base-url http://127.0.0.1:PORT/v1 --model NAME --model-dir DIR

Checks, with Hugging Face `transformers` as the independent oracle for token counts:
- /v1/models lists the model, and `models.retrieve` finds it (an unknown name is NotFoundError);
- non-streaming: content arrives, `usage` is right (prompt tokens equal transformers' count of the
  chat template's ids; completion tokens equal max_tokens when the finish reason is "length"),
  Tandem's `stats` object is present and agrees with `usage`;
- streaming with include_usage: chunks in OpenAI's shape, the same text as non-streaming (greedy),
  a final usage chunk with empty choices;
- stop sequences (streaming and not), max_completion_tokens, seeded sampling reproducible;
- errors surface as the client's typed exceptions (404 unknown model, 400 bad value);
- structured output: a `json_schema` answer that validates (jsonschema), with MTP drafting under the
  constraint, the same text streamed; `json_object`; a schema that cannot compile is a 400;
- presence/frequency penalties change a greedy answer;
- function calling: a required and a named call whose arguments validate against the tool's schema,
  streamed as a tool_calls delta, the result fed back as a tool message; tool_choice none and auto;
- /v1/completions: a raw prompt (token count without the chat template), streamed and not, the default
  max_tokens, and its unimplemented parameters refused by name.
Prints one line per check; exits non-zero on the first failure.
"""

import argparse
import json

import jsonschema
import openai
from transformers import AutoTokenizer

from checks import check, template_tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--api-key", default="not-needed")
    args = ap.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Tell me a short story about a cat."},
    ]
    expected_prompt = template_tokens(tok, messages)

    ids = [m.id for m in client.models.list().data]
    check(args.model in ids, f"/v1/models lists {args.model} ({ids})")
    check(client.models.retrieve(args.model).id == args.model, f"models.retrieve({args.model!r})")
    try:
        client.models.retrieve("no-such-model")
        check(False, "models.retrieve of an unknown name fails")
    except openai.NotFoundError as e:
        check("no-such-model" in str(e), f"models.retrieve of an unknown name is NotFoundError ({e})")

    # Non-streaming, greedy, long enough to run into the length limit.
    r = client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
    )
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), "completion object and id")
    check(isinstance(text, str) and len(text) > 0, f"content arrives ({text!r})")
    check(r.choices[0].message.role == "assistant", "role is assistant")
    check(r.choices[0].finish_reason == "length", f"finish_reason length ({r.choices[0].finish_reason})")
    u = r.usage
    check(u.prompt_tokens == expected_prompt, f"usage.prompt_tokens {u.prompt_tokens} == transformers' {expected_prompt}")
    check(u.completion_tokens == 24, f"usage.completion_tokens {u.completion_tokens} == max_tokens 24")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, "usage.total_tokens is the sum")
    stats = (r.model_extra or {}).get("stats")
    check(isinstance(stats, dict), "stats object present")
    for key in ["prompt_tokens", "completion_tokens", "ttft_ms", "prefill_tok_s", "decode_tok_s", "spec"]:
        check(key in stats, f"stats.{key} present")
    check(stats["prompt_tokens"] == u.prompt_tokens and stats["completion_tokens"] == u.completion_tokens, "stats agree with usage")
    spec = stats["spec"]
    check(spec is not None and spec["method"] == "mtp" and spec["fallback"] is None, f"MTP ran (fallback: {spec and spec.get('fallback')})")
    for key in ["depth", "cycles", "drafted", "accepted", "acceptance", "tok_per_cycle", "by_depth", "accepted_hist", "parked_cycles", "ms"]:
        check(key in spec, f"stats.spec.{key} present")

    # Streaming with usage: same text (greedy), OpenAI's chunk shape.
    chunks = list(
        client.chat.completions.create(
            model=args.model,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    check(len(chunks) >= 3, f"several chunks ({len(chunks)})")
    check(all(c.object == "chat.completion.chunk" for c in chunks), "every chunk is a chat.completion.chunk")
    check(len({c.id for c in chunks}) == 1, "one id across chunks")
    check(chunks[0].choices[0].delta.role == "assistant", "first delta carries the role")
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == text, f"streamed text equals non-streamed ({streamed!r} vs {text!r})")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(finishes == ["length"], f"one finish_reason chunk ({finishes})")
    last = chunks[-1]
    check(last.choices == [] and last.usage is not None, "last chunk: empty choices, usage")
    check(
        (last.usage.prompt_tokens, last.usage.completion_tokens) == (u.prompt_tokens, u.completion_tokens),
        f"streamed usage equals non-streamed ({last.usage})",
    )
    check(all(c.usage is None for c in chunks[:-1]), "usage is null on the other chunks")
    check(isinstance((last.model_extra or {}).get("stats"), dict), "stats on the usage chunk")

    # Streaming without include_usage: no usage chunk.
    plain = list(client.chat.completions.create(model=args.model, messages=messages, max_tokens=4, temperature=0, stream=True))
    check(all(c.choices for c in plain) and all(c.usage is None for c in plain), "no usage chunk unless asked")

    # Stop sequences: cut the greedy text at a word in its middle.
    words = [w for w in text.split(" ") if len(w) >= 2]
    if len(words) >= 2:
        stop = words[len(words) // 2]
        cut = text[: text.find(stop)]
        r2 = client.chat.completions.create(
            model=args.model, messages=messages, max_tokens=24, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
        )
        check(r2.choices[0].message.content == cut, f"stop {stop!r}: text cut before it ({r2.choices[0].message.content!r})")
        check(r2.choices[0].finish_reason == "stop", "stop: finish_reason stop")
        s2 = client.chat.completions.create(
            model=args.model, messages=messages, max_tokens=24, temperature=0, stop=stop, stream=True, extra_body={"ignore_eos": True}
        )
        streamed_cut = "".join(c.choices[0].delta.content or "" for c in s2 if c.choices)
        check(streamed_cut == cut, f"stop while streaming: same cut ({streamed_cut!r})")
    else:
        print(f"skip: stop check (greedy text has too few words: {text!r})")

    # max_completion_tokens wins over max_tokens.
    r3 = client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=20, max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )
    check(r3.usage.completion_tokens == 3, f"max_completion_tokens honoured ({r3.usage.completion_tokens})")

    # Seeded sampling is reproducible.
    kw = dict(model=args.model, messages=messages, max_tokens=16, temperature=1.0, top_p=0.9, seed=1234)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    check(a == b, "same seed, same text")

    # Errors as typed exceptions.
    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        check(False, "unknown model raises")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.body and e.body.get("code") == "model_not_found", f"unknown model: 404 model_not_found ({e.body})")
    try:
        client.chat.completions.create(model=args.model, messages=messages, temperature=-1)
        check(False, "negative temperature raises")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"bad temperature: 400 ({e.body})")
    # A parameter the server does not implement is refused by name, never ignored; its "off"
    # values (and `user`) are accepted.
    for what, extra in [
        ("service_tier", {"service_tier": "flex"}),
        ("prediction", {"prediction": {"type": "content", "content": "x"}}),
    ]:
        kwargs = {"model": args.model, "messages": messages, "max_tokens": 2, **extra}
        try:
            client.chat.completions.create(**kwargs)
            check(False, f"{what} raises")
        except openai.BadRequestError as e:
            body = e.body or {}
            check(
                e.status_code == 400 and body.get("code") == "unsupported_parameter" and f"`{what}`" in body.get("message", ""),
                f"{what}: 400 unsupported_parameter naming it ({body})",
            )
    r = client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=2, user="someone", frequency_penalty=0, logprobs=False, tools=[]
    )
    check(r.choices[0].logprobs is None, "no logprobs unless asked for")
    check(r.choices[0].message.content is not None, "user and parameters at their off values are accepted")

    # Structured output: constrained decoding, MTP on.
    schema = {
        "type": "object",
        "properties": {
            "ship": {"type": "string", "maxLength": 30},
            "crew": {"type": "integer", "minimum": 1, "maximum": 99},
            "flags": {"type": "array", "items": {"enum": ["red", "white", "blue"]}, "maxItems": 3},
        },
        "required": ["ship", "crew", "flags"],
        "additionalProperties": False,
    }
    ask = [{"role": "user", "content": "Describe the ship Pequod."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "ship", "schema": schema, "strict": True}}
    r = client.chat.completions.create(model=args.model, messages=ask, max_tokens=120, temperature=0, response_format=fmt)
    answer = r.choices[0].message.content
    try:
        jsonschema.validate(json.loads(answer), schema)
        valid = True
    except (ValueError, jsonschema.ValidationError) as e:
        valid = e
    check(valid is True, f"json_schema answer validates ({answer!r}: {valid})")
    check(r.choices[0].finish_reason == "stop", f"the schema's end ends the answer ({r.choices[0].finish_reason})")
    spec = ((r.model_extra or {}).get("stats") or {}).get("spec") or {}
    check(spec.get("method") == "mtp" and spec.get("drafted", 0) > 0, f"MTP drafted under the constraint ({spec})")
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=args.model, messages=ask, max_tokens=120, temperature=0, response_format=fmt, stream=True
        )
        if c.choices
    )
    check(streamed == answer, f"streamed constrained answer is the same ({streamed!r})")
    r = client.chat.completions.create(
        model=args.model, messages=ask, max_tokens=120, temperature=0, response_format={"type": "json_object"}
    )
    obj = r.choices[0].message.content
    check(isinstance(json.loads(obj), dict) if r.choices[0].finish_reason == "stop" else obj.startswith("{"), f"json_object answer ({obj!r})")
    try:
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nowhere"}}}
        client.chat.completions.create(model=args.model, messages=ask, max_tokens=4, response_format=bad)
        check(False, "a schema that cannot compile raises")
    except openai.BadRequestError as e:
        check("cannot compile" in str(e), f"uncompilable schema: 400 saying so ({e})")

    # Penalties: greedy text changes when repeated tokens cost more.
    plain = client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
    ).choices[0].message.content
    pen = client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=24, temperature=0, frequency_penalty=2.0, presence_penalty=1.0,
        extra_body={"ignore_eos": True},
    ).choices[0].message.content
    check(pen != plain, f"frequency/presence penalties change the greedy answer ({pen!r})")

    # Log-probabilities: one entry per token, greedy picks the most likely, the bytes spell the
    # text, the same with MTP as without (to the verify's rounding), streamed alike.
    import math
    lp_kwargs = dict(model=args.model, messages=messages, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**lp_kwargs, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens == 12, f"one logprob entry per token ({len(content)})")
    check(all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob for e in content), "top_logprobs: 3, most likely first")
    check(all(e.token == e.top_logprobs[0].token and abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6 and e.logprob <= 0 for e in content), "greedy tokens are the most likely")
    check(all(sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-4 for e in content), "probabilities sum to at most 1")
    check(b"".join(bytes(e.bytes) for e in content).decode() == r.choices[0].message.content, "the bytes spell the answer")
    plain = client.chat.completions.create(**lp_kwargs, extra_body={"ignore_eos": True, "mtp": {"enabled": False}}).choices[0].logprobs.content
    gap = max(abs(a.logprob - b.logprob) for a, b in zip(content, plain))
    check([e.token for e in plain] == [e.token for e in content] and gap < 0.05, f"MTP on and off give the same logprobs (max gap {gap:.4f})")
    streamed = [e for c in client.chat.completions.create(**lp_kwargs, stream=True, extra_body={"ignore_eos": True}) if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    check([e.token for e in streamed] == [e.token for e in content], "streamed logprobs arrive with their tokens")
    try:
        client.chat.completions.create(model=args.model, messages=messages, max_tokens=2, logprobs=True, top_logprobs=21)
        check(False, "top_logprobs 21 raises")
    except openai.BadRequestError as e:
        check("`top_logprobs`" in str(e), f"top_logprobs over 20: 400 naming it ({e})")

    # Function calling. The bundled model knows nothing of tools: a forced call (required or
    # named) is what constrained decoding makes of it, in Qwen's format, parsed into tool_calls.
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a port.",
            "parameters": {
                "type": "object",
                "properties": {"port": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["port", "days"],
                "additionalProperties": False,
            },
        },
    }
    tide = {"type": "function", "function": {"name": "get_tide", "parameters": {"type": "object", "properties": {"port": {"type": "string", "maxLength": 20}}, "required": ["port"], "additionalProperties": False}}}
    tools = [weather, tide]
    ask = [{"role": "user", "content": "What is the weather in Nantucket?"}]
    r = client.chat.completions.create(model=args.model, messages=ask, tools=tools, tool_choice="required", max_tokens=80, temperature=0)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls" and c.message.tool_calls, f"required: a call is made ({c.finish_reason}, {c.message})")
    call = c.message.tool_calls[0]
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    try:
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])
        valid = True
    except (KeyError, ValueError, jsonschema.ValidationError) as e:
        valid = e
    check(valid is True and call.type == "function" and call.id, f"required: arguments validate ({call.function}: {valid})")
    spec = ((r.model_extra or {}).get("stats") or {}).get("spec") or {}
    check(spec.get("method") == "mtp" and spec.get("drafted", 0) > 0, f"MTP drafted while the call was generated ({spec})")
    named = {"type": "function", "function": {"name": "get_tide"}}
    r = client.chat.completions.create(model=args.model, messages=ask, tools=tools, tool_choice=named, max_tokens=80, temperature=0)
    calls = r.choices[0].message.tool_calls or []
    check([x.function.name for x in calls][:1] == ["get_tide"], f"named: that function is called ({calls})")
    jsonschema.validate(json.loads(calls[0].function.arguments), by_name["get_tide"])
    pieces = list(client.chat.completions.create(model=args.model, messages=ask, tools=tools, tool_choice=named, max_tokens=80, temperature=0, stream=True))
    deltas = [tc for p in pieces if p.choices for tc in (p.choices[0].delta.tool_calls or [])]
    finishes = [p.choices[0].finish_reason for p in pieces if p.choices and p.choices[0].finish_reason]
    check(
        len(deltas) == len(calls) and deltas[0].index == 0 and deltas[0].function.name == "get_tide"
        and deltas[0].function.arguments == calls[0].function.arguments and finishes == ["tool_calls"],
        f"streamed: the call arrives as a tool_calls delta ({deltas}, {finishes})",
    )
    leaked = "".join(p.choices[0].delta.content or "" for p in pieces if p.choices)
    check("<tool_call>" not in leaked, f"streamed: the call's text is not content ({leaked!r})")
    # The result goes back as a tool message after the assistant's call.
    back = ask + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0].id, "type": "function", "function": {"name": "get_tide", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "High tide at 14:05."},
    ]
    r = client.chat.completions.create(model=args.model, messages=back, tools=tools, max_tokens=12, temperature=0)
    check(r.choices[0].message.content is not None and r.usage.prompt_tokens > 0, "a tool result is read back")
    r_none = client.chat.completions.create(model=args.model, messages=ask, tools=tools, tool_choice="none", max_tokens=12, temperature=0)
    check(not r_none.choices[0].message.tool_calls and r_none.choices[0].finish_reason != "tool_calls", "tool_choice none: no call")
    r_auto = client.chat.completions.create(model=args.model, messages=ask, tools=tools, max_tokens=12, temperature=0)
    check(r_auto.usage.prompt_tokens > r_none.usage.prompt_tokens, "the tools are in the prompt (auto) and not (none)")
    try:
        client.chat.completions.create(model=args.model, messages=ask, tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}, max_tokens=4)
        check(False, "an unknown named function raises")
    except openai.BadRequestError as e:
        check("`nope`" in str(e), f"unknown named function: 400 naming it ({e})")

    # /v1/completions: a raw prompt, no chat template.
    prompt = "Once upon a time"
    r = client.completions.create(model=args.model, prompt=prompt, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    check(r.object == "text_completion" and r.id.startswith("cmpl-"), "text_completion object and id")
    ctext = r.choices[0].text
    check(isinstance(ctext, str) and len(ctext) > 0 and r.choices[0].finish_reason == "length", f"completion text ({ctext!r})")
    raw_ids = tok(prompt)["input_ids"]
    check(r.usage.prompt_tokens == len(raw_ids), f"completion prompt_tokens {r.usage.prompt_tokens} == transformers' {len(raw_ids)} (no template)")
    check(r.usage.completion_tokens == 8, f"completion_tokens {r.usage.completion_tokens} == 8")
    check(isinstance((r.model_extra or {}).get("stats"), dict), "stats on the completion")
    pieces = list(
        client.completions.create(
            model=args.model, prompt=[prompt], max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
    )
    streamed = "".join(c.choices[0].text for c in pieces if c.choices)
    check(streamed == ctext, f"streamed completion equals non-streamed ({streamed!r} vs {ctext!r})")
    check(pieces[-1].choices == [] and pieces[-1].usage.completion_tokens == 8, "completion usage chunk last")
    check([c.choices[0].finish_reason for c in pieces if c.choices and c.choices[0].finish_reason] == ["length"], "one finish chunk")
    d = client.completions.create(model=args.model, prompt=prompt, temperature=0)
    check(d.usage.completion_tokens <= 16, f"max_tokens defaults to 16 ({d.usage.completion_tokens})")
    lp = client.completions.create(model=args.model, prompt=prompt, max_tokens=6, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    l = lp.choices[0].logprobs
    check(len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == len(l.text_offset) == 6, f"completions logprobs: one entry per token ({l})")
    check("".join(l.tokens) == lp.choices[0].text and l.text_offset[0] == 0 and all(len(t) == 2 for t in l.top_logprobs), "completions logprobs: tokens spell the text, 2 alternatives")
    check(all(abs(max(t.values()) - v) < 1e-6 for t, v in zip(l.top_logprobs, l.token_logprobs)), "completions logprobs: greedy tokens are the most likely")
    sl = [x for c in client.completions.create(model=args.model, prompt=prompt, max_tokens=6, temperature=0, logprobs=2, stream=True, extra_body={"ignore_eos": True}) if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.text_offset]
    check(sl == l.text_offset, f"streamed completions logprobs keep their offsets ({sl})")
    for what, extra in [("echo", {"echo": True}), ("suffix", {"suffix": "."}), ("best_of", {"best_of": 2})]:
        try:
            client.completions.create(model=args.model, prompt=prompt, max_tokens=2, **extra)
            check(False, f"completions {what} raises")
        except openai.BadRequestError as e:
            body = e.body or {}
            check(body.get("code") == "unsupported_parameter" and f"`{what}`" in body.get("message", ""), f"completions {what}: 400 naming it")
    try:
        client.completions.create(model=args.model, prompt=["a", "b"], max_tokens=2)
        check(False, "two prompts raise")
    except openai.BadRequestError as e:
        check("one prompt" in str(e), f"two prompts: 400 ({e})")
    print("all checks passed")


if __name__ == "__main__":
    main()
