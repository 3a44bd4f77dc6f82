"""Train tandem-tiny (qwen3_5 text, ~7.3M params) and its MTP head; export a raw HF checkpoint.

Phases (each bounded in wall-clock time so the whole run fits one 10-minute device call):
  1. joint training: next-token CE + 0.3 * MTP CE (token after next). The MTP head reads the trunk's
     post-final-norm hidden state WITHOUT detach, so its loss also reaches the trunk, embedding and lm_head.
     The best state by held-out loss (checked every --eval-every s) is kept.
  2. self-distillation of the head: the trunk, embedding and lm_head are frozen; the head is fine-tuned on the
     trunk's own greedy continuations of training-text and chat prompts, with the trunk's next-position
     distribution as soft target (so argmax agreement == greedy draft acceptance).
  3. weights rounded to bf16 (A_log kept f32), then every reported figure is measured on those weights in f32.

usage: python train.py --text .cache/text --tok .cache/tok --out OUT_DIR [--train-seconds 270] [--max-epochs 30] [--head-seconds 60]
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import re
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_model import (  # noqa: E402
    ENDOFTEXT,
    IM_END,
    TinyWithMTP,
    full_config_dict,
    text_config_dict,
    to_checkpoint_dtypes,
)
from tokenizer_files import write_tokenizer_files  # noqa: E402

T0 = time.time()
SYSTEMS = [
    "You are a helpful assistant.",
    "You are Tandem, a small language model that runs on this computer.",
    "Answer in the style of a State of the Union address.",
]


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------------------------- data
def sentences(doc: str) -> list[str]:
    out = []
    for para in doc.split("\n"):
        para = para.strip()
        if para:
            out += [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"“])", para) if s.strip()]
    return out


def chat_text(rng: random.Random, sents: list[str]) -> str | None:
    if len(sents) < 8:
        return None
    i = rng.randrange(0, len(sents) - 6)
    nu, na = rng.randint(1, 2), rng.randint(1, 4)
    user, asst = " ".join(sents[i : i + nu]), " ".join(sents[i + nu : i + nu + na])
    if len(user) > 600 or len(asst) > 1500:
        return None
    s = ""
    if rng.random() < 0.3:
        s += f"<|im_start|>system\n{rng.choice(SYSTEMS)}<|im_end|>\n"
    s += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{asst}<|im_end|>\n"
    return s


def chat_prompt(rng: random.Random, sents: list[str]) -> tuple[str, str] | None:
    """(ChatML prompt with generation prompt, the user text)"""
    if len(sents) < 4:
        return None
    i = rng.randrange(0, len(sents) - 2)
    user = sents[i]
    if len(user) > 300:
        return None
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n", user


def load_data(a, tok):
    with open(os.path.join(a.text, "train.txt"), encoding="utf-8") as fh:
        train_docs = fh.read().split("\n\x1e\n")
    with open(os.path.join(a.text, "heldout.txt"), encoding="utf-8") as fh:
        held_docs = fh.read().split("\n\x1e\n")
    if a.smoke:
        train_docs = [d[:40000] for d in train_docs[:12]]
        held_docs = [d[:20000] for d in held_docs[:4]]

    def stream(docs):
        ids = []
        for e in tok.encode_batch(docs):
            ids += e.ids + [ENDOFTEXT]
        return np.asarray(ids, dtype=np.int64)

    train_ids, held_ids = stream(train_docs), stream(held_docs)
    rng = random.Random(1234)
    train_sents = [sentences(d) for d in train_docs]
    held_sents = [sentences(d) for d in held_docs]
    chats = []
    target = int(len(train_ids) * a.chat_frac)
    n_tok = 0
    while n_tok < target:
        c = chat_text(rng, rng.choice(train_sents))
        if c is None:
            continue
        ids = tok.encode(c).ids + [ENDOFTEXT]
        chats.append(ids)
        n_tok += len(ids)
    chat_ids = np.asarray([i for c in chats for i in c], dtype=np.int64)
    log(f"train tokens {len(train_ids)}, chat tokens {len(chat_ids)} ({len(chats)} dialogues), held-out tokens {len(held_ids)}")
    return train_ids, chat_ids, held_ids, train_sents, held_sents


# ----------------------------------------------------------------------------------------------- eval helpers
@torch.no_grad()
def eval_loss(model, held, seq, batch, dev, max_windows=None):
    n = (len(held) - 1) // (seq + 1)
    idx = np.arange(n) if max_windows is None else np.linspace(0, n - 1, min(n, max_windows)).astype(int)
    tot_main = tot_mtp = 0.0
    cnt = 0
    for i in range(0, len(idx), batch):
        w = np.stack([held[j * (seq + 1) : (j + 1) * (seq + 1)] for j in idx[i : i + batch]])
        x = torch.from_numpy(w).to(dev)
        lm, lt = model.losses(x)
        tot_main += lm.item() * len(w)
        tot_mtp += lt.item() * len(w)
        cnt += len(w)
    return tot_main / cnt, tot_mtp / cnt


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """No-cache greedy decoding (full recompute each step). prompt [B, P] -> [B, P+n]."""
    x = prompt
    for _ in range(n):
        h = model.trunk(x)[:, -1]
        nxt = model.lm.lm_head(h).argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], 1)
    return x


@torch.no_grad()
def head_acc_on(model, seqs: torch.Tensor, p: int) -> tuple[float, int]:
    """Teacher-forced acceptance: over t = p-1 .. end-3, argmax MTP(h_t, x_{t+1}) == x_{t+2},
    where x_{p..} is the model's own greedy continuation of the prompt x_{<p}."""
    h = model.trunk(seqs)
    ml = model.head(h[:, :-1], seqs[:, 1:])  # position t predicts seqs[t+2]
    pred = ml[:, p - 1 : -1].argmax(-1)
    tgt = seqs[:, p + 1 :]
    return (pred == tgt).float().mean().item(), tgt.numel()


