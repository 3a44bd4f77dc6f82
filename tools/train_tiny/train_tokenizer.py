"""Train the tandem-tiny byte-level BPE tokenizer (HF `tokenizers`, CPU, ~1 min).

Pipeline identical to transformers' Qwen3_5Tokenizer (transformers 5.x rebuilds the pre-tokenizer of any
qwen3_5 checkpoint that way, so ids agree between `tokenizers`, transformers and mlx-lm):
  normalizer NFC; pre-tokenizer Sequence[Split(Qwen3.5 regex, isolated), ByteLevel(add_prefix_space=False,
  use_regex=False)]; BPE without unk / byte fallback; decoder ByteLevel.
Special tokens take ids 0..8 (SPECIALS order).

usage: python train_tokenizer.py TRAIN_TXT OUT_DIR [--vocab 4096]
"""
import argparse
import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# transformers 5.23.0 src/transformers/models/qwen3_5/tokenization_qwen3_5.py PRETOKENIZE_REGEX
QWEN35_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
]


def build_empty() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("train_txt")
    ap.add_argument("out_dir")
    ap.add_argument("--vocab", type=int, default=4096)
    a = ap.parse_args()
    tok = build_empty()
    trainer = trainers.BpeTrainer(
        vocab_size=a.vocab,
        min_frequency=2,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(a.train_txt, encoding="utf-8") as fh:
        docs = fh.read().split("\n\x1e\n")

    def it():
        # ChatML role names, so that "user" / "assistant" / "system" after <|im_start|> are single tokens
        yield "\n".join(["user", "assistant", "system"] * 1000)
        for d in docs:
            for i in range(0, len(d), 100_000):  # the Split regex keeps words whole across chunk edges well enough
                yield d[i : i + 100_000]

    tok.train_from_iterator(it(), trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    os.makedirs(a.out_dir, exist_ok=True)
    tok.save(os.path.join(a.out_dir, "tokenizer.json"))
    print("vocab", tok.get_vocab_size(), "->", os.path.join(a.out_dir, "tokenizer.json"))


if __name__ == "__main__":
    main()
