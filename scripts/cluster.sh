#!/bin/bash
# cluster.sh - an emulated cluster of N "nodes" on one machine, for measuring
# zr's inter-node traffic on a real, rate-limited network link.
#
#   cluster.sh up N RATE            create the nodes and the switch, shape links to RATE
#   cluster.sh rate N RATE          reshape the links of a running cluster
#   cluster.sh exec [--slots D] [--timeout S] -- CMD...
#                                   run CMD (e.g. mpirun -np 4 zr ...) on node 0
#   cluster.sh counters             per node: "NODE tx_bytes rx_bytes tx_packets rx_packets" of eth0
#   cluster.sh down                 kill what runs in the nodes, delete everything
#   cluster.sh run N RATE [--slots D] [--timeout S] -- CMD...
#                                   up + exec + down; always tears down (trap), also on failure
#
# RATE: a tc rate such as 1gbit or 10gbit, or none (unlimited: veth + bridge speed).
#
# Topology: node i is the network namespace zrn<i> whose eth0 (10.77.0.<i+1>/24)
# is a veth whose peer zrp<i> is a port of the bridge zrbr0 in the namespace
# zrsw (the "switch"). The veths are created directly inside the namespaces:
# nothing is added to the root namespace, and the 10.77.0.0/24 addresses exist
# only among these namespaces. tbf shapes both directions of every node link
# (node egress on eth0, switch egress on the port). The agent enters the node's
# namespace and a fresh UTS namespace with hostname = node name: Open MPI's
# shared-memory (vader) segment names contain the hostname, and without it the
# ranks of different "nodes" collide (segfaults); the distinct hostnames also
# make zr's MPI_Comm_split_type(SHARED) node detection see real nodes, so
# ZR_RANKS_PER_NODE must not be set (exec unsets it).
#
# exec writes a hostfile with D slots per node (default 1) and points Open MPI
# at it and at the agent through OMPI_MCA_* variables, so CMD is a plain
# "mpirun -np K ..." that fills node 0 first (node-major ranks, as zr requires).
# Inter-node MPI traffic uses the TCP BTL on eth0 with 2 links per peer pair
# (with one, Open MPI's bidirectional exchanges get half the link rate per
# direction); intra-node traffic uses vader.
#
# Exit status: 77 = skipped (not root, or no network namespaces / bridge / tbf
# here), 75 = a cluster is already up (another run owns it), 2 = usage, 124 =
# exec/run timed out, otherwise the status of CMD. Needs root, Open MPI
# (mpirun.openmpi), iproute2 and util-linux (unshare, timeout).
set -u

SW=zrsw
BR=zrbr0
NODE_PREFIX=zrn
STATE=${ZR_CLUSTER_STATE:-/run/zr-cluster}
HERE=$(cd "$(dirname "$0")" && pwd)
SELF="$HERE/$(basename "$0")"
MAXN=16

die() { echo "cluster.sh: $*" >&2; exit 1; }
skip() { echo "cluster.sh: skipped: $*" >&2; exit 77; }
usage() { sed -n '2,13p' "$SELF" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# Rate string check: 1gbit, 500mbit, 10gbit ... or none.
check_rate() {
    case "$1" in
        none) ;;
        [0-9]*bit|[0-9]*bps) ;;
        *) echo "cluster.sh: bad RATE '$1' (e.g. 1gbit, 10gbit, none)" >&2; exit 2 ;;
    esac
}

check_n() {
    case "$1" in ''|*[!0-9]*) echo "cluster.sh: bad node count '$1'" >&2; exit 2 ;; esac
    [ "$1" -ge 1 ] && [ "$1" -le $MAXN ] || { echo "cluster.sh: node count 1..$MAXN" >&2; exit 2; }
}

# Namespaces of ours that exist now (nodes and switch).
our_netns() {
    ip netns list 2>/dev/null | awk -v p="$NODE_PREFIX" -v s="$SW" \
        '{ n = $1; if (n == s || (index(n, p) == 1 && substr(n, length(p) + 1) ~ /^[0-9]+$/)) print n }'
}

