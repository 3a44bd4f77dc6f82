"""Fine-tune tandem-tiny's MTP head for chained drafting (depth > 1); the trunk, embedding and lm_head are frozen.

A decoder drafts k > 1 tokens by chaining the head (docs/MODEL.md §4.2): draft s+1 feeds the head's own output after
`mtp.norm` (hm) of draft s, paired with draft s, at the next RoPE position, and the head's KV cache then holds the
committed pairs plus the chained entries. train.py only trained step 1 (the trunk's h_t), so the head had never seen
its own hm as input. Here every training window runs the head for --steps chained steps (`MTPHead.chained`):
    step 1: (h_t, x_{t+1})            at position t     -> x_{t+2}
    step s: (hm_{s-1}[t], x_{t+s})    at position t+s-1 -> x_{t+s+1}     attending to the step-1 entries of pairs
                                                                          0..t and to its own chain (exact, masked)
teacher-forced with the true next token, which on the trunk's greedy text is exactly the accepted draft. Targets are
the trunk's own next-position distribution (self-distillation, as in train.py phase 2), on the trunk's greedy
continuations of training-text and chat prompts; the chained steps are scored only where their input tokens are
generated ones (t >= prompt_len - 1), which is where a decoder chains.

Acceptance is measured teacher-forced on the model's own greedy continuations of held-out prompts (the prompts of
train.py): depth 1 = argmax(step 1) == x_{t+2} over every frontier t of the continuation; conditional depth s =
argmax(step s) == x_{t+s+1} among the t whose drafts 1..s-1 were all right (then the teacher-forced inputs are the
drafts themselves, so this is what a chaining decoder accepts).

usage:
  python chain_head.py --text .cache/text --tok .cache/tok --model assets/models/tandem-tiny --out OUT [--seconds 180]
  python chain_head.py --text .cache/text --tok .cache/tok --model DIR --eval-only [--json F]
Writes OUT/model.safetensors (the input checkpoint with only mtp.* replaced; the other tensors are copied
bit-for-bit and checked), OUT/chain_metrics.json (or --chain-metrics F) and, when the input folder has train.py's
metrics.json, OUT/metrics.json with the head's figures updated; with several --weights variants (';'-separated),
OUT/v1/model.safetensors, OUT/v2/... and no metrics.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_model import ENDOFTEXT, TinyWithMTP, to_checkpoint_dtypes  # noqa: E402
from train import chat_prompt, eval_loss, greedy, load_data, log  # noqa: E402


@torch.no_grad()
def greedy_cached(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy with transformers' caches (faster on the CPU; used for training data only)."""
    return model.lm.generate(prompt, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)


@torch.no_grad()
def chain_counts(model, seqs: torch.Tensor, p: int, steps: int) -> list[tuple[int, int]]:
    """[(hits, trials)] per depth over frontiers t >= p-1 of seqs [B, N] (prompt p + greedy continuation).
    Depth 1: trials = every t with x_{t+2} in the sequence. Depth s: trials = the t whose drafts 1..s-1 were right
    (and x_{t+s+1} exists), hits = those whose draft s is right too."""
    b, n = seqs.shape
    h = model.trunk(seqs)
    pad = torch.zeros(b, steps - 1, dtype=seqs.dtype, device=seqs.device)
    outs = model.head_chained(h[:, : n - 1], torch.cat([seqs, pad], 1), steps)  # rows t = 0..n-2
    tgt = torch.cat([seqs, torch.full((b, steps + 1), -1, dtype=seqs.dtype, device=seqs.device)], 1)
    t = torch.arange(n - 1, device=seqs.device)
    ok = torch.ones(b, n - 1, dtype=torch.bool, device=seqs.device)
    res = []
    for s, lg in enumerate(outs, start=1):
        valid = (t >= p - 1) & (t + s + 1 <= n - 1)
        right = lg.argmax(-1) == tgt[:, t + s + 1]
        trials = ok & valid[None]
        res.append((int((trials & right).sum()), int(trials.sum())))
        ok = ok & right
    return res


