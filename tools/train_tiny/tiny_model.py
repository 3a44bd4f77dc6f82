"""tandem-tiny: a tiny qwen3_5 text model built from transformers' own Qwen3.5 classes, plus an MTP head.

The trunk is `transformers.Qwen3_5ForCausalLM` (keys `model.*`, `lm_head.weight`); on save the keys are renamed to
the raw Hugging Face layout of a Qwen3.5 checkpoint (`model.language_model.*`, `lm_head.weight`, `mtp.*`).

The MTP head (`MTPHead`) follows docs/MODEL.md §4.1 and holds exactly the 15 tensors of a real checkpoint's `mtp.*`:
    e  = pre_fc_norm_embedding(embed_tokens(x_{t+1}))        # shared embedding
    hh = pre_fc_norm_hidden(h_t)                             # h_t = trunk hidden AFTER the final model.norm
    u  = fc(concat([e, hh], -1))                             # embedding first
    u  = layers[0](u, position t)                            # the model's own full-attention decoder layer class
    hm = norm(u)
    logits = lm_head(hm)                                     # shared lm_head
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5DecoderLayer,
    Qwen3_5ForCausalLM,
    Qwen3_5RMSNorm,
)

# Token ids fixed by train_tokenizer.SPECIALS
ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD, THINK, END_THINK = range(9)


def text_config_dict(vocab_size: int = 4096) -> dict:
    """The qwen3_5_text config of tandem-tiny (what goes under `text_config` in config.json)."""
    n_layers, interval = 8, 4
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 384,
        "num_hidden_layers": n_layers,
        "layer_types": [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
        ],
        "full_attention_interval": interval,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "mamba_ssm_dtype": "float32",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": ENDOFTEXT,
        "pad_token_id": None,
        "dtype": "bfloat16",
    }


def full_config_dict(text_cfg: dict) -> dict:
    """Top-level config.json (qwen3_5, text only: no vision_config)."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_cfg,
        "tie_word_embeddings": text_cfg["tie_word_embeddings"],
        "image_token_id": IMAGE_PAD,
        "video_token_id": VIDEO_PAD,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
        "transformers_version": "5.23.0",
    }


def make_text_config(d: dict) -> Qwen3_5TextConfig:
    d = {k: v for k, v in d.items() if k != "model_type"}
    return Qwen3_5TextConfig(**d)


class MTPHead(nn.Module):
    """Qwen3.5 MTP head (one layer). Parameter names == the checkpoint's `mtp.*` names without the prefix."""

    def __init__(self, config: Qwen3_5TextConfig):
        super().__init__()
        d = config.hidden_size
        full_idx = config.layer_types.index("full_attention")
        self.full_idx = full_idx
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(d, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(d, eps=config.rms_norm_eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        # The same block class as the trunk's full-attention layers (gated attention, zero-centred norms, partial RoPE).
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, full_idx)])
        self.norm = Qwen3_5RMSNorm(d, eps=config.rms_norm_eps)
        std = config.initializer_range
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
        for name, p in self.named_parameters():
            if "norm" in name:
                nn.init.zeros_(p)

    def forward(self, hidden: torch.Tensor, next_ids: torch.Tensor, embed: nn.Embedding, rotary, lm_head: nn.Linear,
                position_ids: torch.Tensor | None = None, return_all: bool = False):
        """hidden: [B, T, D] post-final-norm trunk hidden h_t; next_ids: [B, T] tokens x_{t+1}.
        Returns logits [B, T, V] predicting x_{t+2} (causal over T, positions 0..T-1 unless given)."""
        b, t, _ = hidden.shape
        e = self.pre_fc_norm_embedding(embed(next_ids))
        hh = self.pre_fc_norm_hidden(hidden)
        u = self.fc(torch.cat([e, hh], dim=-1))
        if position_ids is None:
            position_ids = torch.arange(t, device=hidden.device)[None].expand(b, t)
        pos_emb = rotary(u, position_ids)
        x = self.layers[0](u, position_embeddings=pos_emb, attention_mask=None, position_ids=position_ids)
        hm = self.norm(x)
        logits = lm_head(hm)
        if return_all:
            return logits, {"e": e, "hh": hh, "fc": u, "layer": x, "hm": hm}
        return logits

    def chained(self, hidden: torch.Tensor, ids: torch.Tensor, steps: int, embed: nn.Embedding, rotary, lm_head: nn.Linear):
        """Chained drafting (docs/MODEL.md §4.2), teacher-forced, for every frontier t at once.

        hidden: [B, T, D] trunk hidden h_0..h_{T-1} (post final norm); ids: [B, T + steps] tokens x_0..x_{T+steps-1}.
        Returns `steps` logits [B, T, V]; entry s-1, row t is draft s of a decoder whose frontier pair is
        (h_t, x_{t+1}), and predicts x_{t+s+1}:
          step 1: input (h_t, x_{t+1}) at RoPE position t                  -> hm_1[t]
          step s: input (hm_{s-1}[t], x_{t+s}) at RoPE position t+s-1     -> hm_s[t]
        (x_{t+s} is the true token: when drafts 1..s-1 were accepted it is exactly the drafted token.)
        Attention sees what the decoder's MTP KV cache holds at that moment: the step-1 entries of the committed
        pairs (h_j, x_{j+1}) for j <= t (positions 0..t), then the chained entries of steps 2..s of frontier t
        (positions t+1..t+s-1), the query's own entry last. Computed exactly by running the layer over the
        concatenation [u_1 | u_2 | ... | u_s] (s*T rows) with the mask of `chain_mask`.
        """
        b, t, _ = hidden.shape
        dev = hidden.device
        ar = torch.arange(t, device=dev)
        us, outs, prev = [], [], hidden
        for s in range(1, steps + 1):
            e = self.pre_fc_norm_embedding(embed(ids[:, s : t + s]))
            hh = self.pre_fc_norm_hidden(prev)
            us.append(self.fc(torch.cat([e, hh], dim=-1)))
            u = torch.cat(us, 1)
            pos = torch.cat([ar + k for k in range(s)])[None].expand(b, s * t)
            mask = None if s == 1 else chain_mask(t, s, dev)[None, None]
            x = self.layers[0](u, position_embeddings=rotary(u, pos), attention_mask=mask, position_ids=pos)
            prev = self.norm(x[:, (s - 1) * t :])
            outs.append(lm_head(prev))
        return outs