need_root() {
    [ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tc); running as uid $(id -u)"
    command -v ip >/dev/null 2>&1 || skip "iproute2 (ip) is not installed"
    command -v unshare >/dev/null 2>&1 || skip "unshare (util-linux) is not installed"
}

# tbf on one egress: burst scales with the rate (tbf needs burst >= rate/HZ
# and >= one GSO segment; 512 kB per Gbit/s is plenty for both).
shape_dev() {
    local ns=$1 dev=$2 rate=$3 burst=512kb
    ip -n "$ns" link set "$dev" up
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null
    [ "$rate" = none ] && return 0
    case "$rate" in
        *gbit) local g=${rate%gbit}; case "$g" in *[!0-9]*) ;; *) [ "$g" -gt 1 ] && burst=$((g * 512))kb ;; esac ;;
    esac
    tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms
}

cmd_rate() {
    local n=$1 rate=$2 i
    check_n "$n"; check_rate "$rate"
    for ((i = 0; i < n; i++)); do
        ip netns list | grep -qx "$NODE_PREFIX$i\( (id: [0-9]*)\)\?" || die "node $NODE_PREFIX$i is not up"
        shape_dev "$NODE_PREFIX$i" eth0 "$rate" || return 1
        shape_dev "$SW" "zrp$i" "$rate" || return 1
    done
}

cmd_up() {
    local n=$1 rate=$2 i ns
    check_n "$n"; check_rate "$rate"; need_root
    if [ -n "$(our_netns)" ]; then
        echo "cluster.sh: a cluster is already up ($(our_netns | tr '\n' ' ')); 'cluster.sh down' removes it" >&2
        exit 75
    fi
    local err
    if ! err=$(ip netns add "$SW" 2>&1); then
        skip "cannot create a network namespace: $err"
    fi
    if ! err=$(ip -n "$SW" link add "$BR" type bridge 2>&1); then
        cmd_down; skip "cannot create a bridge: $err"
    fi
    ip -n "$SW" link set lo up && ip -n "$SW" link set "$BR" up || { cmd_down; die "switch setup failed"; }
    for ((i = 0; i < n; i++)); do
        ns=$NODE_PREFIX$i
        if ! { ip netns add "$ns" &&
               ip -n "$SW" link add "zrp$i" type veth peer name eth0 netns "$ns" &&
               ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0 &&
               ip -n "$ns" link set lo up && ip -n "$ns" link set eth0 up &&
               ip -n "$SW" link set "zrp$i" master "$BR" && ip -n "$SW" link set "zrp$i" up; }; then
            cmd_down; die "setting up node $ns failed"
        fi
    done
    if ! err=$(cmd_rate "$n" "$rate" 2>&1); then
        cmd_down; skip "cannot shape links with tc tbf: $err"
    fi
    mkdir -p "$STATE" || { cmd_down; die "cannot create $STATE"; }
    echo "$n" >"$STATE/nodes"
    # The agent: Open MPI runs "agent HOST orted ARGS..." the way it would run ssh.
    printf '#!/bin/sh\n# generated by cluster.sh: ssh stand-in for node namespaces\nh=$1; shift\nexec ip netns exec "$h" unshare --uts /bin/sh -c "hostname $h; $*"\n' >"$STATE/agent"
    chmod +x "$STATE/agent"
    # Reachability: node 0 must reach every other node through the switch.
    for ((i = 1; i < n; i++)); do
        # (no ping here: a TCP connect to a closed port is refused at once when
        # the node is reachable, and hangs until the timeout when it is not)
        timeout 3 ip netns exec "${NODE_PREFIX}0" bash -c "echo >/dev/tcp/10.77.0.$((i + 1))/9" 2>/dev/null
        [ $? -ne 124 ] || { cmd_down; die "node ${NODE_PREFIX}0 cannot reach ${NODE_PREFIX}$i"; }
    done
}