def distinct4(seq: list[int]) -> float:
    g = [tuple(seq[i : i + 4]) for i in range(len(seq) - 3)]
    return len(set(g)) / max(1, len(g))


@torch.no_grad()
def greedy_report(model, tok, eval_prompts, chat_prompts, n_new, dev):
    """Returns dict of figures plus a few decoded samples."""
    model.eval()
    P = eval_prompts.shape[1]
    seqs = greedy(model, eval_prompts.to(dev), n_new)
    acc, n = head_acc_on(model, seqs, P)
    d4 = float(np.mean([distinct4(s[P:].tolist()) for s in seqs.cpu()]))
    chat_accs, chat_n, samples, chat_samples, stops = [], 0, [], [], 0
    for ids in chat_prompts:
        pr = torch.tensor([ids], device=dev)
        s = greedy(model, pr, n_new)
        a, k = head_acc_on(model, s, len(ids))
        chat_accs.append(a * k)
        chat_n += k
        cont = s[0, len(ids) :].tolist()
        stops += int(IM_END in cont)
        if len(chat_samples) < 4:
            chat_samples.append({"prompt": tok.decode(ids, skip_special_tokens=False), "continuation": tok.decode(cont, skip_special_tokens=False)})
    for s in seqs[:4].cpu():
        samples.append({"prompt": tok.decode(s[:P].tolist(), skip_special_tokens=False), "continuation": tok.decode(s[P:].tolist(), skip_special_tokens=False)})
    return {
        "head_top1_on_own_greedy_text_prompts": acc,
        "head_top1_positions_text": n,
        "head_top1_on_own_greedy_chat_prompts": sum(chat_accs) / max(1, chat_n),
        "head_top1_positions_chat": chat_n,
        "distinct_4gram_ratio_greedy": d4,
        "chat_greedy_emits_im_end": f"{stops}/{len(chat_prompts)}",
        "samples": samples,
        "chat_samples": chat_samples,
    }


