"""Reference computations with Python MLX and mlx-lm for Tandem's conversion tests (tests/convert.rs).

  quantize SRC_DIR OUT.safetensors DTYPE GROUP BITS KEY...
      For each tensor KEY of the checkpoint in SRC_DIR: cast to DTYPE (bfloat16/float16), then
      mx.quantize(group_size=GROUP, bits=BITS); writes KEY.q, KEY.scales, KEY.biases.
  tame DIR SCALE
      Multiplies every layer's output projection (o_proj, out_proj, down_proj) of the raw checkpoint in
      DIR by SCALE, in place: each layer then only nudges the residual stream, so the random network
      no longer amplifies rounding differences between two engines into different greedy tokens.
  mlx-convert SRC DST [BITS GROUP [RECIPE]]
      mlx-lm's own conversion pipeline (load_model, cast to bfloat16 except A_log, quantize_model,
      save_model) without the tokenizer step, as a reference for Tandem's output tensors.
  greedy DIR OUT.json N IDS...
      mlx-lm's greedy continuation (generate_step) with each step's log-probabilities:
      {"tokens": [...], "logprobs": [[vocab floats], ...]}.
  modules DIR OUT.json
      Loads DIR with mlx-lm and writes {module path: [bits, group_size] or null} for every Linear /
      Embedding, i.e. how mlx-lm itself decided to build each layer from the files and config.
"""
import glob
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn


def load_weights(src):
    weights = {}
    for f in sorted(glob.glob(str(Path(src) / "*.safetensors"))):
        weights.update(mx.load(f))
    return weights


def quantize(src, out, dtype, group, bits, keys):
    weights = load_weights(src)
    res = {}
    for k in keys:
        w = weights[k].astype(getattr(mx, dtype))
        q, s, b = mx.quantize(w, group_size=group, bits=bits)
        res[f"{k}.q"], res[f"{k}.scales"], res[f"{k}.biases"] = q, s, b
    mx.save_safetensors(out, res)


def tame(path, scale):
    f = str(Path(path) / "model.safetensors")
    w = mx.load(f)
    for k in list(w):
        if k.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            w[k] = w[k] * scale
    mx.save_safetensors(f, w)


def mlx_convert(src, dst, bits=None, group=None, recipe=None):
    from mlx.utils import tree_map_with_path
    from mlx_lm.convert import mixed_quant_predicate_builder
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model
    model, config = load_model(Path(src), lazy=True)
    cast = getattr(model, "cast_predicate", lambda _: True)
    model.update(tree_map_with_path(
        lambda k, v: v.astype(mx.bfloat16) if cast(k) and mx.issubdtype(v.dtype, mx.floating) else v,
        model.parameters()))
    if bits is not None:
        pred = mixed_quant_predicate_builder(recipe, model, group) if recipe else None
        model, config = quantize_model(model, config, group, bits, quant_predicate=pred)
    save_model(Path(dst), model)
    save_config(config, Path(dst) / "config.json")


def greedy(path, out, n, ids):
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(path))
    toks, lps = [], []
    for tok, logprobs in generate_step(mx.array(ids), model, max_tokens=n):
        toks.append(int(tok))
        lps.append(logprobs.astype(mx.float32).tolist())
    Path(out).write_text(json.dumps({"tokens": toks, "logprobs": lps}))


def modules(path, out):
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(path))
    found = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            found[name] = [m.bits, m.group_size]
        elif isinstance(m, (nn.Linear, nn.Embedding)):
            found[name] = None
    Path(out).write_text(json.dumps(found, indent=1, sort_keys=True))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "quantize":
        quantize(args[0], args[1], args[2], int(args[3]), int(args[4]), args[5:])
    elif cmd == "tame":
        tame(args[0], float(args[1]))
    elif cmd == "mlx-convert":
        mlx_convert(args[0], args[1], *(int(a) for a in args[2:4]), *args[4:5])
    elif cmd == "greedy":
        greedy(args[0], args[1], int(args[2]), [int(x) for x in args[3:]])
    elif cmd == "modules":
        modules(args[0], args[1])
    else:
        sys.exit(f"unknown command {cmd}")