def add_counts(a, b):
    return [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a, b)] if a else b


def summarize(counts) -> dict:
    rates = [h / max(1, n) for h, n in counts]
    out = {f"depth{s}": {"accepted": h, "drafted": n, "rate": r} for s, ((h, n), r) in enumerate(zip(counts, rates), 1)}
    # expected drafts accepted per cycle at depth k (a1 + a1 a2 + ...), from the conditional rates
    exp, prod = [], 1.0
    for r in rates:
        prod *= r
        exp.append((exp[-1] if exp else 0.0) + prod)
    out["expected_accepted_per_cycle"] = {f"k{k}": e for k, e in enumerate(exp, 1)}
    return out


@torch.no_grad()
def chain_report(model, eval_prompts, chat_prompts, n_new, dev, steps=3, bs=128) -> dict:
    model.eval()
    P = eval_prompts.shape[1]
    text = None
    for i in range(0, len(eval_prompts), bs):
        s = greedy(model, eval_prompts[i : i + bs].to(dev), n_new)
        text = add_counts(text, chain_counts(model, s, P, steps))
    chat = None
    for ids in chat_prompts:
        s = greedy(model, torch.tensor([ids], device=dev), n_new)
        chat = add_counts(chat, chain_counts(model, s, len(ids), steps))
    return {"text": summarize(text), "chat": summarize(chat)}


def short(rep: dict) -> str:
    return " | ".join(
        f"{k}: " + " ".join(f"d{s} {rep[k][f'depth{s}']['rate']:.3f} ({rep[k][f'depth{s}']['drafted']})" for s in (1, 2, 3))
        for k in ("text", "chat")
    )


