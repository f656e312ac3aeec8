#!/usr/bin/env bash
# Installs the pinned Codex CLI (npm @openai/codex, a native binary in a registry package) into a
# prefix of its own outside the checkout, where configs/codex_cli.yaml looks for it.
#   bash recipes/codex_cli/install.sh        # ALIGHT_HARNESS_DIR overrides ~/.cache/alight/harness
set -euo pipefail
VERSION=0.171.0
PREFIX="${ALIGHT_HARNESS_DIR:-$HOME/.cache/alight/harness}/codex"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "@openai/codex@$VERSION"
"$PREFIX/node_modules/.bin/codex" --version
