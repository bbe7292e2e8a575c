#!/usr/bin/env bash
# Two regions of one bus on this machine, each part its own process on
# loopback: a nats-server per region (its own cluster, joined to the other
# by a NATS gateway), and in each region a broker, a gateway deciding there
# and two simulated engines with their adapters, all with --region. The
# routing table (deploy/examples/table.json with policy.regions a -> [b],
# b -> [a]) lives in region a, with a copy in region b. Prints each
# region's gateway URL; Ctrl-C stops everything. `make supercluster` runs
# it.
#
#   scripts/supercluster.sh DIR SWITCHYARD NATS_SERVER
#
# Ports: BASE_PORT (default 14000) and the 16 above it. State and logs go to
# DIR (emptied first). Without authorization or TLS: docs/deploy.md,
# "Regions", has the production shape (deploy/nats/supercluster.conf).
set -euo pipefail
dir=${1:?usage: $0 DIR SWITCHYARD NATS_SERVER}
sy=$(realpath "${2:?}")
ns=$(realpath "${3:?}")
base=${BASE_PORT:-14000}
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$dir" && mkdir -p "$dir/logs"
dir=$(realpath "$dir")

pids=()
stop() {
	trap - INT TERM EXIT
	echo "stopping…"
	# Parts first, the servers last (they were started first).
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap stop INT TERM EXIT

start() { # NAME CMD...: runs CMD in the background, its output in logs/NAME.log
	local name=$1
	shift
	"$@" >"$dir/logs/$name.log" 2>&1 &
	pids+=($!)
}

wait_for() { # WHAT CMD...: polls CMD for up to 30 s
	local what=$1
	shift
	for _ in $(seq 300); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	echo "supercluster: $what did not come up; see $dir/logs" >&2
	return 1
}

# Region r (0: a, 1: b): client, route and gateway ports.
client() { echo $((base + $1)); }
route() { echo $((base + 2 + $1)); }
gwport() { echo $((base + 4 + $1)); }
regions=(a b)
for r in 0 1; do
	name=${regions[r]}
	other=$((1 - r))
	mkdir -p "$dir/nats-$name"
	# A clustered JetStream needs a route: the region's only server is given
	# one to a port nothing listens on.
	cat >"$dir/nats-$name/server.conf" <<EOF
server_name: nats-$name
listen: 127.0.0.1:$(client $r)
jetstream { store_dir: "$dir/nats-$name/js", max_memory_store: 256MB, max_file_store: 1GB }
cluster { name: $name, listen: 127.0.0.1:$(route $r), routes: ["nats-route://127.0.0.1:$((base + 16))"] }
gateway {
  name: $name
  listen: 127.0.0.1:$(gwport $r)
  gateways: [{name: ${regions[other]}, urls: ["nats://127.0.0.1:$(gwport $other)"]}]
}
max_payload: 8454144
EOF
	start "nats-$name" "$ns" -c "$dir/nats-$name/server.conf"
done
export NATS_URL=nats://127.0.0.1:$(client 0)
wait_for "the JetStream of region a" "$sy" table init

# The table, made from region a so that JetStream places it there: the
# dev table, and a policy with the regions (the rest of it the defaults,
# which the dev table's policy also holds).
"$sy" table import "$root/deploy/examples/table.json" >/dev/null
echo '{"allow_anonymous": true, "dead_after": "3s", "regions": {"a": {"spill": ["b"]}, "b": {"spill": ["a"]}}}' |
	"$sy" table put policy - >/dev/null
# Region b's copy of the table, in b's cluster: b's broker and gateway read it.
"$sy" table copy b

port=$((base + 6))
for r in 0 1; do
	name=${regions[r]}
	url=nats://127.0.0.1:$(client $r)
	for i in 0 1; do
		id=l8-$name-$i
		start "engine-$id" "$sy" engine-sim --model llama-3-8b-instruct --listen 127.0.0.1:$port
		start "adapter-$id" "$sy" adapter --nats "$url" --region "$name" --replica "$id" --model llama-3-8b-instruct \
			--version v1.0.0 --engine http://127.0.0.1:$port
		port=$((port + 1))
	done
	start "broker-$name" "$sy" broker --nats "$url" --region "$name" --id "broker-$name" --metrics-listen 127.0.0.1:$((base + 14 + r)) \
		--state-dir "$dir/broker-$name"
	start "gateway-$name" "$sy" gateway --nats "$url" --region "$name" \
		--listen 127.0.0.1:$((base + 10 + r)) --admin-listen 127.0.0.1:$((base + 12 + r))
done
for r in 0 1; do
	g=http://127.0.0.1:$((base + 10 + r))
	wait_for "region ${regions[r]}'s gateway" curl -sf "$g/readyz"
	echo "region ${regions[r]}: gateway $g  admin http://127.0.0.1:$((base + 12 + r))/ui  broker metrics http://127.0.0.1:$((base + 14 + r))/metrics  nats nats://127.0.0.1:$(client $r)"
done
echo "logs: $dir/logs   (Ctrl-C stops everything)"
wait
