#!/usr/bin/env bash
# How far a small psum over gRPC is from a bare gRPC round trip, over several
# runs: each run is one collectived_perf invocation timing psum (daemon path:
# --member-op-bytes=0), grpc_echo and grpc_rendezvous on one private daemon,
# one after another (bench/README.md, "The gRPC path").
#
#   bench/grpc_ratio.sh [--runs N] [--members 2,4] [--iters N] [--bytes SIZE]
#                       [--perf PATH] [--perf-args "ARGS"]
#
# --perf-args: more collectived_perf flags (e.g. "--spin-us=0"). Prints one
# line per run (the three medians in µs and their ratios), then per
# member count the median and range of each ratio over the runs and how many
# runs had psum <= 1.3x grpc_echo. Exit status 0 when every run finished
# (whatever the ratios), 1 otherwise.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=9
members=2,4
iters=2000
bytes=8
perf="$here/build/bench/collectived_perf"
perf_args=""
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --members) members="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --perf) perf="$2"; shift 2 ;;
    --perf-args) perf_args="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "grpc_ratio.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ! -x "$perf" ]; then
  echo "grpc_ratio.sh: $perf is not built (ninja -C build collectived_perf)" >&2
  exit 2
fi

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
status=0
echo "# members run  psum_us  echo_us  rendezvous_us  psum/echo  rendezvous/echo  psum/rendezvous"
for m in ${members//,/ }; do
  for ((i = 1; i <= runs; i++)); do
    # One line per op: its name and its median time.
    got=$("$perf" --path grpc --daemon-args=--member-op-bytes=0 \
        --op psum,grpc_echo,grpc_rendezvous --iters "$iters" \
        --min-bytes "$bytes" --max-bytes "$bytes" --members "$m" $perf_args 2>&1 |
      awk '/^# collectived_perf: op /{op=$4; sub(",", "", op)}
           /^ +[0-9]/{print op, $4}')
    line=$(awk -v m="$m" -v i="$i" '
      {t[$1]=$2}
      END {
        if (!("psum" in t) || !("grpc_echo" in t) || !("grpc_rendezvous" in t)) exit 1
        printf "%9d %3d %8.1f %8.1f %14.1f %10.2f %16.2f %16.2f\n", m, i, t["psum"],
          t["grpc_echo"], t["grpc_rendezvous"], t["psum"]/t["grpc_echo"],
          t["grpc_rendezvous"]/t["grpc_echo"], t["psum"]/t["grpc_rendezvous"]
      }' <<<"$got")
    if [ -z "$line" ]; then
      echo "# members $m run $i: collectived_perf gave no row for every op" >&2
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
