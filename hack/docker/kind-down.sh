#!/usr/bin/env bash
# Deletes the kind cluster made by kind-up.sh (the images and the models folder stay cached).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
KIND_CLUSTER=${KIND_CLUSTER:-mmprep}
KIND=${KIND:-$("$here/install-kind.sh")}
"$KIND" delete cluster --name "$KIND_CLUSTER" >&2
rm -f "${KIND_KUBECONFIG:-$MMPREP_CACHE/kind/$KIND_CLUSTER.kubeconfig}"
# What the cluster's pods wrote into its shared folder goes with it (written by pods as 65532).
rm -rf "$MMPREP_CACHE/kind/$KIND_CLUSTER/shared"
