#!/usr/bin/env bash
# Loads the seckill HTTP service (examples/seckill_http.rs) with ApacheBench,
# once through each endpoint (the lock, the checkout semaphore, the atomic
# script), and checks each run for oversell against Redis.
#
#   examples/seckill_load.sh
#   CONCURRENCY=200 REQUESTS=5000 STOCK=2000 examples/seckill_load.sh
#
# Environment: CONCURRENCY (1000), REQUESTS (20000), STOCK (10000),
# WAIT_MS (1000: lock or permit wait before a 429), PERMITS (8: checkout
# permits of the semaphore endpoint), PORT (18080), ITEM (1), and the
# service's LINE, MAX_IN_LINE and SALE_THREADS (see docs/SECKILL.md),
# OUT_DIR (target/seckill-load: ab's full reports and the server log).
#
# It builds the example in release mode, installs `ab` (apache2-utils) with
# apt-get when run as root (otherwise says what to install), starts the
# service on 127.0.0.1 with a throwaway redis-server, and stops both on exit.
# Exit code: 0 when every check passed, 1 when one failed, 2 on a setup error.

set -euo pipefail

CONCURRENCY=${CONCURRENCY:-1000}
REQUESTS=${REQUESTS:-20000}
STOCK=${STOCK:-10000}
WAIT_MS=${WAIT_MS:-1000}
PERMITS=${PERMITS:-8}
PORT=${PORT:-18080}
ITEM=${ITEM:-1}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT_DIR=${OUT_DIR:-$ROOT/target/seckill-load}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BASE="http://127.0.0.1:$PORT"

die() {
    echo "seckill_load: $*" >&2
    exit 2
}

# --- tools -------------------------------------------------------------------
need() { # need COMMAND DEBIAN-PACKAGE
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing $2 (for $1) with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq || true
        apt-get install -y -qq --no-install-recommends "$2" >/dev/null
        command -v "$1" >/dev/null 2>&1 || die "$1 is still missing after installing $2"
    else
        die "$1 is missing: install it with  sudo apt-get install $2"
    fi
}
need ab apache2-utils
need curl curl
command -v cargo >/dev/null 2>&1 || die "cargo is missing: install the Rust toolchain (rustup)"

# --- limits --------------------------------------------------------------------
# ab and the service are separate processes, and each has its own open-file
# limit: ab holds CONCURRENCY client sockets, the service CONCURRENCY
# accepted sockets plus its Redis connections and its redis-server's. Both
# inherit this shell's limit, so raise the soft limit to the hard one and
# check it against one process's needs, not the sum.
FDS_NEEDED=$((CONCURRENCY + 512))
soft_before=$(ulimit -Sn)
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || true
soft_after=$(ulimit -Sn)
# Root may raise the hard limit itself (up to fs.nr_open).
if [ "$soft_after" != unlimited ] && [ "$soft_after" -lt "$FDS_NEEDED" ] && [ "$(id -u)" = 0 ] &&
    ulimit -Hn "$FDS_NEEDED" 2>/dev/null && ulimit -Sn "$FDS_NEEDED" 2>/dev/null; then
    soft_after=$(ulimit -Sn)
    echo "limits: raised the hard open-file limit to $soft_after (running as root)"
fi
if [ "$soft_after" != "$soft_before" ]; then
    echo "limits: raised the open-file limit of ab and the service from $soft_before to $soft_after each (the hard limit)"
fi
if [ "$soft_after" != unlimited ] && [ "$soft_after" -lt "$FDS_NEEDED" ]; then
    die "open-file limit $soft_after (hard $(ulimit -Hn)) is below the $FDS_NEEDED that ab and the service each need for CONCURRENCY=$CONCURRENCY; raise the hard limit (limits.conf, or ulimit -Hn as root) or lower CONCURRENCY"
fi
echo "limits: open files $soft_after per process (each of ab and the service needs about $FDS_NEEDED)"

# The service listens with a backlog of 65535, but the kernel caps every
# backlog at net.core.somaxconn. When CONCURRENCY clients connect at once,
# the connections beyond the accept queue have their SYN dropped and retry
# a whole second later. As root, raise the cap for the run and put it back
# on exit; otherwise say so (the run works, with 1 s stalls).
SOMAXCONN_FILE=/proc/sys/net/core/somaxconn
SYN_BACKLOG_FILE=/proc/sys/net/ipv4/tcp_max_syn_backlog
SOMAXCONN_WAS=""
SYN_BACKLOG_WAS=""
restore_sysctls() {
    [ -n "$SOMAXCONN_WAS" ] && echo "$SOMAXCONN_WAS" >"$SOMAXCONN_FILE" 2>/dev/null
    [ -n "$SYN_BACKLOG_WAS" ] && echo "$SYN_BACKLOG_WAS" >"$SYN_BACKLOG_FILE" 2>/dev/null
    true
}
if [ -r "$SOMAXCONN_FILE" ]; then
    somaxconn=$(cat "$SOMAXCONN_FILE")
    if [ "$somaxconn" -lt "$CONCURRENCY" ]; then
        if [ "$(id -u)" = 0 ] && echo "$CONCURRENCY" >"$SOMAXCONN_FILE" 2>/dev/null; then
            SOMAXCONN_WAS=$somaxconn
            echo "limits: raised net.core.somaxconn from $somaxconn to $CONCURRENCY for this run (restored on exit)"
        else
            echo "limits: net.core.somaxconn is $somaxconn < CONCURRENCY=$CONCURRENCY: connections beyond it wait for a 1 s SYN retry (raise it as root: sysctl -w net.core.somaxconn=$CONCURRENCY)"
        fi
    fi
