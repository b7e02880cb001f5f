#!/usr/bin/env bash
# How far a small psum over gRPC is from a bare gRPC round trip, over several
# runs: each run is one collectived_perf invocation timing psum (daemon path:
# --member-op-bytes=0), grpc_echo and grpc_rendezvous on one private daemon,
# one after another (bench/README.md, "The gRPC path").
#
#   bench/grpc_ratio.sh [--runs N] [--members 2,4] [--iters N] [--bytes SIZE]
#                       [--spin-us N] [--daemon-args "FLAGS"] [--perf PATH]
#
# --spin-us: how long the members' SDK polls before sleeping (collectived_perf
# --spin-us; default: the SDK's). --daemon-args: more daemon flags, space
# separated (--member-op-bytes=0 is always passed). Prints one line per run
# (the three medians in µs and their ratios), then per member count the
# median and range of each ratio over the runs and how many runs had psum <=
# 1.3x grpc_echo. A run that fails is named with the tail of its output.
# Exit status 0 when every run finished (whatever the ratios), 1 otherwise,
# 2 for bad arguments.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=9
members=2,4
iters=2000
bytes=8
spin=""
daemon_args=""
perf="$here/build/bench/collectived_perf"
usage() { sed -n '2,17p' "$0"; }
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --runs|--members|--iters|--bytes|--spin-us|--daemon-args|--perf)
      if (($# < 2)); then
        echo "grpc_ratio.sh: $1 needs a value (see --help)" >&2
        exit 2
      fi ;;&
    --runs) runs="$2"; shift 2 ;;
    --members) members="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --spin-us) spin="$2"; shift 2 ;;
    --daemon-args) daemon_args="$2"; shift 2 ;;
    --perf) perf="$2"; shift 2 ;;
    *) echo "grpc_ratio.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ! -x "$perf" ]; then
  echo "grpc_ratio.sh: $perf is not built (ninja -C build collectived_perf)" >&2
  exit 2
fi
args=(--path grpc "--daemon-args=--member-op-bytes=0 $daemon_args"
      --op psum,grpc_echo,grpc_rendezvous --iters "$iters" --min-bytes "$bytes"
      --max-bytes "$bytes")
[ -n "$spin" ] && args+=("--spin-us=$spin")

rows=$(mktemp)
log=$(mktemp)
trap 'rm -f "$rows" "$log"' EXIT
status=0
echo "# members run  psum_us  echo_us  rendezvous_us  psum/echo  rendezvous/echo  psum/rendezvous"
for m in ${members//,/ }; do
  for ((i = 1; i <= runs; i++)); do
    "$perf" "${args[@]}" --members "$m" >"$log" 2>&1
    rc=$?
    # One line per op: its name and its median time.
    line=$(awk -v m="$m" -v i="$i" '
      /^# collectived_perf: op /{op=$4; sub(",", "", op)}
      /^ +[0-9]/{t[op]=$4}
      END {
        if (!("psum" in t) || !("grpc_echo" in t) || !("grpc_rendezvous" in t)) exit 1
        printf "%9d %3d %8.1f %8.1f %14.1f %10.2f %16.2f %16.2f\n", m, i, t["psum"],
          t["grpc_echo"], t["grpc_rendezvous"], t["psum"]/t["grpc_echo"],
          t["grpc_rendezvous"]/t["grpc_echo"], t["psum"]/t["grpc_rendezvous"]
      }' "$log")
    if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
      echo "# members $m run $i: collectived_perf exited $rc$([ -z "$line" ] && echo ", with no row for every op"); its last lines:" >&2
      tail -n 5 "$log" | sed 's/^/#   /' >&2
      status=1
      continue
    fi
    echo "$line"
    echo "$line" >>"$rows"
  done
done

echo
echo "# members  ratio             median  (min - max)   runs"
for m in ${members//,/ }; do
  for col in 6 7 8; do
    awk -v m="$m" -v c="$col" '$1 == m {print $c}' "$rows" | sort -g | awk -v m="$m" -v c="$col" '
      {v[NR]=$1}
      END {
        if (NR == 0) exit
        name = (c == 6) ? "psum/echo" : (c == 7) ? "rendezvous/echo" : "psum/rendezvous"
        med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%9d  %-16s %6.2f  (%.2f - %.2f)   %d\n", m, name, med, v[1], v[NR], NR
      }'
  done
  awk -v m="$m" '$1 == m {n++; if ($6 <= 1.3) ok++}
    END {if (n) printf "%9d  psum <= 1.3x echo in %d of %d runs\n", m, ok, n}' "$rows"
done
exit "$status"
