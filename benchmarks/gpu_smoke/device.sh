#!/usr/bin/env bash
# One call of the carried smoke check (carry.py), run on the GPU machine from the checkout:
#   bash CALL_FOLDER/device.sh [run.py options and config overrides]
# Gathers this call's parts in $ALIGHT_STAGE; once every part of the manifest is there, checks them,
# unpacks the Python 3.12 site and the model, and runs the smoke check (results in $OUT or ./smoke-out).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
stage=${ALIGHT_STAGE:-/root/alight-stage}
site=$stage/site
out=${OUT:-$PWD/smoke-out}
mkdir -p "$stage" "$out"
cp "$here"/* "$stage"/
# every part present? (bundle.py's join checks each sha256 and says what is missing)
if ! python3 -c "import sys; sys.path.insert(0, '$stage'); from pathlib import Path; from bundle import join_folder; join_folder(Path('$stage'))" 2>"$stage/join.log"; then
  echo "device.sh: staged $(ls "$stage" | grep -c '\.part') parts; waiting for more: $(tail -1 "$stage/join.log")"
  exit 0
fi
if [ ! -f "$site/.unpacked" ]; then
  mkdir -p "$site" && tar -xJf "$stage/site.tar.xz" -C "$site" && touch "$site/.unpacked" || { echo "device.sh: cannot unpack the site"; exit 3; }
  xz -dc "$stage/smollm2.gguf.xz" > "$stage/SmolLM2-135M-Instruct.Q4_1.gguf" || { echo "device.sh: cannot unpack the model"; exit 3; }
fi
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
tar -czf "$stage/alight-src.tar.gz" configs recipes || { echo "device.sh: run it from the alight checkout"; exit 2; }
python3 "$stage/run.py" --skip-install --bundle "$stage" --out "$out/smoke.json" \
  --model "$stage/SmolLM2-135M-Instruct.Q4_1.gguf" "$@"
rc=$?
for run in "$stage"/work/runs-*/*/; do
  [ -d "$run" ] && tar -czf "$out/$(basename "$(dirname "$run")").tar.gz" --exclude=checkpoints --exclude=backend \
    --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' -C "$run" .
done
exit $rc
