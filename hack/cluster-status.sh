#!/usr/bin/env bash
# Exit 0 and print the admin kubeconfig path when the local control plane is fully up, else exit 1.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if all_up; then echo "$KUBECONFIG_ADMIN"; else log "not up"; exit 1; fi