def eval_prompt_sets(a, tok, held_ids, held_sents):
    """The held-out prompts of train.py (same seeds): 128 text prompts of 32 tokens, 16 ChatML prompts."""
    prng = np.random.default_rng(99)
    P, n_new = (16, 24) if a.smoke else (32, 64)
    n_eval = 16 if a.smoke else 128
    offs = prng.integers(0, len(held_ids) - P - 1, n_eval)
    eval_prompts = torch.from_numpy(np.stack([held_ids[o : o + P] for o in offs]))[: a.eval_limit or None]
    crng = random.Random(7)
    chat_prompts = []
    while len(chat_prompts) < min(4 if a.smoke else 16, a.eval_limit or 16):
        cp = chat_prompt(crng, crng.choice(held_sents))
        if cp:
            chat_prompts.append(tok.encode(cp[0]).ids)
    return eval_prompts, chat_prompts, n_new


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True)
    ap.add_argument("--tok", required=True)
    ap.add_argument("--model", required=True, help="folder with model.safetensors and config.json (the input)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--steps", type=int, default=3, help="chained steps per window")
    ap.add_argument("--weights", default="1,0.6,0.3",
                    help="loss weight of each chained step; several variants separated by ';' are each trained from the "
                         "input head for --seconds and written to OUT/v1, OUT/v2, ...")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--n-text", type=int, default=8192, help="training-text prompts to continue greedily")
    ap.add_argument("--n-chat", type=int, default=1024, help="training ChatML prompts to continue greedily")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=96)
    ap.add_argument("--gen-batch", type=int, default=3072)
    ap.add_argument("--gen", choices=["full", "cached"], default="full", help="greedy by full recompute or with caches")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--eval-only", action="store_true")
    ap.add_argument("--no-eval-before", action="store_true")
    ap.add_argument("--eval-losses", action="store_true", help="also the held-out / train loss figures of train.py")
    ap.add_argument("--json", default=None, help="--eval-only: write the figures here")
    ap.add_argument("--chain-metrics", default=None, help="where to write chain_metrics.json (default: OUT/)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--eval-limit", type=int, default=0, help="debugging: measure on only this many prompts of each set")
    ap.add_argument("--chat-frac", type=float, default=0.15)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()

    from tokenizers import Tokenizer

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    log("torch", torch.__version__, "device", dev, torch.cuda.get_device_name() if dev == "cuda" else "")
    tok = Tokenizer.from_file(os.path.join(a.tok, "tokenizer.json"))
    train_ids, chat_ids, held_ids, train_sents, held_sents = load_data(a, tok)
    with open(os.path.join(a.model, "config.json")) as fh:
        tcfg = json.load(fh)["text_config"]
    orig = load_file(os.path.join(a.model, "model.safetensors"))
    model = TinyWithMTP(tcfg).to(dev)
    model.load_hf_state_dict(orig)
    model.eval()
    eval_prompts, chat_prompts, n_new = eval_prompt_sets(a, tok, held_ids, held_sents)
    steps = a.steps
    metrics: dict = {"input_model": a.model, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__}

    def measure(tag):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        t0 = time.time()
        rep = chain_report(model, eval_prompts, chat_prompts, n_new, dev, steps=max(3, steps))
        log(f"{tag} ({time.time() - t0:.1f}s): {short(rep)}")
        if a.eval_losses:
            L = 1024
            hm, ht = eval_loss(model, held_ids, L, 32, dev)
            tm, tt = eval_loss(model, train_ids[: max(len(held_ids), 300_000)], L, 32, dev)
            rep["losses"] = {"heldout_main_loss": hm, "heldout_mtp_loss": ht, "train_main_loss": tm, "train_mtp_loss": tt}
            log(f"{tag} losses: {json.dumps(rep['losses'])}")
        return rep

    if a.eval_only:
        rep = measure("eval")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(rep, fh, indent=2)
        return
    if not a.no_eval_before:
        metrics["before"] = measure("before")

    # ---------------- data: the trunk's greedy continuations of training prompts (as train.py phase 2)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    for p in model.parameters():
        p.requires_grad_(False)
    drng = np.random.default_rng(a.seed)
    Pd, nd = (16, 24) if a.smoke else (a.prompt_len, a.gen_len)
    offs = drng.integers(0, len(train_ids) - Pd - 1, a.n_text)
    prompts = torch.from_numpy(np.stack([train_ids[o : o + Pd] for o in offs]))
    c_rng = random.Random(a.seed + 1)
    cps = []
    while len(cps) < a.n_chat:
        cp = chat_prompt(c_rng, c_rng.choice(train_sents))
        if cp:
            ids = tok.encode(cp[0]).ids[-Pd:]
            cps.append([ENDOFTEXT] * (Pd - len(ids)) + ids)
    if cps:
        prompts = torch.cat([prompts, torch.tensor(cps)], 0)
    t_gen = time.time()
    gen_fn = greedy if a.gen == "full" else greedy_cached
    seqs = torch.cat([gen_fn(model, prompts[i : i + a.gen_batch].to(dev), nd) for i in range(0, len(prompts), a.gen_batch)], 0)
    with torch.no_grad():
        hs = torch.cat([model.trunk(seqs[i : i + 512]) for i in range(0, len(seqs), 512)], 0)
    log(f"distill data: {tuple(seqs.shape)} in {time.time() - t_gen:.1f}s")

    # ---------------- chained self-distillation of the head, once per variant (each from the input head)
    head0 = {k: v.detach().clone() for k, v in model.mtp.state_dict().items()}
    variants = [[float(x) for x in v.split(",")] for v in a.weights.split(";")]
    for vi, w in enumerate(variants, start=1):
        assert len(w) == steps, "one weight per chained step"
        model.mtp.load_state_dict(head0)
        info = finetune(a, model, seqs, hs, Pd, steps, w, dev)
        info.update({"sequences": int(len(seqs)), "text_prompts": a.n_text, "chat_prompts": a.n_chat,
                     "prompt_len": Pd, "gen_len": nd, "seed": a.seed})
        # checkpoint: only mtp.* replaced, rounded to bf16; every figure re-measured on those weights
        new = to_checkpoint_dtypes(model.hf_state_dict())
        sd = {}
        for k, v in orig.items():
            if k.startswith("mtp."):
                sd[k] = new[k]
            else:
                assert torch.equal(new[k], v) and new[k].dtype == v.dtype, f"trunk tensor changed: {k}"
                sd[k] = v
        assert set(sd) == set(new)
        sd, moved = rebalance_pre_fc_norms(sd)
        if moved:
            log("rebalanced:", moved)
        model.load_hf_state_dict(sd)
        name = f"v{vi}" if len(variants) > 1 else "."
        metrics[f"v{vi}"] = {"finetune": info, "after": measure(f"v{vi} weights {w} after (bf16 head)")}
        if a.out:
            od = os.path.join(a.out, name)
            os.makedirs(od, exist_ok=True)
            save_file(sd, os.path.join(od, "model.safetensors"), metadata={"format": "pt"})
            with open(a.chain_metrics or os.path.join(a.out, "chain_metrics.json"), "w") as fh:
                json.dump(metrics, fh, indent=2)
                fh.write("\n")
            base = os.path.join(a.model, "metrics.json")
            if len(variants) == 1 and os.path.exists(base):  # the model's own metrics.json, head figures updated
                with open(base, encoding="utf-8") as fh:
                    merged = merge_model_metrics(json.load(fh), metrics, "v1")
                with open(os.path.join(a.out, "metrics.json"), "w", encoding="utf-8") as fh:
                    json.dump(merged, fh, indent=2, ensure_ascii=False)
                    fh.write("\n")
            log("wrote", od)


