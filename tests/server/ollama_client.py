"""The official `ollama` Python client against a running `tandem serve` (started by tests/it/server_api.rs,
test `ollama_python_client`): Tandem's Ollama-compatible routes.

    python tests/server/ollama_client.py --host http://127.0.0.1:PORT --model NAME --model-dir DIR

Checks, with Hugging Face `transformers` as the oracle for token counts: /api/tags lists the model (also
under its `:latest` name); /api/chat and /api/generate streamed (NDJSON) and not give the same greedy
text, Ollama's counts (prompt_eval_count from transformers, eval_count = num_predict at `length`), and
Tandem's MTP `stats` on the final object; raw generate skips the template; /api/show and /api/ps; errors
as the client's ResponseError (404 unknown model, 400 naming an unsupported option or field).
Prints one line per check; exits non-zero on the first failure.
"""

import argparse
import json
import urllib.request

import jsonschema

import ollama
from transformers import AutoTokenizer

from checks import check, template_tokens


def raw_post(host, path, body):
    req = urllib.request.Request(host + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-dir", required=True)
    args = ap.parse_args()
    client = ollama.Client(host=args.host, timeout=120)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    m = args.model

    names = [x.model for x in client.list().models]
    check(m in names, f"/api/tags lists {m} ({names})")

    messages = [{"role": "user", "content": "Tell me a short story about a cat."}]
    expected = template_tokens(tok, messages)
    opts = {"temperature": 0, "num_predict": 12, "seed": 1}
    r = client.chat(model=m + ":latest", messages=messages, options=opts, stream=False)
    text = r.message.content
    check(r.done and r.message.role == "assistant" and len(text) > 0, f"chat answers ({text!r})")
    check(r.prompt_eval_count == expected, f"prompt_eval_count {r.prompt_eval_count} == transformers' {expected}")
    check(r.eval_count <= 12, f"eval_count {r.eval_count} <= num_predict")
    check(r.done_reason in ("stop", "length") and (r.done_reason != "length" or r.eval_count == 12), f"done_reason {r.done_reason}")
    parts = list(client.chat(model=m, messages=messages, options=opts, stream=True))
    check(len(parts) >= 2 and parts[-1].done and not any(p.done for p in parts[:-1]), f"a stream of {len(parts)} objects, done last")
    streamed = "".join(p.message.content for p in parts)
    check(streamed == text, f"streamed chat equals non-streamed ({streamed!r} vs {text!r})")
    lines = raw_post(args.host, "/api/chat", {"model": m, "messages": messages, "options": opts})
    check(isinstance(lines[-1].get("stats"), dict) and "spec" in lines[-1]["stats"], "Tandem's stats on the final line")

    prompt = "Once upon a time"
    g = client.generate(model=m, prompt=prompt, raw=True, options=opts, stream=False)
    check(g.done and len(g.response) > 0, f"raw generate answers ({g.response!r})")
    check(g.prompt_eval_count == len(tok(prompt)["input_ids"]), f"raw prompt: {g.prompt_eval_count} tokens, no template")
    gs = "".join(p.response for p in client.generate(model=m, prompt=prompt, raw=True, options=opts, stream=True))
    check(gs == g.response, "streamed generate equals non-streamed")
    t = client.generate(model=m, prompt="Tell me a short story about a cat.", options=opts, stream=False)
    check(t.prompt_eval_count == expected, f"templated generate counts the chat template ({t.prompt_eval_count})")

    # `format`: a JSON schema constrains the answer.
    schema = {
        "type": "object",
        "properties": {"animal": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
        "required": ["animal", "legs"],
        "additionalProperties": False,
    }
    f = client.chat(model=m, messages=messages, format=schema, options={"temperature": 0, "num_predict": 60}, stream=False)
    try:
        jsonschema.validate(json.loads(f.message.content), schema)
        valid = True
    except (ValueError, jsonschema.ValidationError) as e:
        valid = e
    check(valid is True and f.done_reason == "stop", f"format schema answer validates ({f.message.content!r}: {valid})")
    j = client.generate(model=m, prompt="A cat:", format="json", options={"temperature": 0, "num_predict": 60}, stream=False)
    check(j.done_reason != "stop" or json.loads(j.response) is not None, f"format json answer ({j.response!r})")
    fp = client.chat(model=m, messages=messages, options={**opts, "frequency_penalty": 2.0, "presence_penalty": 1.0}, stream=False)
    check(fp.done and len(fp.message.content) > 0, "frequency and presence penalties accepted")

    # Tools: offered in the prompt (more prompt tokens), an earlier call and its result read back.
    tide = {"type": "function", "function": {"name": "get_tide", "description": "Tide times.", "parameters": {"type": "object", "properties": {"port": {"type": "string"}}, "required": ["port"]}}}
    plain = client.chat(model=m, messages=messages, options=opts, stream=False)
    offered = client.chat(model=m, messages=messages, tools=[tide], options=opts, stream=False)
    check(offered.prompt_eval_count > plain.prompt_eval_count, f"tools are in the prompt ({offered.prompt_eval_count} > {plain.prompt_eval_count})")
    back = messages + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_tide", "arguments": {"port": "Nantucket"}}}]},
        {"role": "tool", "content": "High tide at 14:05."},
    ]
    r = client.chat(model=m, messages=back, tools=[tide], options=opts, stream=False)
    check(r.done and r.prompt_eval_count > offered.prompt_eval_count, "a call and its result are read back")
    streamed = list(client.chat(model=m, messages=back, tools=[tide], options=opts, stream=True))
    check(streamed[-1].done and "<tool_call>" not in "".join(p.message.content for p in streamed), "streamed with tools")

    s = client.show(m)
    check("completion" in (s.capabilities or []), f"/api/show capabilities {s.capabilities}")
    ps = [x.model for x in client.ps().models]
    check(m in ps, f"/api/ps lists the loaded model ({ps})")

    for what, call in [
        ("unknown model", lambda: client.chat(model="no-such-model", messages=messages, stream=False)),
        ("options.mirostat", lambda: client.chat(model=m, messages=messages, options={"mirostat": 1}, stream=False)),
        ("tools[0]", lambda: client.chat(model=m, messages=messages, tools=[{"type": "function", "function": {"description": "no name"}}], stream=False)),
    ]:
        try:
            call()
            check(False, f"{what} raises")
        except ollama.ResponseError as e:
            want = 404 if what == "unknown model" else 400
            named = what == "unknown model" or f"`{what}`" in str(e.error)
            check(e.status_code == want and named, f"{what}: {e.status_code} {e.error!r}")
    print("all checks passed")


if __name__ == "__main__":
    main()
