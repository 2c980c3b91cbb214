#!/usr/bin/env bash
# Installs the Debian packages of the named groups of hack/system-packages.txt, once:
#
#   hack/system-packages.sh GROUP...    e.g. `cgo docker`; `all` names every group
#   hack/system-packages.sh --list G... prints the packages, installs nothing
#
# Idempotent and quiet when everything is there (one dpkg-query, no network). Otherwise it needs
# root and apt-get; it runs `apt-get update` first only when the package lists are empty (a fresh
# machine or container) or when an install from the present lists fails (stale lists).
set -euo pipefail
list="$(cd "$(dirname "$0")" && pwd)/system-packages.txt"
log() { printf '[system-packages %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

only_list=0
if [ "${1:-}" = --list ]; then only_list=1; shift; fi
[ $# -gt 0 ] || die "usage: $0 [--list] GROUP... (groups: $(awk '!/^#/ && NF {printf "%s ", $1}' "$list")all)"

packages=()
for group in "$@"; do
  if [ "$group" = all ]; then
    mapfile -t -O "${#packages[@]}" packages < <(awk '!/^#/ && NF {for (i = 2; i <= NF; i++) print $i}' "$list")
    continue
  fi
  line=$(awk -v g="$group" '!/^#/ && $1 == g' "$list")
  [ -n "$line" ] || die "no group '$group' in $list"
  read -r -a words <<<"$line"
  packages+=("${words[@]:1}")
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | awk '!seen[$0]++')  # groups may share one
if [ "$only_list" = 1 ]; then printf '%s\n' "${packages[@]}"; exit 0; fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

command -v apt-get >/dev/null || die "missing Debian packages (${missing[*]}) and no apt-get to install them"
sudo=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || die "missing Debian packages (${missing[*]}): installing them needs root"
  sudo=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
apt_log=$(mktemp); trap 'rm -f "$apt_log"' EXIT
# Two scripts may install at once (a test session's background kind bring-up, say): the second
# waits for dpkg's lock instead of failing on it.
apt=("${sudo[@]}" apt-get -o DPkg::Lock::Timeout=300)
install() { "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}" >"$apt_log" 2>&1; }
update() { log "apt-get update"; "${apt[@]}" update -q >"$apt_log" 2>&1 || { cat "$apt_log" >&2; die "apt-get update failed"; }; }
# Empty lists: nothing can be installed before an update (a fresh container or debootstrap root).
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then update; fi
log "installing ${missing[*]}"
if ! install; then
  update
  install || { tail -30 "$apt_log" >&2; die "apt-get install ${missing[*]} failed"; }
fi
