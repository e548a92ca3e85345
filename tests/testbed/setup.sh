#!/bin/sh
# The system packages the test bed, the demo and the tests need on a fresh Debian 12 machine (run
# as root; idempotent; scripts/setup.sh runs it). orch itself needs none of them on a controller.
#
# Each group is printed with why it is needed. apt's own output goes to a log file, named on the
# terminal; the packages this script asked apt for are recorded beside it (`installed-packages`),
# so `bash scripts/demo.sh down` can name them. Installing podman enables systemd units of its own
# (its API socket, auto-update timer, restart service): the test bed starts each container itself
# and needs none of them, so the ones the install enabled are disabled again, and named.
#
# ORCH_SETUP_DIR: where the log and the record go (default: .setup/ of this checkout, git-ignored).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${ORCH_SETUP_DIR:-$ROOT/.setup}
LOG=$DIR/apt.log
RECORD=$DIR/installed-packages

# one group a line: packages | why
GROUPS_TEXT='openssh-server openssh-client openssh-sftp-server|each test-bed host runs its own sshd (with SFTP)
iproute2 util-linux|the hosts'"'"' network namespaces (ip netns, unshare, nsenter)
psmisc lsof procps|fuser, lsof and ps: how orch finds leftover GPU processes
sudo passwd|the bed'"'"'s non-root login orchop uses sudo inside the hosts
curl|tests ask the stand-in server over HTTP from inside a host
numactl|a unit started under numactl (a launch form orch reads)
podman crun fuse-overlayfs|container hosts run the stand-in in a podman container
chromium|a test opens the HTML report in it (about 115 MB)'

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=""
echo "$GROUPS_TEXT" | while IFS='|' read -r pkgs why; do
    absent=""
    for p in $pkgs; do installed "$p" || absent="$absent $p"; done
    if [ -n "$absent" ]; then state="to install:$absent"; else state="present"; fi
    echo "$pkgs ($state)"
    echo "  $why"
done
for p in $(echo "$GROUPS_TEXT" | cut -d'|' -f1); do
    installed "$p" || missing="$missing $p"
done

if [ -n "$missing" ]; then
    mkdir -p "$DIR"
    case " $missing " in *" podman "*) new_podman=1 ;; *) new_podman=0 ;; esac
    echo "installing with apt-get:$missing"
    echo "  (apt's output: $LOG)"
    export DEBIAN_FRONTEND=noninteractive
    {
        apt-get update -q
        # the bed runs its own sshd per host; the package's own service is not needed
        apt-get install -y -q --no-install-recommends $missing
    } >>"$LOG" 2>&1 || { echo "setup.sh: apt-get failed; the last lines of $LOG:" >&2; tail -n 15 "$LOG" >&2; exit 1; }
    for p in $missing; do echo "$p"; done >>"$RECORD"
    n=$(grep -Eo '^[0-9]+ newly installed' "$LOG" | tail -n 1 | cut -d' ' -f1)
    got=$(grep -Eo '^Need to get [^ ]+ [^ ]+' "$LOG" | tail -n 1 | cut -d' ' -f4-)
    disk=$(grep -Eo 'After this operation, [^ ]+ [^ ]+' "$LOG" | tail -n 1 | cut -d' ' -f4-)
    echo "installed:$missing"
    echo "  ${n:-?} packages with their dependencies,"
    echo "  downloaded: ${got:-0 B}; on disk: ${disk:-0 B}"
    echo "  (recorded in $RECORD for demo.sh down)"
    if [ "$new_podman" = 1 ]; then
        enabled=""
        for unit in $(dpkg-query -L podman 2>/dev/null | grep -E '^/(usr/)?lib/systemd/system/[^@/]+\.(service|socket|timer)$' \
                      | xargs -r -n1 basename); do
            [ "$(systemctl is-enabled "$unit" 2>/dev/null)" = enabled ] && enabled="$enabled $unit"
        done
        if [ -n "$enabled" ]; then
            if [ -d /run/systemd/system ]; then now="--now"; else now=""; fi  # stopped too where systemd runs
            systemctl disable $now $enabled >>"$LOG" 2>&1
            echo "podman's package enabled$enabled:"
            echo "  disabled again (the test bed starts its containers itself)"
        fi
    fi
fi

# checks: the bed needs these to work
for tool in ip unshare nsenter ssh ssh-keygen fuser lsof curl sudo visudo useradd chpasswd podman; do
    command -v "$tool" >/dev/null || { echo "setup.sh: $tool missing after install" >&2; exit 1; }
done
test -x /usr/sbin/sshd || { echo "setup.sh: /usr/sbin/sshd missing" >&2; exit 1; }
test -x /usr/lib/openssh/sftp-server || { echo "setup.sh: sftp-server missing" >&2; exit 1; }
ip netns list >/dev/null || { echo "setup.sh: 'ip netns' does not work here" >&2; exit 1; }
echo "test bed prerequisites present"
