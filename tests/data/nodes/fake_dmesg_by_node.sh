#!/bin/sh
# A fake `dmesg` (no kernel here logs Xid errors), put first on the jobs' PATH as `dmesg` by a symlink. The loopback
# "nodes" are one machine reached at 127.0.0.1 and 127.0.0.2, so it tells them apart by the server address sshd puts
# in SSH_CONNECTION ("client_ip client_port server_ip server_port"): at 127.0.0.2 it prints the kernel log of a GPU
# that fell off the bus (Xid 79), anywhere else the same log without those lines. Under SLURM (the "nodes" are one
# machine too) the sick node is the one whose SLURMD_NODENAME is $FAKE_XID_SLURM_NODE.
here=$(dirname "$(readlink -f "$0")")
set -- $SSH_CONNECTION
if [ "${3:-}" = 127.0.0.2 ] || { [ -n "${SLURMD_NODENAME:-}" ] && [ "$SLURMD_NODENAME" = "${FAKE_XID_SLURM_NODE:-}" ]; }; then
  cat "$here/fake_dmesg_xid79.txt"
else
  grep -v -e 'Xid' -e 'fallen off the bus' "$here/fake_dmesg_xid79.txt"
fi