def merge_model_metrics(base: dict, chain: dict, variant: str) -> dict:
    """train.py's metrics.json with the head's figures replaced by those of the chained fine-tune `variant`
    (the trunk's figures are unchanged: its weights are) and a section `mtp_chain_finetune`."""
    out = json.loads(json.dumps(base))
    after = chain[variant]["after"]
    bw = out["bf16_weights"]
    if "losses" in after:
        bw["heldout_mtp_loss"] = after["losses"]["heldout_mtp_loss"]
        bw["train_mtp_loss"] = after["losses"]["train_mtp_loss"]
        assert abs(after["losses"]["heldout_main_loss"] - bw["heldout_main_loss"]) < 1e-4, "trunk figures moved"
    bw["head_top1_on_own_greedy_text_prompts"] = after["text"]["depth1"]["rate"]
    bw["head_top1_positions_text"] = after["text"]["depth1"]["drafted"]
    bw["head_top1_on_own_greedy_chat_prompts"] = after["chat"]["depth1"]["rate"]
    bw["head_top1_positions_chat"] = after["chat"]["depth1"]["drafted"]
    sec = {
        "what": "MTP head fine-tuned for chained drafting (tools/train_tiny/chain_head.py); trunk, embedding and lm_head "
                "frozen and bit-identical. Acceptance: teacher-forced on the model's own greedy continuations (64 tokens) "
                "of the held-out prompts of train.py; depthN = conditional acceptance of draft N given drafts 1..N-1 "
                "accepted, chained as docs/MODEL.md §4.2 (hm after mtp.norm + the drafted token, next position, KV cache "
                "of the committed pairs plus the chain); expected_accepted_per_cycle kK = a1 + a1*a2 + ...",
        "finetune": chain[variant]["finetune"],
        "before": {k: chain["before"][k] for k in ("text", "chat")} if "before" in chain else None,
        "after": {k: after[k] for k in ("text", "chat")},
    }
    if "before" in chain and "losses" in chain["before"]:
        sec["before"]["heldout_mtp_loss"] = chain["before"]["losses"]["heldout_mtp_loss"]
    sec["after"]["heldout_mtp_loss"] = bw["heldout_mtp_loss"]
    others = {k: {"weights": v["finetune"]["weights"], **{s: v["after"][s] for s in ("text", "chat")}}
              for k, v in chain.items() if k.startswith("v") and k != variant}
    if others:
        sec["variants_not_kept"] = others
    sec["device"], sec["torch"] = chain.get("device"), chain.get("torch")
    out["mtp_chain_finetune"] = sec
    return out