fi
if [ -r "$SYN_BACKLOG_FILE" ]; then
    syn_backlog=$(cat "$SYN_BACKLOG_FILE")
    if [ "$syn_backlog" -lt "$CONCURRENCY" ] && [ "$(id -u)" = 0 ] &&
        echo "$CONCURRENCY" >"$SYN_BACKLOG_FILE" 2>/dev/null; then
        SYN_BACKLOG_WAS=$syn_backlog
        echo "limits: raised net.ipv4.tcp_max_syn_backlog from $syn_backlog to $CONCURRENCY for this run (restored on exit)"
    fi
fi
trap restore_sysctls EXIT

# --- build and start -----------------------------------------------------------
echo "building: cargo build --release -p fairlock-examples --example seckill_http"
cargo build --release -q -p fairlock-examples --example seckill_http
BIN="$TARGET_DIR/release/examples/seckill_http"
[ -x "$BIN" ] || die "no binary at $BIN"

mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/server.log"
# REDIS_URL is left unset on purpose: the service starts its own redis-server.
env -u REDIS_URL PORT="$PORT" STOCK="$STOCK" WAIT_MS="$WAIT_MS" PERMITS="$PERMITS" ITEMS="$ITEM" \
    "$BIN" >"$LOG" 2>&1 &
SERVER=$!
cleanup() {
    restore_sysctls
    if kill -0 "$SERVER" 2>/dev/null; then
        kill -TERM "$SERVER" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$SERVER" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER" 2>/dev/null || true
    fi
    wait "$SERVER" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 100); do
    curl -sf "$BASE/stats" >/dev/null 2>&1 && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$LOG" >&2; die "the service exited during startup"; }
    sleep 0.2
done
curl -sf "$BASE/stats" >/dev/null || { cat "$LOG" >&2; die "the service did not answer on $BASE within 20 s"; }
REDIS_URL=$(sed -n 's/^redis: //p' "$LOG" | head -n 1)
echo "service: $BASE   redis: $REDIS_URL   (log: $LOG)"

# --- helpers -------------------------------------------------------------------
# count JSON CODE VARIANT: one status code's count for one way, from /stats.
count() {
    local obj
    obj=$(printf '%s' "$1" | grep -o "\"$3\":{[^}]*}")
    printf '%s' "$obj" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"
}

# max_in_checkout JSON: the most buyers in the item's checkout at once, from
# /stats ("checkout":{"permits":N,"max_in_checkout":{"<item>":M}}).
max_in_checkout() {
    printf '%s' "$1" | grep -o '"max_in_checkout":{[^}]*}' |
        sed -n "s/.*\"$ITEM\":\([0-9]*\).*/\1/p"
}

# redis_read KEY-KIND VARIANT: the stock or the order count, read from Redis
# itself (redis-cli), or through GET /stock when redis-cli is missing.
redis_read() {
    local key="seckill:{$2:$ITEM}"
    if command -v redis-cli >/dev/null 2>&1 && [ -n "$REDIS_URL" ]; then
        case $1 in
            stock) redis-cli -u "$REDIS_URL" --raw GET "$key:stock" ;;
            orders) redis-cli -u "$REDIS_URL" --raw HLEN "$key:orders" ;;
        esac
    else
        curl -sf "$BASE/stock/$ITEM" | grep -o "\"$2\":{[^}]*}" | sed -n "s/.*\"$1\":\(-\{0,1\}[0-9]*\).*/\1/p"
    fi
}

# Machine-wide count of connections dropped because an accept queue was
# full; each one costs its client a SYN retransmit, a whole second later.
# redis_cpu: Redis's own CPU seconds so far (user + system, INFO cpu), or
# nothing without redis-cli.
redis_cpu() {
    command -v redis-cli >/dev/null 2>&1 && [ -n "$REDIS_URL" ] || return 0
    redis-cli -u "$REDIS_URL" INFO cpu | tr -d '\r' |
        awk -F: '$1 == "used_cpu_user" || $1 == "used_cpu_sys" { s += $2 } END { printf "%.2f", s }'
}

# redis_calls: commands Redis has run so far (INFO commandstats, summed;
# Redis 7 counts the commands inside scripts too), or nothing without
# redis-cli.
redis_calls() {
    command -v redis-cli >/dev/null 2>&1 && [ -n "$REDIS_URL" ] || return 0
    redis-cli -u "$REDIS_URL" INFO commandstats | tr -d '\r' |
        sed -n 's/.*:calls=\([0-9]*\),.*/\1/p' | awk '{ s += $1 } END { print s + 0 }'
}

