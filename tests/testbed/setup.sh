#!/bin/sh
# Install what the orch test bed needs on a fresh Debian 12 machine (run as root; idempotent).
# Used by .ci/run. The Python side (docker-systemctl-replacement, paramiko, pyyaml, ...) comes
# from the project's venv: pip install -e '.[test]'.
set -eu
# sudo: the bed's non-root login (orchop) uses it inside the hosts (`become`)
# numactl: units started under `numactl --cpunodebind=0 --membind=0` (launch forms, issue 19)
PKGS="openssh-server openssh-client openssh-sftp-server iproute2 util-linux psmisc lsof procps curl sudo passwd numactl"
# podman: container hosts (issue 19) run the stand-in in a real container (crun, vfs storage)
PKGS="$PKGS podman crun fuse-overlayfs"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # the bed runs its own sshd per host; the package's own service is not needed
    apt-get install -y -q --no-install-recommends $missing
fi
# checks: the bed needs these to work
for tool in ip unshare nsenter ssh ssh-keygen fuser lsof curl sudo visudo useradd chpasswd podman; do
    command -v "$tool" >/dev/null || { echo "setup.sh: $tool missing after install" >&2; exit 1; }
done
test -x /usr/sbin/sshd || { echo "setup.sh: /usr/sbin/sshd missing" >&2; exit 1; }
test -x /usr/lib/openssh/sftp-server || { echo "setup.sh: sftp-server missing" >&2; exit 1; }
ip netns list >/dev/null || { echo "setup.sh: 'ip netns' does not work here" >&2; exit 1; }
echo "test bed prerequisites present"
