"""Split the SOTU speeches and Moby Dick into train / held-out text (deterministic).

Held-out: every 10th SOTU speech (sorted by file name, index % 10 == 7) and the last 5% of Moby Dick
(Moby Dick is unwrapped first: single newlines become spaces, paragraphs stay separated by a blank line).
Documents are joined with a blank line and "<|endoftext|>" is NOT inserted here; train.py adds it.
Output: train.txt, heldout.txt (documents separated by a line holding only "\x1e" = record separator).
"""
import glob
import os
import re
import sys
import unicodedata

SEP = "\n\x1e\n"


def clean(t: str) -> str:
    t = unicodedata.normalize("NFC", t.replace("\r\n", "\n").replace("\r", "\n"))
    return t.strip()


def main(pkg: str, out: str) -> None:
    sotu = sorted(glob.glob(os.path.join(pkg, "sotu", "data", "*.txt")))
    assert len(sotu) == 233, len(sotu)
    train, held = [], []
    for i, f in enumerate(sotu):
        with open(f, encoding="utf-8") as fh:
            t = clean(fh.read())
        (held if i % 10 == 7 else train).append(t)
    with open(os.path.join(pkg, "moby-dick", "data", "data.txt"), encoding="utf-8") as fh:
        moby = clean(fh.read())
    # Moby Dick is hard-wrapped at ~70 columns: unwrap paragraphs (single newlines -> spaces).
    moby = re.sub(r"(?<!\n)\n(?!\n)", " ", moby)
    moby = re.sub(r"\n{3,}", "\n\n", moby)
    cut = moby.find("\n", int(len(moby) * 0.95))
    train.append(moby[:cut].strip())
    held.append(moby[cut:].strip())
    os.makedirs(out, exist_ok=True)
    for name, docs in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as fh:
            fh.write(SEP.join(docs))
        print(name, len(docs), "docs", sum(len(d) for d in docs), "chars")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
