"""The official `anthropic` Python client against a running `tandem serve` (started by tests/it/server_api.rs,
test `anthropic_python_client`): Tandem's `POST /v1/messages`.

    python tests/server/anthropic_client.py --base-url http://127.0.0.1:PORT --model NAME --model-dir DIR

Checks, with Hugging Face `transformers` as the oracle for token counts: a message answers with a text
block, `usage.input_tokens` equals transformers' count of the chat template (system prompt included),
`stop_reason` is `max_tokens` at the limit; streamed events in Anthropic's order give the same text and
usage; a stop sequence is reported as `stop_sequence`; Tandem's `stats` ride on the message; errors are
the client's typed exceptions (404 unknown model, 400 naming an unsupported field), and tool use: a forced call validating against its schema,
streamed as input_json_delta, its result read back).
Sampling is the registry's (greedy in the test's models.toml): this client version takes no `temperature`.
Prints one line per check; exits non-zero on the first failure.
"""

import argparse

import anthropic
import jsonschema
from transformers import AutoTokenizer

from checks import check, template_tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-dir", required=True)
    args = ap.parse_args()
    client = anthropic.Anthropic(base_url=args.base_url, api_key="not-needed", max_retries=0, timeout=120)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    m = args.model
    system = "You are a helpful assistant."
    messages = [{"role": "user", "content": [{"type": "text", "text": "Tell me a short story about a cat."}]}]
    flat = [{"role": "system", "content": system}, {"role": "user", "content": "Tell me a short story about a cat."}]
    expected = template_tokens(tok, flat)

    r = client.messages.create(model=m, max_tokens=10, system=system, messages=messages)
    text = r.content[0].text
    check(r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), "a message object")
    check(r.content[0].type == "text" and len(text) > 0, f"a text block ({text!r})")
    check(r.usage.input_tokens == expected, f"input_tokens {r.usage.input_tokens} == transformers' {expected}")
    check(r.stop_reason in ("max_tokens", "end_turn"), f"stop_reason {r.stop_reason}")
    check(r.stop_reason != "max_tokens" or r.usage.output_tokens == 10, f"output_tokens {r.usage.output_tokens} at the limit")
    check(isinstance((r.model_extra or {}).get("stats"), dict), "Tandem's stats on the message")

    kinds = []
    with client.messages.stream(model=m, max_tokens=10, system=system, messages=messages) as s:
        for ev in s:
            kinds.append(ev.type)
        final = s.get_final_message()
    check(kinds[0] == "message_start" and "content_block_start" in kinds and kinds[-1] == "message_stop", f"event order ({kinds[:3]}...{kinds[-2:]})")
    check(final.content[0].text == text, f"streamed text equals non-streamed ({final.content[0].text!r})")
    check(final.usage.output_tokens == r.usage.output_tokens and final.stop_reason == r.stop_reason, "streamed usage and stop_reason")

    words = text.split()
    if len(words) >= 2:
        stop = words[1]
        rs = client.messages.create(model=m, max_tokens=10, system=system, messages=messages, stop_sequences=[stop])
        check(rs.stop_reason == "stop_sequence" and rs.stop_sequence == stop, f"stop_sequence {stop!r} ({rs.stop_reason}, {rs.stop_sequence!r})")

    try:
        client.messages.create(model="no-such-model", max_tokens=4, messages=messages)
        check(False, "unknown model raises")
    except anthropic.NotFoundError as e:
        check(e.status_code == 404, "unknown model: 404 NotFoundError")
    try:
        client.messages.create(model=m, max_tokens=4, messages=messages, tools=[{"name": "f", "input_schema": {"type": "object"}, "strict_mode": 1}])
        check(False, "an unknown tool field raises")
    except anthropic.BadRequestError as e:
        check("`tools[0].strict_mode`" in str(e), f"unknown tool field: 400 naming it ({e})")

    # Tool use: a forced call (tool_choice any / tool) arrives as a tool_use block whose input
    # validates against the tool's input_schema; streamed as input_json_delta; the result goes back.
    schema = {"type": "object", "properties": {"port": {"type": "string", "maxLength": 20}}, "required": ["port"], "additionalProperties": False}
    tide = {"name": "get_tide", "description": "Tide times.", "input_schema": schema}
    ask = [{"role": "user", "content": "When is high tide in Nantucket?"}]
    r = client.messages.create(model=m, max_tokens=80, messages=ask, tools=[tide], tool_choice={"type": "any"})
    uses = [b for b in r.content if b.type == "tool_use"]
    try:
        jsonschema.validate(uses[0].input, schema)
        valid = True
    except (IndexError, jsonschema.ValidationError) as e:
        valid = e
    check(r.stop_reason == "tool_use" and valid is True and uses[0].name == "get_tide" and uses[0].id, f"forced tool_use validates ({r.content}: {valid})")
    stats = (r.model_extra or {}).get("stats") or {}
    check((stats.get("spec") or {}).get("method") == "mtp", "MTP statistics on the tool call")
    with client.messages.stream(model=m, max_tokens=80, messages=ask, tools=[tide], tool_choice={"type": "tool", "name": "get_tide"}) as s:
        final = s.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    check(final.stop_reason == "tool_use" and streamed and streamed[0].input == uses[0].input, f"streamed tool_use assembles the same input ({final.content})")
    back = ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_tide", "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "High tide at 14:05."}]},
    ]
    r = client.messages.create(model=m, max_tokens=8, messages=back, tools=[tide])
    check(r.usage.input_tokens > 0 and r.content, "a tool_result is read back")
    print("all checks passed")


if __name__ == "__main__":
    main()