# ----------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True)
    ap.add_argument("--tok", required=True, help="folder holding tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-seconds", type=float, default=270)
    ap.add_argument("--head-seconds", type=float, default=60)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--max-epochs", type=float, default=30, help="phase 1 stops after this many passes over the train text")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--chat-frac", type=float, default=0.15)
    ap.add_argument("--eval-every", type=float, default=20)
    ap.add_argument("--n-distill", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phase1-out", default=None, help="also save the phase-1 weights (bf16 safetensors) here")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run to test the pipeline")
    a = ap.parse_args()

    from tokenizers import Tokenizer

    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True  # training only; every reported figure is re-measured later anyway
    torch.backends.cudnn.allow_tf32 = True
    log("torch", torch.__version__, "device", dev, torch.cuda.get_device_name() if dev == "cuda" else "")
    import transformers

    log("transformers", transformers.__version__, transformers.__file__)

    tok = Tokenizer.from_file(os.path.join(a.tok, "tokenizer.json"))
    V = tok.get_vocab_size()
    train_ids, chat_ids, held_ids, train_sents, held_sents = load_data(a, tok)

    tcfg = text_config_dict(V)
    model = TinyWithMTP(tcfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log("params", n_params)

    # ---------------- phase 1: joint training
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim == 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"),
    )
    L = a.seq
    rng = np.random.default_rng(a.seed)

    def batch():
        xs = []
        for _ in range(a.batch):
            src = chat_ids if (len(chat_ids) > L + 1 and rng.random() < a.chat_frac) else train_ids
            o = rng.integers(0, len(src) - L - 1)
            xs.append(src[o : o + L + 1])
        return torch.from_numpy(np.stack(xs)).to(dev, non_blocking=True)

    max_steps = int(a.max_epochs * len(train_ids) / (a.batch * L))
    warm = min(150, max(10, max_steps // 8))
    step, t_start, last_eval = 0, time.time(), time.time()
    best = (float("inf"), None, 0)
    hist = []
    ev_windows = 16 if a.smoke else 48
    while True:
        el = time.time() - t_start
        frac = max(el / a.train_seconds, step / max_steps)  # whichever budget runs out first
        if frac >= 1.0:
            break
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        x = batch()
        lm, lt = model.losses(x)
        loss = lm + a.mtp_weight * lt
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step <= 2:
            hist.append((step, lm.item(), lt.item()))
            log(f"step {step} lr {lr:.2e} main {lm.item():.4f} mtp {lt.item():.4f}")
        if time.time() - last_eval > a.eval_every:
            model.eval()
            hm, ht = eval_loss(model, held_ids, L, a.batch, dev, ev_windows)
            log(f"  held-out main {hm:.4f} mtp {ht:.4f} (best {best[0]:.4f})")
            if hm < best[0]:
                best = (hm, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
            last_eval = time.time()
    model.eval()
    hm, ht = eval_loss(model, held_ids, L, a.batch, dev, ev_windows)
    log(f"end of phase 1: {step} steps, held-out main {hm:.4f} mtp {ht:.4f}")
    if best[1] is not None and best[0] < hm:
        log(f"restoring best state from step {best[2]} (held-out {best[0]:.4f})")
        model.load_state_dict(best[1])
    steps_phase1 = step
    if a.phase1_out:
        from safetensors.torch import save_file

        save_file(to_checkpoint_dtypes(model.hf_state_dict()), a.phase1_out)
    tokens_phase1 = step * a.batch * L
    train_main_recent = float(np.mean([h[1] for h in hist[-5:]])) if hist else float("nan")
    train_mtp_recent = float(np.mean([h[2] for h in hist[-5:]])) if hist else float("nan")
    del opt

    # held-out prompts for the greedy / acceptance figures (fixed)
    prng = np.random.default_rng(99)
    P, n_new = (16, 24) if a.smoke else (32, 64)
    n_eval = 16 if a.smoke else 128
    offs = prng.integers(0, len(held_ids) - P - 1, n_eval)
    eval_prompts = torch.from_numpy(np.stack([held_ids[o : o + P] for o in offs]))
    crng = random.Random(7)
    chat_prompts = []
    while len(chat_prompts) < (4 if a.smoke else 16):
        cp = chat_prompt(crng, crng.choice(held_sents))
        if cp:
            chat_prompts.append(tok.encode(cp[0]).ids)
    rep0 = greedy_report(model, tok, eval_prompts, chat_prompts, n_new, dev)
    log("after phase 1:", json.dumps({k: v for k, v in rep0.items() if "samples" not in k}))
    for s in rep0["samples"][:2] + rep0["chat_samples"][:2]:
        log("  sample:", repr(s["prompt"][-120:]), "->", repr(s["continuation"][:300]))

    # ---------------- phase 2: head self-distillation on the trunk's own greedy continuations
    distill_info = {"seconds": 0.0}
    if a.head_seconds > 0:
        try:
            for p in model.parameters():
                p.requires_grad_(False)
            for p in model.mtp.parameters():
                p.requires_grad_(True)
            drng = np.random.default_rng(5)
            n_d = 64 if a.smoke else a.n_distill
            Pd, nd = (16, 24) if a.smoke else (32, 96)
            offs = drng.integers(0, len(train_ids) - Pd - 1, n_d)
            prompts = torch.from_numpy(np.stack([train_ids[o : o + Pd] for o in offs]))
            # chat prompts from training text, left-padded with <|endoftext|> (a finished previous document)
            c_rng = random.Random(11)
            cps = []
            while len(cps) < n_d // 8:
                cp = chat_prompt(c_rng, c_rng.choice(train_sents))
                if cp:
                    ids = tok.encode(cp[0]).ids[-Pd:]
                    cps.append([ENDOFTEXT] * (Pd - len(ids)) + ids)
            prompts = torch.cat([prompts, torch.tensor(cps)], 0)
            t_gen = time.time()
            seqs = []
            gb = 64 if a.smoke else 1024
            for i in range(0, len(prompts), gb):
                seqs.append(greedy(model, prompts[i : i + gb].to(dev), nd))
            seqs = torch.cat(seqs, 0)
            with torch.no_grad():
                hs = torch.cat([model.trunk(seqs[i : i + 512]) for i in range(0, len(seqs), 512)], 0)
            log(f"distill data: {tuple(seqs.shape)} in {time.time() - t_gen:.1f}s")
            hopt = torch.optim.AdamW(model.mtp.parameters(), lr=5e-4, betas=(0.9, 0.95), weight_decay=0.0)
            t_h, hstep = time.time(), 0
            hb = 16 if a.smoke else 256
            lm_head = model.lm.lm_head
            while time.time() - t_h < a.head_seconds:
                frac = (time.time() - t_h) / a.head_seconds
                for g in hopt.param_groups:
                    g["lr"] = 5e-4 * min(1.0, (hstep + 1) / 30) * 0.5 * (1 + math.cos(math.pi * frac))
                idx = torch.randint(0, len(seqs), (hb,), device=dev)
                s, h = seqs[idx], hs[idx]
                with torch.no_grad():
                    teacher = F.softmax(lm_head(h[:, 1:-1]).float(), -1)  # trunk distribution for x_{t+2}
                model.mtp.train()
                ml = model.head(h[:, :-2], s[:, 1:-1])
                loss = F.cross_entropy(ml.float().reshape(-1, ml.shape[-1]), teacher.reshape(-1, teacher.shape[-1]))
                hopt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.mtp.parameters(), 1.0)
                hopt.step()
                hstep += 1
                if hstep % 500 == 0:
                    log(f"head step {hstep} soft-CE {loss.item():.4f}")
            model.eval()
            distill_info = {"seconds": time.time() - t_h, "steps": hstep, "sequences": int(len(seqs)), "prompt_len": Pd, "gen_len": nd}
            del hs, seqs, hopt
            for p in model.parameters():
                p.requires_grad_(True)
        except Exception as ex:  # keep the phase-1 model rather than lose the run
            import traceback

            traceback.print_exc()
            log("phase 2 failed:", repr(ex))
            distill_info["error"] = repr(ex)
            for p in model.parameters():
                p.requires_grad_(True)

    # ---------------- phase 3: round to checkpoint dtypes, then measure everything on those weights (f32 math)
    sd = to_checkpoint_dtypes(model.hf_state_dict())
    model.load_hf_state_dict(sd)
    model.eval()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hm, ht = eval_loss(model, held_ids, L, a.batch, dev)
    tr_m, tr_t = eval_loss(model, train_ids[: max(len(held_ids), 300_000)], L, a.batch, dev)
    rep = greedy_report(model, tok, eval_prompts, chat_prompts, n_new, dev)
    metrics = {
        "params": n_params,
        "phase1": {"steps": steps_phase1, "tokens": tokens_phase1, "seq": L, "batch": a.batch, "seconds": a.train_seconds,
                   "train_main_loss_last_logged": train_main_recent, "train_mtp_loss_last_logged": train_mtp_recent,
                   "epochs": tokens_phase1 / len(train_ids), "best_step": best[2]},
        "head_distill": distill_info,
        "bf16_weights": {
            "heldout_main_loss": hm, "heldout_mtp_loss": ht,
            "train_main_loss": tr_m, "train_mtp_loss": tr_t,
            "heldout_ppl": math.exp(hm),
            **{k: v for k, v in rep.items()},
        },
        "before_distill_f32": {k: v for k, v in rep0.items() if "samples" not in k},
        "train_tokens": int(len(train_ids)), "chat_tokens": int(len(chat_ids)), "heldout_tokens": int(len(held_ids)),
        "torch": torch.__version__, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
    }
    log("FINAL", json.dumps({k: v for k, v in metrics["bf16_weights"].items() if "samples" not in k}))
    for s in rep["samples"] + rep["chat_samples"]:
        log("  sample:", repr(s["prompt"][-120:]), "->", repr(s["continuation"][:300]))

    # ---------------- export
    os.makedirs(a.out, exist_ok=True)
    from safetensors.torch import save_file

    save_file(sd, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(full_config_dict(tcfg), fh, indent=2)
        fh.write("\n")
    write_tokenizer_files(os.path.join(a.tok, "tokenizer.json"), a.out)
    with open(os.path.join(a.out, "metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    log("wrote", a.out, sorted(os.listdir(a.out)))


if __name__ == "__main__":
    main()
