#!/usr/bin/env bash
# Cold gather from a Streamable HTTP server at 0, 2 and 10 ms round trips:
# mcp-context's lab peer against the lab's raw reference client and the
# official SDK peers, interleaved, against the project's own bench server
# (`bench_server --http`, pre-serialised answers), in one run. Prints one JSON
# line per run and a median table at the end (BENCHMARKS.md, "Remote servers
# at latency").
#
# Needs root and /dev/net/tun (the lab's userspace delay link), the lab set up
# (`cp -r ../shared/lab /tmp/lab && (cd /tmp/lab && ./setup.sh)`), and release
# builds of the two examples:
#   cargo build --release --example bench_server --example lab_peer
#   LAB=/tmp/lab ROUNDS=3 benches/latency_lab.sh
set -euo pipefail

LAB="${LAB:-/tmp/lab}"
ROUNDS="${ROUNDS:-3}"
RTTS="${RTTS:-0 2 10}"
BIN="${BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/examples}"
OUT="${OUT:-/tmp/latency_lab.jsonl}"
STATE=/tmp/latency_lab_net
: > "$OUT"

"$LAB/http/net_up.sh" --rtt 10 --state "$STATE" >&2
ip netns exec labnet "$BIN/bench_server" --http 0.0.0.0:8765 --protocol 2025-11-25 2>/dev/null &
OLD=$!
ip netns exec labnet "$BIN/bench_server" --http 0.0.0.0:8766 --protocol 2026-07-28 2>/dev/null &
NEW=$!
trap 'kill $OLD $NEW 2>/dev/null || true; "$LAB/http/net_down.sh" --kill --state "$STATE" >/dev/null 2>&1 || true' EXIT
sleep 1

# name|command (URL_OLD / URL_NEW are substituted per RTT)
PEERS=(
  "raw 64 conns|$LAB/.venv/bin/python $LAB/http/raw_http.py --conns 64 --url URL_OLD"
  "raw 64 conns, 2026-07-28|$LAB/.venv/bin/python $LAB/http/raw_http.py --conns 64 --protocol 2026-07-28 --url URL_NEW"
  "raw 16 conns|$LAB/.venv/bin/python $LAB/http/raw_http.py --conns 16 --url URL_OLD"
  "mcp-context (2025-11-25 server, auto)|env LAB_DIR=$LAB $BIN/lab_peer --concurrent --url URL_OLD"
  "mcp-context (2026-07-28 server, auto)|env LAB_DIR=$LAB $BIN/lab_peer --concurrent --url URL_NEW"
  "mcp-context, no read-ahead (2025-11-25)|env LAB_DIR=$LAB $BIN/lab_peer --concurrent --no-read-ahead --url URL_OLD"
  "mcp-context, 16 in flight, no read-ahead (2025-11-25)|env LAB_DIR=$LAB $BIN/lab_peer --concurrent --no-read-ahead --reads 16 --url URL_OLD"
  "TypeScript SDK, batches of 16|node $LAB/http/peer_node_http.mjs --concurrent --url URL_OLD"
  "Python SDK 1.30, gather + Sem(16)|$LAB/.venv/bin/python $LAB/http/peer_python_http.py --concurrent --url URL_OLD"
)

for rtt in $RTTS; do
  if [ "$rtt" = 0 ]; then
    # Loopback inside the namespace: no link at all.
    prefix="ip netns exec labnet"; host=127.0.0.1
  else
    "$LAB/http/net_up.sh" --rtt "$rtt" --state "$STATE" >&2
    prefix=""; host=10.200.0.2
  fi
  for round in $(seq 1 "$ROUNDS"); do
    for p in "${PEERS[@]}"; do
      name="${p%%|*}"; cmd="${p#*|}"
      cmd="${cmd//URL_OLD/http://$host:8765/mcp}"; cmd="${cmd//URL_NEW/http://$host:8766/mcp}"
      line=$(cd "$LAB" && $prefix $cmd 2>/dev/null | tail -1) || line='{}'
      python3 -c 'import json,sys; d=json.loads(sys.argv[3] or "{}"); d["peer"]=sys.argv[1]; d["rtt_ms"]=int(sys.argv[2]); d["round"]=int(sys.argv[4]); print(json.dumps(d))' \
        "$name" "$rtt" "$line" "$round" | tee -a "$OUT"
    done
  done
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
peers = list(dict.fromkeys(r["peer"] for r in rows))
rtts = sorted({r["rtt_ms"] for r in rows})
def med(p, t, k="gather_s"):
    v = [r[k] for r in rows if r["peer"] == p and r["rtt_ms"] == t and k in r and r.get("chars") == 1847698]
    return statistics.median(v) if v else None
print("| client | " + " | ".join(f"{t} ms RTT" for t in rtts) + " |")
print("|---|" + "---:|" * len(rtts))
for p in peers:
    cells = []
    for t in rtts:
        g, ref = med(p, t), med("raw 64 conns", t)
        cells.append("–" if g is None else f"{g:.3f} s ({g / ref:.2f}x)" if ref else f"{g:.3f} s")
    print(f"| {p} | " + " | ".join(cells) + " |")
print()
print("spawn_to_connected_s (connect + handshake), mcp-context, medians:")
for p in peers:
    if p.startswith("mcp-context ("):
        print(p, {t: med(p, t, "spawn_to_connected_s") for t in rtts})
EOF