def chain_mask(t: int, s: int, device=None) -> torch.Tensor:
    """[s*t, s*t] bool (True = may attend) over blocks [step 1 | ... | step s] of t rows each.
    Row (a, i) sees step-1 rows j <= i (the committed pairs) and rows (b, i) for 1 <= b <= a (its own chain)."""
    i = torch.arange(t, device=device)
    blk = torch.arange(s, device=device)
    a_, i_ = blk[:, None, None, None], i[None, :, None, None]
    b_, j_ = blk[None, None, :, None], i[None, None, None, :]
    m = ((b_ == 0) & (j_ <= i_)) | ((b_ >= 1) & (b_ <= a_) & (j_ == i_))
    return m.reshape(s * t, s * t)


class TinyWithMTP(nn.Module):
    def __init__(self, text_cfg: dict, attn_impl: str = "sdpa"):
        super().__init__()
        cfg = make_text_config(text_cfg)
        cfg._attn_implementation = attn_impl
        self.lm = Qwen3_5ForCausalLM(cfg)
        self.mtp = MTPHead(self.lm.config)
        self.config = self.lm.config

    def trunk(self, ids: torch.Tensor) -> torch.Tensor:
        """Post-final-norm hidden states [B, T, D]."""
        return self.lm.model(input_ids=ids, use_cache=False).last_hidden_state

    def head(self, hidden, next_ids, **kw):
        m = self.lm.model
        return self.mtp(hidden, next_ids, m.embed_tokens, m.rotary_emb, self.lm.lm_head, **kw)

    def head_chained(self, hidden, ids, steps: int):
        m = self.lm.model
        return self.mtp.chained(hidden, ids, steps, m.embed_tokens, m.rotary_emb, self.lm.lm_head)

    def losses(self, x: torch.Tensor):
        """x: [B, L+1] tokens. Returns (main CE over L targets, MTP CE over L-1 targets, main logits)."""
        inp = x[:, :-1]
        h = self.trunk(inp)  # h_0..h_{L-1}
        logits = self.lm.lm_head(h)
        main = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        # MTP pairs (h_t, x_{t+1}) -> x_{t+2}, t = 0..L-2 (h NOT detached: joint training)
        ml = self.head(h[:, :-1], x[:, 1:-1])
        mtp = F.cross_entropy(ml.float().reshape(-1, ml.shape[-1]), x[:, 2:].reshape(-1))
        return main, mtp

    # ---- checkpoint in raw HF Qwen3.5 layout ----
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        for k, v in self.lm.state_dict().items():
            if k.startswith("model."):
                out["model.language_model." + k[len("model."):]] = v
            elif k == "lm_head.weight":
                out[k] = v
            else:
                raise KeyError(k)
        for k, v in self.mtp.state_dict().items():
            out["mtp." + k] = v
        return out

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        lm, mtp = {}, {}
        for k, v in sd.items():
            if k.startswith("model.language_model."):
                lm["model." + k[len("model.language_model."):]] = v
            elif k == "lm_head.weight":
                lm[k] = v
            elif k.startswith("mtp."):
                mtp[k[4:]] = v
            else:
                raise KeyError(k)
        self.lm.load_state_dict({k: v.float() for k, v in lm.items()}, strict=True)
        self.mtp.load_state_dict({k: v.float() for k, v in mtp.items()}, strict=True)


def to_checkpoint_dtypes(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bf16 everywhere except A_log (float32), as in a real checkpoint. conv1d stays [C, 1, K]."""
    out = {}
    for k, v in sd.items():
        v = v.detach().to("cpu")
        out[k] = v.float().contiguous() if k.endswith(".A_log") else v.to(torch.bfloat16).contiguous()
    return out
