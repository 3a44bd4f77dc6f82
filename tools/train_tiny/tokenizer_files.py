"""tokenizer_config.json (with a ChatML chat template) and generation_config.json for tandem-tiny (and tiny-vlm).

The template is plain Jinja2 that Rust minijinja also renders: messages with role + content, where content is a
string or a list of {"type": "text", "text": ...} / {"type": "image"} / {"type": "image_url", ...} items; an image
becomes <|vision_start|><|image_pad|><|vision_end|> (the processor expands <|image_pad|> to one token per merged patch).
"""
import json
import os
import shutil

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for item in message['content'] %}"
    "{%- if item['type'] == 'text' %}"
    "{{- item['text'] }}"
    "{%- elif item['type'] == 'image' or item['type'] == 'image_url' %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def tokenizer_config(tokenizer_json_path: str) -> dict:
    with open(tokenizer_json_path, encoding="utf-8") as fh:
        tj = json.load(fh)
    added = {
        str(t["id"]): {
            "content": t["content"], "lstrip": t["lstrip"], "normalized": t["normalized"],
            "rstrip": t["rstrip"], "single_word": t["single_word"], "special": t["special"],
        }
        for t in tj["added_tokens"]
    }
    return {
        "tokenizer_class": "Qwen3_5Tokenizer",
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 4096,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def generation_config(eos_ids=(0, 2), pad_id=0) -> dict:
    return {
        "eos_token_id": list(eos_ids),
        "pad_token_id": pad_id,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 0,
        "transformers_version": "5.23.0",
    }


def write_tokenizer_files(tokenizer_json_path: str, out_dir: str, with_generation_config: bool = True) -> None:
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, "tokenizer.json")
    if os.path.abspath(tokenizer_json_path) != os.path.abspath(dst):
        shutil.copyfile(tokenizer_json_path, dst)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(tokenizer_config(tokenizer_json_path), fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    if with_generation_config:
        with open(os.path.join(out_dir, "generation_config.json"), "w") as fh:
            json.dump(generation_config(), fh, indent=2)
            fh.write("\n")
