#!/bin/sh
# A calculator agent in POSIX shell with curl and sed, nothing alight-specific: it reads the task
# (a Calc-X-style row) from the JSON file ALIGHT_TASK_FILE, asks the model once at
# OPENAI_BASE_URL/chat/completions to answer from its head, and writes its reward (1 when the
# last number of the answer is the task's `result`, else 0) to ALIGHT_REWARD_FILE.
#   alight dev configs/calc_node.yaml agent.command=examples/shell_agent/agent.sh
set -eu

# The question is already a JSON string in the task file: reuse it, quotes and escapes included.
question=$(sed -n 's/.*"question": *\("\([^"\\]\|\\.\)*"\).*/\1/p' "$ALIGHT_TASK_FILE")
result=$(sed -n 's/.*"result": *"\{0,1\}\([-0-9.]*\).*/\1/p' "$ALIGHT_TASK_FILE")
[ -n "$question" ] || { echo "no question in the task" >&2; exit 2; }

reply=$(curl -sS --fail-with-body -X POST "$OPENAI_BASE_URL/chat/completions" \
  -H "content-type: application/json" -H "authorization: Bearer $OPENAI_API_KEY" \
  -d "{\"model\": \"$ALIGHT_MODEL\", \"messages\": [{\"role\": \"user\", \"content\": $question}]}")

answer=$(printf '%s' "$reply" | sed -n 's/.*"content":"\(\([^"\\]\|\\.\)*\)".*/\1/p')
last=$(printf '%s\n' "$answer" | grep -o -- '-\{0,1\}[0-9][0-9]*\(\.[0-9][0-9]*\)\{0,1\}' | tail -n 1 || true)
if [ -n "$last" ] && [ -n "$result" ] && awk -v a="$last" -v b="$result" 'BEGIN { exit !(a + 0 == b + 0) }'; then
  echo 1 > "$ALIGHT_REWARD_FILE"
else
  echo 0 > "$ALIGHT_REWARD_FILE"
fi