listen_overflows() {
    awk '$1 == "TcpExt:" { if (!seen) { for (i = 2; i <= NF; i++) name[i] = $i; seen = 1 }
        else { for (i = 2; i <= NF; i++) if (name[i] == "ListenOverflows") print $i } }' \
        /proc/net/netstat 2>/dev/null || true
}

FAILED=0
check() { # check DESCRIPTION TEST...
    local what=$1
    shift
    if "$@"; then
        echo "  [ ok ] $what"
    else
        echo "  [FAIL] $what"
        FAILED=1
    fi
}

# --- load ----------------------------------------------------------------------
load() { # load VARIANT PATH
    local variant=$1 path=$2 report="$OUT_DIR/ab-$1.txt"
    echo
    echo "== $variant: ab -l -r -s 60 -c $CONCURRENCY -n $REQUESTS -p /dev/null $BASE$path/$ITEM"
    local before after overflows cpu_before cpu_after calls_before calls_after
    before=$(curl -sf "$BASE/stats")
    overflows=$(listen_overflows)
    cpu_before=$(redis_cpu)
    calls_before=$(redis_calls)
    if ! ab -l -r -s 60 -c "$CONCURRENCY" -n "$REQUESTS" -p /dev/null -T application/json \
        "$BASE$path/$ITEM" >"$report" 2>&1; then
        cat "$report" >&2
        die "ab failed (full report: $report)"
    fi
    after=$(curl -sf "$BASE/stats")
    cpu_after=$(redis_cpu)
    calls_after=$(redis_calls)
    overflows=$(($(listen_overflows) - ${overflows:-0}))

    grep -E '^(Complete requests|Failed requests|Requests per second|Time taken for tests):' "$report" | sed 's/^/  /'
    printf '  latency (ms):'
    for p in 50 90 99 100; do
        printf ' p%s %s ' "$p" "$(awk -v p="$p%" '$1 == p { print $2 }' "$report")"
    done
    echo
    if [ -n "$cpu_before" ] && [ -n "$cpu_after" ]; then
        echo "  redis CPU during the run (INFO cpu, user+sys): $(awk -v a="$cpu_after" -v b="$cpu_before" 'BEGIN { printf "%.2f", a - b }') s"
    fi
    if [ -n "$calls_before" ] && [ -n "$calls_after" ]; then
        echo "  redis commands during the run (INFO commandstats, with those inside scripts): $((calls_after - calls_before)), $(awk -v a="$calls_after" -v b="$calls_before" -v n="$REQUESTS" 'BEGIN { printf "%.2f", (a - b) / n }') per request"
    fi
    echo "  accept-queue overflows (machine-wide; each one is a 1 s SYN retry): $overflows"

    local code n total=0 line="  answers:"
    declare -A got
    for code in 200 400 404 410 429 500 503 other; do
        n=$(($(count "$after" "$code" "$variant") - $(count "$before" "$code" "$variant")))
        got[$code]=$n
        total=$((total + n))
        [ "$n" -gt 0 ] && line="$line $code=$n"
    done
    echo "$line"
    # The service's own answer times (handler start to answer), beside
    # ab's (which start at connect, so they include the accept queue).
    curl -sf "$BASE/answer-times/$variant" | sed 's/^/  service time (ms), status /'
    printf '%s' "$after" | grep -o "\"$variant:$ITEM\":{[^}]*}" | sed 's/^/  line: /'  || true

    local stock orders
    stock=$(redis_read stock "$variant")
    orders=$(redis_read orders "$variant")
    echo "  redis: stock $stock (of $STOCK), orders $orders"
    check "every request answered and counted ($total of $REQUESTS)" [ "$total" -eq "$REQUESTS" ]
    check "stock never negative ($stock >= 0)" [ "$stock" -ge 0 ]
    check "orders in Redis = 200 answers ($orders = ${got[200]})" [ "$orders" -eq "${got[200]}" ]
    check "sold <= stock, nothing lost: stock left + orders = initial ($stock + $orders = $STOCK)" \
        [ $((stock + orders)) -eq "$STOCK" ]
    if [ "$stock" -gt 0 ]; then
        check "no 410 while stock was left (${got[410]} = 0)" [ "${got[410]}" -eq 0 ]
    fi
    check "no server errors (500=${got[500]} 503=${got[503]} other=${got[other]})" \
        [ $((got[500] + got[503] + got[other])) -eq 0 ]
    if [ "$variant" = semaphore ]; then
        local most
        most=$(max_in_checkout "$after")
        echo "  in checkout at once (this process): at most ${most:-?} of $PERMITS permits"
        check "never more buyers in checkout than permits (${most:-?} <= $PERMITS)" \
            [ "${most:-999999999}" -le "$PERMITS" ]
    fi
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(redis-server --version 2>/dev/null | awk '{ print $3 }')"
load lock /seckill
load semaphore /seckill-semaphore
load atomic /seckill-atomic

echo
if [ "$FAILED" = 0 ]; then
    echo "all checks passed"
else
    echo "SOME CHECKS FAILED"
    exit 1
fi