# Kill every process inside a namespace (stray ranks/orteds of a failed run),
# TERM first, then KILL. Only processes whose network namespace is ours.
kill_netns_pids() {
    local ns=$1 pids t
    for t in TERM KILL; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -z "$pids" ] && return 0
        [ "$t" = KILL ] && echo "cluster.sh: killing stray processes in $ns: $pids" >&2
        # shellcheck disable=SC2086
        kill -s "$t" $pids 2>/dev/null
        sleep 1
    done
}

cmd_down() {
    local ns
    for ns in $(our_netns); do kill_netns_pids "$ns"; done
    for ns in $(our_netns); do ip netns del "$ns" 2>/dev/null || echo "cluster.sh: cannot delete $ns" >&2; done
    rm -rf "$STATE"
    [ -z "$(our_netns)" ]
}

cmd_counters() {
    local n i s
    n=$(cat "$STATE/nodes" 2>/dev/null) || die "no cluster is up"
    for ((i = 0; i < n; i++)); do
        s="/sys/class/net/eth0/statistics"
        ip netns exec "$NODE_PREFIX$i" sh -c \
            "echo $NODE_PREFIX$i \$(cat $s/tx_bytes $s/rx_bytes $s/tx_packets $s/rx_packets)" ||
            die "cannot read counters of $NODE_PREFIX$i"
    done
}

cmd_exec() {
    local slots=1 tmo=600 n i
    while [ $# -gt 0 ]; do
        case "$1" in
            --slots) slots=$2; shift 2 ;;
            --timeout) tmo=$2; shift 2 ;;
            --) shift; break ;;
            *) usage ;;
        esac
    done
    [ $# -gt 0 ] || usage
    n=$(cat "$STATE/nodes" 2>/dev/null) || die "no cluster is up ('cluster.sh up N RATE' first)"
    : >"$STATE/hosts.$slots"
    for ((i = 0; i < n; i++)); do echo "$NODE_PREFIX$i slots=$slots" >>"$STATE/hosts.$slots"; done
    # single-machine defaults (root, one BLAS thread, yield), then the cluster's transport
    # shellcheck source=mpienv.sh
    . "$HERE/mpienv.sh"
    unset ZR_RANKS_PER_NODE
    export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=eth0 \
        OMPI_MCA_oob_tcp_if_include=eth0 OMPI_MCA_btl_tcp_links=2 \
        OMPI_MCA_plm_rsh_agent="$STATE/agent" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
        OMPI_MCA_orte_default_hostfile="$STATE/hosts.$slots"
    # shellcheck disable=SC2016
    timeout -k 10 "$tmo" ip netns exec "${NODE_PREFIX}0" unshare --uts \
        /bin/sh -c 'hostname "$0"; exec "$@"' "${NODE_PREFIX}0" "$@"
    local rc=$?
    # a timed-out or crashed job may leave orteds/ranks in other nodes: kill them
    if [ $rc -ne 0 ]; then
        for ((i = 0; i < n; i++)); do kill_netns_pids "$NODE_PREFIX$i"; done
    fi
    return $rc
}

cmd_run() {
    local n=$1 rate=$2
    shift 2
    check_n "$n"; check_rate "$rate"; need_root
    if [ -n "$(our_netns)" ]; then
        echo "cluster.sh: a cluster is already up (another run owns it?); not touching it" >&2
        exit 75
    fi
    trap 'cmd_down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    cmd_up "$n" "$rate" || exit $?
    cmd_exec "$@"
}

[ $# -ge 1 ] || usage
sub=$1
shift
case "$sub" in
    up) [ $# -eq 2 ] || usage; cmd_up "$1" "$2" ;;
    rate) [ $# -eq 2 ] || usage; need_root; cmd_rate "$1" "$2" ;;
    down) need_root; cmd_down ;;
    exec) need_root; cmd_exec "$@" ;;
    counters) need_root; cmd_counters ;;
    run) [ $# -ge 3 ] || usage; cmd_run "$@" ;;
    -h|--help|help) usage ;;
    *) usage ;;
esac