def rebalance_pre_fc_norms(sd: dict[str, torch.Tensor], floor: float = -0.1) -> tuple[dict, list[str]]:
    """Keeps the mean of each pre-fc norm weight away from the range where a loader that checks norm conventions
    against the backbone's final norm (Tandem's `mtp_norm_conventions` on a converted, shifted checkpoint) would
    mistake it for the other convention (mean below about -0.21 there).

    pre_fc_norm_{embedding,hidden} feed only `fc`, whose columns [:D] / [D:] read them, so the scale (1 + w) can be
    doubled while those fc columns are halved: the head computes the same function (the halving is exact in bf16;
    the new w = 2(1 + w) - 1 is rounded to bf16, a relative change of the scale of at most 2^-9). Applied to a norm
    whose weight mean is below `floor`. Returns (new state dict, what was changed)."""
    out, moved = dict(sd), []
    d = sd["mtp.fc.weight"].shape[0]
    for half, name in ((0, "mtp.pre_fc_norm_embedding.weight"), (1, "mtp.pre_fc_norm_hidden.weight")):
        w = sd[name]
        m = w.float().mean().item()
        if m >= floor:
            continue
        out[name] = (2.0 * (1.0 + w.double()) - 1.0).to(w.dtype).contiguous()
        fc = out["mtp.fc.weight"].clone()
        fc[:, half * d : (half + 1) * d] = fc[:, half * d : (half + 1) * d] / 2  # exact: a power of two
        out["mtp.fc.weight"] = fc.contiguous()
        moved.append(f"{name} mean {m:.3f} -> {out[name].float().mean().item():.3f}, fc columns {half * d}:{(half + 1) * d} halved")
    return out, moved


def finetune(a, model, seqs, hs, Pd, steps, w, dev) -> dict:
    dev_type = "cuda" if dev == "cuda" else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    for p in model.mtp.parameters():
        p.requires_grad_(True)
    hopt = torch.optim.AdamW(model.mtp.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    lm_head = model.lm.lm_head
    N = seqs.shape[1]
    T = N - steps  # frontiers t = 0..T-1; step s reads x_{t+s} <= x_{N-1} and the trunk distribution at t+s
    rows = torch.arange(T, device=dev)
    chain_rows = (rows >= Pd - 1).float()  # chained steps only where their inputs are generated tokens
    t_h, hstep, hist = time.time(), 0, []
    while time.time() - t_h < a.seconds:
        frac = (time.time() - t_h) / a.seconds
        for g in hopt.param_groups:
            g["lr"] = a.lr * min(1.0, (hstep + 1) / 50) * 0.5 * (1 + math.cos(math.pi * frac))
        idx = torch.randint(0, len(seqs), (a.batch,), device=dev)
        s, h = seqs[idx], hs[idx]
        with torch.no_grad():
            teacher = F.softmax(lm_head(h[:, 1:]).float(), -1)  # row i: trunk distribution of x_{i+2}
        model.mtp.train()
        outs = model.head_chained(h[:, :T], s, steps)
        loss, parts = 0.0, []
        for k, lg in enumerate(outs, start=1):
            ce = -(teacher[:, k - 1 : k - 1 + T] * F.log_softmax(lg.float(), -1)).sum(-1)  # [B, T]
            ce = ce.mean() if k == 1 else (ce * chain_rows).sum() / (chain_rows.sum() * ce.shape[0])
            loss = loss + w[k - 1] * ce
            parts.append(ce)
        hopt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.mtp.parameters(), 1.0)
        hopt.step()
        hstep += 1
        if hstep % 250 == 1:
            hist.append((hstep, [x.item() for x in parts]))
            log(f"head step {hstep} soft-CE per step " + " ".join(f"{x:.4f}" for x in hist[-1][1]))
    model.eval()
    for p in model.mtp.parameters():
        p.requires_grad_(False)
    del hopt
    return {"seconds": time.time() - t_h, "steps": hstep, "batch": a.batch, "lr": a.lr, "chain_steps": steps, "weights": w,
            "soft_ce_last_logged": hist[-1][1] if hist else None, "device_type": dev_type}


if __name__ == "__main__":
    main()
