#!/usr/bin/env bash
# Prints the CNI config of one kind node: ptp veths + host-local addresses from SUBNET + portmap,
# what kindnetd writes, made static because kindnetd is not built here (see build-node-image.sh).
#
#   hack/kind/ptp-conflist.sh 10.244.1.0/24
set -euo pipefail
subnet=${1:?usage: ptp-conflist.sh SUBNET}
cat <<JSON
{
  "cniVersion": "0.3.1",
  "name": "kind-ptp",
  "plugins": [
    {"type": "ptp", "ipMasq": true, "mtu": 1500,
     "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state",
              "routes": [{"dst": "0.0.0.0/0"}], "ranges": [[{"subnet": "$subnet"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
