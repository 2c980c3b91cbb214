# Timed phases for .ci/run and hack/ci-build.sh (sourced, not run).
#
#   phase NAME      ends the running phase (printing its duration) and starts NAME
#   phase_end       ends the running phase
#   phase_summary   every phase's duration and the total since the first phase of the run
#
# The durations go to $MMPREP_PHASES (a file shared with the scripts a run calls), so one summary
# lists the phases of .ci/run and of the build script it runs.
: "${MMPREP_PHASES:=$(mktemp)}"
: "${MMPREP_PHASES_START:=$(date +%s)}"
export MMPREP_PHASES MMPREP_PHASES_START
_phase_name=""
_phase_start=0
phase_end() {
  [ -n "$_phase_name" ] || return 0
  local took=$(( $(date +%s) - _phase_start ))
  printf '%-44s %6d s\n' "$_phase_name" "$took" >>"$MMPREP_PHASES"
  echo "== $_phase_name: $took s"
  _phase_name=""
}
phase() {
  phase_end
  _phase_name=$1
  _phase_start=$(date +%s)
  # Free disk at each phase: the kind tier needs about 20 GB while it loads the runtime image.
  echo "== $_phase_name ($(date +%H:%M:%S), $(df -Pm / | awk 'NR == 2 { printf "%d", $4 / 1024 }') GB free)"
}
phase_summary() {
  phase_end
  echo "== phase times"
  sed 's/^/   /' "$MMPREP_PHASES"
  printf '   %-44s %6d s\n' total $(( $(date +%s) - MMPREP_PHASES_START ))
}
