#!/usr/bin/env bash
# Install Debian's Grid Engine (gridengine-master, -exec, -client) for the sge test fixture
# (tests/cluster/sge.py). Idempotent; quiet unless it installs or fails. Run as root by scripts/test.sh.
#
# - debconf is preseeded (configure a cell "default" with this host as master), so the packages'
#   postinst creates the cell in /var/lib/gridengine and the spool in /var/spool/gridengine;
# - no daemon is left running: the fixture starts sge_qmaster and sge_execd itself. A policy-rc.d
#   that denies starts is put in place for the install (unless one exists), and any
#   sge_qmaster/sge_execd running afterwards (an init system that started them anyway) is stopped.
# Not root: says what is missing and exits 0 (the fixture then fails with the reason).
set -euo pipefail

PACKAGES=(gridengine-master gridengine-exec gridengine-client)
SGE_ROOT=/var/lib/gridengine
SGE_CELL=default

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
cell_ok=true
[ -f "$SGE_ROOT/$SGE_CELL/common/bootstrap" ] && [ -e /var/spool/gridengine/spooldb/sge ] || cell_ok=false

if [ ${#missing[@]} -eq 0 ] && $cell_ok; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    if [ ${#missing[@]} -gt 0 ]; then
        echo "[install-gridengine] not root: not installing ${missing[*]} (the Grid Engine tests will fail)"
    else
        echo "[install-gridengine] not root: cannot create the Grid Engine cell $SGE_ROOT/$SGE_CELL"
    fi
    exit 0
fi

log=$(mktemp)
added_policy=false
cleanup() {
    rm -f "$log"
    if $added_policy; then rm -f /usr/sbin/policy-rc.d; fi
}
trap cleanup EXIT
fail() {
    echo "[install-gridengine] $1; its output:" >&2
    cat "$log" >&2
    exit 1
}

host=$(hostname)
for pkg in gridengine-common "${PACKAGES[@]}"; do
    printf '%s shared/gridengineconfig boolean true\n' "$pkg"
    printf '%s shared/gridenginecell string %s\n' "$pkg" "$SGE_CELL"
    printf '%s shared/gridenginemaster string %s\n' "$pkg" "$host"
done | debconf-set-selections

marker="added by launchkit scripts/install-gridengine.sh"
if grep -qs "$marker" /usr/sbin/policy-rc.d; then
    added_policy=true # left by an install that was killed: ours to remove
elif [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# %s, for the install only\nexit 101\n' "$marker" >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    added_policy=true
fi

if [ ${#missing[@]} -gt 0 ]; then
    echo "[install-gridengine] installing ${missing[*]}"
    apt-get update -qq >"$log" 2>&1 || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${missing[@]}" >>"$log" 2>&1 || fail "apt-get install ${missing[*]} failed"
fi

if ! [ -f "$SGE_ROOT/$SGE_CELL/common/bootstrap" ] || ! [ -e /var/spool/gridengine/spooldb/sge ]; then
    # Installed earlier without a cell (debconf said no, or the spool was removed): what the
    # postinst scripts of gridengine-common and gridengine-master do on a first install.
    echo "[install-gridengine] creating the Grid Engine cell $SGE_ROOT/$SGE_CELL"
    for d in "$SGE_ROOT" "$SGE_ROOT/$SGE_CELL" "$SGE_ROOT/$SGE_CELL/common" /var/spool/gridengine/qmaster \
        /var/spool/gridengine/qmaster/job_scripts /var/spool/gridengine/spooldb /var/spool/gridengine/execd; do
        install -d -o sgeadmin -g sgeadmin -m 755 "$d"
    done
    install -m 644 -o sgeadmin -g sgeadmin /usr/share/gridengine/default-bootstrap \
        "$SGE_ROOT/$SGE_CELL/common/bootstrap"
    su -s /bin/sh -c "/usr/share/gridengine/scripts/init_cluster $SGE_ROOT $SGE_CELL \
        /var/spool/gridengine/spooldb sgeadmin" sgeadmin >>"$log" 2>&1 || fail "init_cluster failed"
    [ -s "$SGE_ROOT/$SGE_CELL/common/act_qmaster" ] || echo "$host" >"$SGE_ROOT/$SGE_CELL/common/act_qmaster"
fi

# Leave no daemon running (a postinst may have started them where no policy-rc.d stopped it).
daemon_pids() { # live sge_qmaster/sge_execd processes (zombies left out)
    { ps -C sge_qmaster,sge_execd -o pid=,stat= || true; } | awk '$2 !~ /^Z/ {print $1}'
}
pids=$(daemon_pids)
if [ -n "$pids" ]; then
    echo "[install-gridengine] stopping the Grid Engine daemons the install started"
    # shellcheck disable=SC2086 # word splitting wanted
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 150); do # qmaster takes about 6 s to shut down
        [ -n "$(daemon_pids)" ] || break
        sleep 0.1
    done
    pids=$(daemon_pids)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
fi
