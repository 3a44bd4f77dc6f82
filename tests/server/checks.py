"""What the client scripts beside this file share: one line per check, and the oracle's token counts."""

import sys


def check(cond, what):
    """Prints `ok: what`, or `FAIL: what` and exits non-zero."""
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def template_tokens(tok, messages):
    """Tokens of the chat template over `messages` with the assistant header, as transformers renders it."""
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(enc["input_ids"] if hasattr(enc, "keys") else enc)
