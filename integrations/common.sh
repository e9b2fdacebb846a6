# shellcheck shell=bash
# Shared helpers for the integrations/ scripts. Source it; it defines functions and
# variables only and works under `set -euo pipefail`.
#
#   DISTENV_LAUNCHERS_DIR  where PyPI-packaged launchers get their own venvs
#                          (default /opt/distenv-launchers)
#   DISTENV_RUN_DIR        state, pid files and logs of daemons we start
#                          (default /tmp/distenv-run)
#   DISTENV_PYTHON         python used to create those venvs (default: python3 on PATH)

: "${DISTENV_LAUNCHERS_DIR:=/opt/distenv-launchers}"
: "${DISTENV_RUN_DIR:=/tmp/distenv-run}"
: "${DISTENV_PYTHON:=python3}"
export DISTENV_LAUNCHERS_DIR DISTENV_RUN_DIR

DISTENV_INTEGRATIONS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DISTENV_REPO_DIR="$(cd "$DISTENV_INTEGRATIONS_DIR/.." && pwd)"
export DISTENV_INTEGRATIONS_DIR DISTENV_REPO_DIR

log() { printf '[distenv] %s\n' "$*" >&2; }
die() { printf '[distenv] error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# pkg_installed PKG: true when dpkg reports PKG as fully installed.
pkg_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

# apt_install PKG...: installs the missing ones. A no-op when all are installed; runs
# `apt-get update` at most once per machine boot-ish (marker in /var/lib/apt/lists,
# which only exists after an update), so repeated calls stay fast.
apt_install() {
    local missing=() p
    for p in "$@"; do pkg_installed "$p" || missing+=("$p"); done
    if [ "${#missing[@]}" -eq 0 ]; then
        log "already installed: $*"
        return 0
    fi
    local marker=/var/lib/apt/lists/.distenv-apt-updated
    if [ ! -e "$marker" ]; then
        log "apt-get update"
        as_root apt-get update -qq
        as_root touch "$marker"
    fi
    log "apt-get install ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# venv_want SPEC...: what .distenv-installed records for SPEC under today's pins.
venv_want() {
    printf '%s pins=%s' "$*" "$(cat "$DISTENV_INTEGRATIONS_DIR"/frameworks/constraints*.txt | sha1sum | cut -c1-12)"
}

# venv_pip_install VENV_DIR SPEC...: creates VENV_DIR (if needed) and pip-installs SPEC
# into it. A no-op when VENV_DIR/.distenv-installed records the same SPECs and the same
# pins (integrations/frameworks/constraints*.txt): a moved pin reinstalls.
venv_pip_install() {
    local venv="$1"; shift
    local want
    want=$(venv_want "$@")
    if [ -f "$venv/.distenv-installed" ] && [ "$(cat "$venv/.distenv-installed")" = "$want" ]; then
        log "already installed: $want in $venv"
        return 0
    fi
    if [ ! -x "$venv/bin/pip" ]; then
        log "creating venv $venv"
        mkdir -p "$(dirname "$venv")"
        if ! "$DISTENV_PYTHON" -m venv --clear "$venv" >/dev/null 2>&1; then
            # Debian's own python3 needs python3-venv for ensurepip.
            apt_install python3-venv
            "$DISTENV_PYTHON" -m venv --clear "$venv"
        fi
    fi
    log "pip install $want into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"
    printf '%s' "$want" > "$venv/.distenv-installed"
}

# timed NAME CMD...: runs CMD and prints how long it took.
timed() {
    local name="$1"; shift
    local t0 t1
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    log "$name took $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s"
}

# Variables that let Open MPI (4 and 5) run as root and oversubscribe without flags.
openmpi_root_env() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# pid_alive PIDFILE: true when the pid file names a live process.
pid_alive() {
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

# kill_pidfile PIDFILE [NAME]: TERM the process, wait up to 5 s, then KILL; removes the file.
kill_pidfile() {
    local f="$1" name="${2:-$1}" pid
    [ -s "$f" ] || { rm -f "$f"; return 0; }
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            log "$name ($pid) ignored TERM; sending KILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$f"
}
