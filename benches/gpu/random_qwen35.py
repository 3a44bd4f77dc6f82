"""A Qwen3.5-shaped checkpoint with random weights, for timing only (its text is noise and its MTP drafts are
almost never accepted, so it measures what drafting and verifying cost, not what they earn).

Usage: python3 benches/gpu/random_qwen35.py OUT_DIR [--preset 2b|27b-slice|27b] [--hidden N --layers N ...]
Presets: `2b` (the default: hidden 2048, 24 layers); `27b-slice`, the Qwen3.5-27B shape (hidden 5120,
intermediate 17408, Hq 24, Hkv 4, head_dim 256, Hk 16, Hv 48, Dk = Dv = 128, partial rotary 0.25) with 16 of
its 64 layers (6.5B parameters, ~13 GB in bf16); `27b`, all 64 layers (~52 GB: for machines with the room).
Built with tools/train_tiny/tiny_model.py (transformers' Qwen3.5 classes plus our MTP head) and saved in the
raw Hugging Face layout, bf16, with tandem-tiny's tokenizer (vocabulary 4096), so Tandem and mlx-lm load it.
Needs torch and transformers (the GPU machine has both); runs on CUDA when available.
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools/train_tiny"))
from tiny_model import TinyWithMTP, full_config_dict, text_config_dict, to_checkpoint_dtypes  # noqa: E402

p = argparse.ArgumentParser()
PRESETS = {
    "2b": dict(hidden=2048, layers=24, intermediate=6144, heads=8, kv_heads=2, linear_k_heads=16, linear_v_heads=16),
    "27b-slice": dict(hidden=5120, layers=16, intermediate=17408, heads=24, kv_heads=4, linear_k_heads=16,
                      linear_v_heads=48),
    "27b": dict(hidden=5120, layers=64, intermediate=17408, heads=24, kv_heads=4, linear_k_heads=16,
                linear_v_heads=48),
}
p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--preset", choices=sorted(PRESETS), default="2b")
for name in ["hidden", "layers", "intermediate", "heads", "kv_heads", "linear_k_heads", "linear_v_heads"]:
    p.add_argument("--" + name.replace("_", "-"), dest=name, type=int)
a = p.parse_args()
for name, value in PRESETS[a.preset].items():
    if getattr(a, name) is None:
        setattr(a, name, value)

cfg = text_config_dict()
cfg.update(
    hidden_size=a.hidden,
    intermediate_size=a.intermediate,
    num_hidden_layers=a.layers,
    layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(a.layers)],
    num_attention_heads=a.heads,
    num_key_value_heads=a.kv_heads,
    head_dim=256,
    linear_num_key_heads=a.linear_k_heads,
    linear_num_value_heads=a.linear_v_heads,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    # Qwen3.5's own context, so long-prefix benchmarks (a 32k-token prefix cache restore) fit.
    max_position_embeddings=262144,
)
cfg["rope_parameters"] = dict(cfg["rope_parameters"], mrope_section=[11, 11, 10])
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(device):
    model = TinyWithMTP(cfg).to(torch.bfloat16)
sd = to_checkpoint_dtypes(model.hf_state_dict())
out = Path(a.out)
out.mkdir(parents=True, exist_ok=True)
save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
(out / "config.json").write_text(json.dumps(full_config_dict(cfg), indent=2))
for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
    shutil.copy(ROOT / "assets/models/tandem-tiny" / name, out / name)
n = sum(v.numel() for v in sd.values())
print(f"wrote {out}: {n / 1e6:.0f}M parameters")
