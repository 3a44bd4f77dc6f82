"""Counts the frames of cuda-gdb backtraces taken while `tandem bench` decodes (issue16_bench.sh, phase
`hostprof`): a sampling profile of the host where no `perf` exists. Per sample, the decoding thread is the
one whose stack passes through `tandem::generate`; each function on its stack counts once (inclusive) and
its innermost frame counts as self time. Prints the commonest of both, as shares of the samples."""
import collections
import re
import sys

FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(.+?)(?: \(.*)?$")


def short(name: str) -> str:
    # Template arguments and Rust hashes say little in a profile.
    while True:
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            break
        name = shorter
    return re.sub(r"::h[0-9a-f]{16}$", "", name)[:110]


def threads(sample: str):
    for block in re.split(r"\n(?=Thread \d+ )", sample):
        frames = []
        for line in block.splitlines():
            m = FRAME.match(line.strip())
            if m:
                frames.append(short(m.group(2)))
        if frames:
            yield frames


def main(path: str) -> None:
    samples = open(path, errors="replace").read().split("=== sample")[1:]
    incl, self_, used = collections.Counter(), collections.Counter(), 0
    for sample in samples:
        decoding = [f for f in threads(sample) if any("tandem::generate" in x for x in f)]
        if not decoding:
            continue
        frames = decoding[0]
        used += 1
        self_[frames[0]] += 1
        for name in set(frames):
            incl[name] += 1
    print(f"{used} of {len(samples)} samples caught the decoding thread")
    if not used:
        return
    print("inclusive:")
    for name, n in incl.most_common(45):
        print(f"  {100 * n / used:5.1f}%  {name}")
    print("self:")
    for name, n in self_.most_common(25):
        print(f"  {100 * n / used:5.1f}%  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
