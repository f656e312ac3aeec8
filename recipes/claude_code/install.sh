#!/usr/bin/env bash
# Installs the pinned Claude Code (npm @anthropic-ai/claude-code, a native binary in a registry
# package) into a prefix of its own outside the checkout, where configs/claude_code.yaml looks for it.
#   bash recipes/claude_code/install.sh      # ALIGHT_HARNESS_DIR overrides ~/.cache/alight/harness
set -euo pipefail
VERSION=2.1.332
PREFIX="${ALIGHT_HARNESS_DIR:-$HOME/.cache/alight/harness}/claude"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "@anthropic-ai/claude-code@$VERSION"
"$PREFIX/node_modules/.bin/claude" --version
