# Hosts made of network namespaces, for the multi-host tests (source it; bash).
#
#   hosts_up DIR N      creates N hosts joined by a veth bridge-less star (host 0 is the hub
#                       only in name: every host has one veth to a switch namespace), each
#                       with its own network namespace, its own UTS namespace (hostname
#                       dsa-h<i>), the private address 10.<net>.0.<i+1>/24 on its interface
#                       eth1, loopback up, and an sshd on port 22 that accepts a throwaway key;
#                       DIR/bin/ssh is an ssh that uses that key; DIR/hostfile lists the hosts
#                       with 2 slots each. Nothing leaves the namespaces the fixture made.
#   on_host I CMD...    runs CMD on host I (its network and UTS namespaces).
#   host_addr I         the address of host I.
#   cut_host I          takes host I's link down (the cable pulled); uncut_host I puts it back.
#   kill_host I         kill -9 of every process of host I, its sshd included (the machine
#                       died: it no longer answers ssh); revive_host I starts its sshd again.
#   hosts_down          removes everything hosts_up made (call it from an EXIT trap; safe
#                       to call twice, and after a partial hosts_up).
#   hosts_skip_reason   prints why hosts cannot be made here (empty: they can).
#
# UCX is forced onto TCP (UCX_TLS=tcp): namespaces share IPC and PIDs, so UCX would
# otherwise take shared memory between the "hosts". UCX_NET_DEVICES is left to the ranks,
# which name the interface that routes to the rendezvous (eth1 here).

hosts_prefix="dsa$$"
hosts_net=$(( ($$ % 200) + 20 ))
hosts_count=0
hosts_dir=

hosts_skip_reason() {
  if [[ $(id -u) -ne 0 ]]; then echo "not root (network namespaces need CAP_NET_ADMIN)"; return; fi
  for tool in ip unshare nsenter ssh-keygen; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed"; return; }
  done
  [[ -x /usr/sbin/sshd ]] || { echo "sshd is not installed (Debian: openssh-server)"; return; }
  if ! ip netns add "${hosts_prefix}probe" 2>/dev/null; then
    echo "cannot create network namespaces here (no CAP_NET_ADMIN?)"
    return
  fi
  ip netns del "${hosts_prefix}probe"
}

host_addr() { echo "10.$hosts_net.0.$(( $1 + 1 ))"; }

# The sshd of host I's pid: its namespaces are the host's.
host_pid() { cat "$hosts_dir/sshd$1.pid"; }

on_host() {
  local i=$1; shift
  nsenter --target "$(host_pid "$i")" --net --uts --mount -- "$@"
}

cut_host() { ip -n "${hosts_prefix}h$1" link set eth1 down; }
uncut_host() { ip -n "${hosts_prefix}h$1" link set eth1 up; }
kill_host() {
  ip netns pids "${hosts_prefix}h$1" | xargs -r kill -9 2>/dev/null || true # one may end first
  rm -f "$hosts_dir/sshd$1.pid"
}
revive_host() { start_sshd "$1"; }

# Host I's sshd, in its own UTS namespace (the ranks must see another hostname there).
start_sshd() {
  local i=$1
  ip netns exec "${hosts_prefix}h$i" unshare --uts sh -c "hostname dsa-h$i && exec /usr/sbin/sshd -f '$hosts_dir/sshd$i.conf'"
  local tries=0
  until [[ -s $hosts_dir/sshd$i.pid ]] && on_host "$i" true 2>/dev/null; do
    (( ++tries > 100 )) && { echo "sshd of host $i did not start" >&2; return 1; }
    sleep 0.05
  done
}

hosts_up() {
  hosts_dir=$1
  local n=$2
  mkdir -p "$hosts_dir/bin" /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "$hosts_dir/key" </dev/null
  ssh-keygen -q -t ed25519 -N '' -f "$hosts_dir/hostkey" </dev/null
  cp "$hosts_dir/key.pub" "$hosts_dir/authorized_keys"
  chmod 600 "$hosts_dir/authorized_keys"
  cat > "$hosts_dir/bin/ssh" <<SH
#!/bin/sh
exec /usr/bin/ssh -i "$hosts_dir/key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \\
  -o LogLevel=ERROR -o ConnectTimeout=10 "\$@"
SH
  chmod +x "$hosts_dir/bin/ssh"
  # The switch: one namespace with a bridge, each host's veth plugged into it.
  ip netns add "${hosts_prefix}sw"
  ip -n "${hosts_prefix}sw" link add br0 type bridge
  ip -n "${hosts_prefix}sw" link set br0 up
  : > "$hosts_dir/hostfile"
  local i
  for ((i = 0; i < n; i++)); do
    local ns="${hosts_prefix}h$i"
    ip netns add "$ns"
    hosts_count=$(( i + 1 ))
    ip link add "${hosts_prefix}a$i" type veth peer name "${hosts_prefix}b$i"
    ip link set "${hosts_prefix}a$i" netns "$ns"
    ip link set "${hosts_prefix}b$i" netns "${hosts_prefix}sw"
    ip -n "$ns" link set "${hosts_prefix}a$i" name eth1
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth1
    ip -n "$ns" link set eth1 up
    ip -n "$ns" link set lo up
    ip -n "${hosts_prefix}sw" link set "${hosts_prefix}b$i" master br0
    ip -n "${hosts_prefix}sw" link set "${hosts_prefix}b$i" up
    cat > "$hosts_dir/sshd$i.conf" <<CONF
ListenAddress $(host_addr "$i")
ListenAddress 127.0.0.1
Port 22
HostKey $hosts_dir/hostkey
AuthorizedKeysFile $hosts_dir/authorized_keys
PidFile $hosts_dir/sshd$i.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AcceptEnv LANG LC_*
CONF
    start_sshd "$i" || return 1
    echo "$(host_addr "$i") slots=2" >> "$hosts_dir/hostfile"
  done
  # Every host reaches every other over ssh before a test relies on it.
  for ((i = 0; i < n; i++)); do
    on_host 0 "$hosts_dir/bin/ssh" -o BatchMode=yes "$(host_addr "$i")" true ||
      { echo "host 0 cannot ssh to host $i" >&2; return 1; }
  done
  # TCP only; the ranks pick eth1 themselves (the interface that routes to the rendezvous).
  export UCX_TLS=tcp
}

hosts_down() {
  local i
  [[ -z $hosts_dir ]] && return 0
  for ((i = 0; i < hosts_count; i++)); do
    if [[ -s $hosts_dir/sshd$i.pid ]]; then
      # The host's processes: everything in its network namespace.
      ip netns pids "${hosts_prefix}h$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    fi
    ip netns del "${hosts_prefix}h$i" 2>/dev/null || true
  done
  ip netns del "${hosts_prefix}sw" 2>/dev/null || true
  hosts_count=0
}
