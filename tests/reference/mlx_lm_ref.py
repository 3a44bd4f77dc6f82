"""Reference computations with mlx-lm (run from the test venv) for Tandem's Rust tests.

  make-hf DIR [--seed S] [--tied] [--no-mtp] [--layers N]
      Writes a random tiny qwen3_5 checkpoint in raw Hugging Face layout (f32, zero-centred norms,
      conv1d [C,1,K], an MTP head named as in real checkpoints) with config.json.
  logits DIR OUT.safetensors [--bf16] IDS...
      Loads DIR with mlx-lm (its own sanitize: key renames, +1 norms, conv layout) and writes the
      float32 logits of the token ids.
  generate DIR OUT.json N IDS...
      Greedy continuation of N tokens with mlx-lm's generate_step.
  family DIR FIXTURE.safetensors OUT.safetensors
      mlx-lm in bf16 (`set_dtype(bfloat16)`) on a family fixture's prompt (tests/it/family.rs): the float32
      logits of its bf16 forward at the fixture's `logit_rows`, and its greedy continuation of as many tokens
      as the fixture's `greedy_ids` (generate_step).
"""
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np


def text_config(layers, tied, mtp):
    return {
        "model_type": "qwen3_5_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "vocab_size": 256,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "full_attention_interval": 4,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [1, 1, 0], "mrope_interleaved": True},
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attn_output_gate": True,
        "tie_word_embeddings": tied,
        "mtp_num_hidden_layers": 1 if mtp else 0,
        "mtp_use_dedicated_embeddings": False,
        "max_position_embeddings": 4096,
    }


def make_hf(out, seed, tied, mtp, layers):
    rng = np.random.default_rng(seed)
    tc = text_config(layers, tied, mtp)
    D, I, V = tc["hidden_size"], tc["intermediate_size"], tc["vocab_size"]
    Hk, Hv, Dk, Dv, K = 2, 4, 16, 16, 4
    Hq, Hkv, hd = 4, 2, 16
    conv_dim = 2 * Hk * Dk + Hv * Dv
    w = {}

    def lin(name, o, i, std=None):
        w[name] = (rng.standard_normal((o, i)) * (std or 1.0 / np.sqrt(i))).astype(np.float32)

    def norm(name, n):
        w[name] = (rng.standard_normal(n) * 0.1).astype(np.float32)  # zero-centred

    def attn(p):
        lin(f"{p}.self_attn.q_proj.weight", 2 * Hq * hd, D)
        lin(f"{p}.self_attn.k_proj.weight", Hkv * hd, D)
        lin(f"{p}.self_attn.v_proj.weight", Hkv * hd, D)
        lin(f"{p}.self_attn.o_proj.weight", D, Hq * hd)
        norm(f"{p}.self_attn.q_norm.weight", hd)
        norm(f"{p}.self_attn.k_norm.weight", hd)

    def block(p, full):
        norm(f"{p}.input_layernorm.weight", D)
        norm(f"{p}.post_attention_layernorm.weight", D)
        if full:
            attn(p)
        else:
            a = f"{p}.linear_attn"
            lin(f"{a}.in_proj_qkv.weight", conv_dim, D)
            lin(f"{a}.in_proj_z.weight", Hv * Dv, D)
            lin(f"{a}.in_proj_b.weight", Hv, D)
            lin(f"{a}.in_proj_a.weight", Hv, D)
            w[f"{a}.conv1d.weight"] = (rng.standard_normal((conv_dim, 1, K)) * 0.5).astype(np.float32)
            w[f"{a}.dt_bias"] = rng.uniform(0.5, 1.5, Hv).astype(np.float32)
            w[f"{a}.A_log"] = np.log(rng.uniform(1, 16, Hv)).astype(np.float32)
            w[f"{a}.norm.weight"] = (1.0 + rng.standard_normal(Dv) * 0.1).astype(np.float32)
            lin(f"{a}.out_proj.weight", D, Hv * Dv)
        lin(f"{p}.mlp.gate_proj.weight", I, D)
        lin(f"{p}.mlp.up_proj.weight", I, D)
        lin(f"{p}.mlp.down_proj.weight", D, I)

    w["model.language_model.embed_tokens.weight"] = rng.standard_normal((V, D)).astype(np.float32)
    for i, t in enumerate(tc["layer_types"]):
        block(f"model.language_model.layers.{i}", t == "full_attention")
    norm("model.language_model.norm.weight", D)
    if not tied:
        lin("lm_head.weight", V, D)
    if mtp:
        lin("mtp.fc.weight", D, 2 * D)
        norm("mtp.pre_fc_norm_embedding.weight", D)
        norm("mtp.pre_fc_norm_hidden.weight", D)
        norm("mtp.norm.weight", D)
        block("mtp.layers.0", True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), {k: mx.array(v) for k, v in w.items()})
    config = {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "tie_word_embeddings": tied,
        "text_config": tc,
        "eos_token_id": 1,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))


def load(path):
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(path))
    return model


def logits(path, out, ids, dtype=None):
    model = load(path)
    if dtype == "bf16":
        model.set_dtype(mx.bfloat16)
    y = model(mx.array([ids]))
    mx.save_safetensors(out, {"logits": y.astype(mx.float32)})


def generate(path, out, n, ids):
    from mlx_lm.generate import generate_step
    model = load(path)
    toks = []
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=n):
        toks.append(int(tok))
    Path(out).write_text(json.dumps(toks))


def family(path, fixture, out):
    from mlx_lm.generate import generate_step
    fx = mx.load(fixture)
    ids = fx["input_ids"].astype(mx.int32)
    model = load(path)
    model.set_dtype(mx.bfloat16)
    y = model(ids[None])[0]
    rows = y[fx["logit_rows"].astype(mx.int32)].astype(mx.float32)
    toks = []
    for tok, _ in generate_step(ids, model, max_tokens=fx["greedy_ids"].size):
        toks.append(int(tok))
    mx.save_safetensors(out, {"logits": rows, "greedy_ids": mx.array(toks, dtype=mx.int32)})


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make-hf":
        seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
        layers = int(args[args.index("--layers") + 1]) if "--layers" in args else 8
        make_hf(args[0], seed, "--tied" in args, "--no-mtp" not in args, layers)
    elif cmd == "logits":
        dtype = None
        if args[2] == "--bf16":
            dtype, args = "bf16", args[:2] + args[3:]
        logits(args[0], args[1], [int(x) for x in args[2:]], dtype)
    elif cmd == "generate":
        generate(args[0], args[1], int(args[2]), [int(x) for x in args[3:]])
    elif cmd == "family":
        family(args[0], args[1], args[2])
    else:
        sys.exit(f"unknown command {cmd}")
