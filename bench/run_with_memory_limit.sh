#!/usr/bin/env bash
# Runs a command with its RAM limited to LIMIT bytes by a memory cgroup: its heap and the page cache
# of the files it reads or mmaps are both charged, so a model mmapped by llama.cpp that does not fit
# is evicted and read back from disk as the command goes.  Used to measure llama.cpp's decode speed
# under a RAM limit (tools/llama_cpp/decode_speed.mjs, docs/bench-experts.md).
#
# Usage: bench/run_with_memory_limit.sh LIMIT [--drop-cache FILE]... [--method M] -- command args...
#   LIMIT: bytes, or with a binary suffix K, M, G, T (1536M = 1536 MiB).
#   --drop-cache FILE: before the run, flush FILE and drop its pages from the page cache
#     (posix_fadvise DONTNEED through `dd iflag=nocache`).  A page is charged to the cgroup that first
#     brought it into the cache, so pages already cached (by the process that wrote the file, by an
#     earlier run) are NOT charged to the limited command and it reads them for free: drop the
#     model's cache before every limited run.  Pages that another process has mapped stay; the
#     message says how many bytes of FILE are still cached (fincore).
#   --method auto|systemd|v2|v1 (default auto, tried in this order, the first that works is used):
#     systemd: `systemd-run --scope -p MemoryMax=LIMIT` (cgroup v2 with systemd as init);
#     v2: a child cgroup with memory.max under this shell's cgroup v2 (needs the memory controller
#         enabled in our cgroup's cgroup.subtree_control, or enabling it to succeed);
#     v1: a child cgroup with memory.limit_in_bytes under this shell's cgroup v1 memory cgroup
#         (needs write access there, typically root).
#     With none available it runs nothing and fails, saying why each was refused.
# Prints on stderr one line saying how the limit was applied, and after the run one line with the
# exit status, the cgroup's peak usage (memory.max_usage_in_bytes or memory.peak), how often the
# limit was hit, and the major page faults (memory.stat pgmajfault: accesses that waited for the
# disk).  The child cgroup is removed afterwards (leftover processes of the command in it are killed
# first).  Exit status: the command's (128+N when it died of signal N: 137 is SIGKILL, e.g. the
# cgroup's OOM killer when its anonymous memory alone exceeds LIMIT); 125 when the wrapper failed.
# Swap is not limited (cgroup v1 memsw / v2 memory.swap.max are left as they are).
# shellcheck disable=SC2317  # the try_* functions, cleanup and forward are called indirectly
set -euo pipefail

prog=run_with_memory_limit
usage="usage: $prog LIMIT [--drop-cache FILE]... [--method auto|systemd|v2|v1] -- command args..."
die() { echo "$prog: $*" >&2; exit 125; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# major_faults DIR: page faults of the cgroup's processes that had to read from disk (memory.stat).
major_faults() { awk '$1 == "pgmajfault" { print $2; found = 1 } END { if (!found) print "unknown" }' "$1/memory.stat" 2>/dev/null || echo unknown; }

# cgroup_dir FSTYPE PATH [CONTROLLER]: the directory of this process's cgroup PATH (from
# /proc/self/cgroup) in the first mount of FSTYPE (cgroup2, or cgroup with CONTROLLER among its super
# options) per /proc/self/mountinfo, whose optional fields vary in number and whose mount root may be
# a prefix of PATH (a container that sees a sub-tree).  Prints nothing when there is no such mount.
cgroup_dir() {
  [[ -n $2 ]] || return 0
  awk -v fstype="$1" -v path="$2" -v controller="${3:-}" '{
    for (i = 7; i <= NF && $i != "-"; i++) {}
    if ($(i + 1) != fstype) next
    if (controller != "" && ("," $(i + 3) ",") !~ ("," controller ",")) next
    root = $4; rel = path
    if (root != "/" && index(path, root) == 1) rel = substr(path, length(root) + 1)
    dir = $5 rel; sub(/\/+$/, "", dir); print dir; exit
  }' /proc/self/mountinfo
}

# Internal mode, run inside the systemd scope: run the command, then report the scope's peak usage.
if [[ ${1:-} == --in-scope ]]; then
  shift 2  # --in-scope --
  set +e
  "$@"
  status=$?
  set -e
  cg=$(cgroup_dir cgroup2 "$(sed -n 's/^0:://p' /proc/self/cgroup)")
  peak="unavailable (no memory.peak: kernel < 5.19)"
  [[ -r $cg/memory.peak ]] && peak="$(<"$cg/memory.peak") bytes ($(mib "$(<"$cg/memory.peak")"), memory.peak)"
  events=$(awk '$1 == "max" || $1 == "oom_kill" { printf "%s%s %s", sep, $1, $2; sep = ", " }' "$cg/memory.events" 2>/dev/null || true)
  echo "$prog: exit status $status; peak usage $peak; memory.events: ${events:-unavailable}; major faults $(major_faults "$cg")" >&2
  exit "$status"
fi

[[ $# -ge 1 ]] || die "$usage"
limit_arg=$1
shift
if [[ $limit_arg =~ ^([0-9]+)([KMGTkmgt]?)$ ]]; then
  case ${BASH_REMATCH[2]^^} in
    "") shift_bits=0 ;; K) shift_bits=10 ;; M) shift_bits=20 ;; G) shift_bits=30 ;; T) shift_bits=40 ;;
  esac
  limit=$((BASH_REMATCH[1] << shift_bits))
else
  die "LIMIT: expected bytes or a number with K/M/G/T, found \"$limit_arg\"; $usage"
fi
((limit > 0)) || die "LIMIT must be positive"

method=auto
drop_files=()
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    --drop-cache) [[ $# -ge 2 ]] || die "--drop-cache needs a file"; drop_files+=("$2"); shift 2 ;;
    --method) [[ $# -ge 2 ]] || die "--method needs a value"; method=$2; shift 2 ;;
    *) die "unknown argument $1; $usage" ;;
  esac
done
[[ ${1:-} == -- ]] || die "missing -- before the command; $usage"
shift
[[ $# -ge 1 ]] || die "no command given; $usage"
case $method in auto | systemd | v2 | v1) ;; *) die "--method: expected auto, systemd, v2 or v1, found \"$method\"" ;; esac

for file in "${drop_files[@]}"; do
  [[ -f $file ]] || die "--drop-cache: $file: not a regular file"
  sync "$file" || die "--drop-cache: cannot flush $file"
  dd if="$file" iflag=nocache count=0 status=none || die "--drop-cache: cannot drop the page cache of $file"
  left="unknown (no fincore)"
  if command -v fincore >/dev/null; then
    left="$(fincore --bytes --noheadings --output RES "$file" | tr -d ' ') bytes"
  fi
  echo "$prog: dropped the page cache of $file ($(stat -c %s "$file") bytes); still cached: $left" >&2
done

# Where this shell's cgroups are: the cgroup v2 mount and path, the cgroup v1 memory mount and path.
v2_own=$(cgroup_dir cgroup2 "$(sed -n 's/^0:://p' /proc/self/cgroup)")
v1_own=$(cgroup_dir cgroup "$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3; exit }' /proc/self/cgroup)" memory)
v2_memory=false
[[ -n $v2_own && -r $v2_own/cgroup.controllers ]] && grep -qw memory "$v2_own/cgroup.controllers" && v2_memory=true

refused=()
child=""
kind=""

try_systemd() {
  [[ -d /run/systemd/system ]] || { refused+=("systemd: systemd is not the init system (no /run/systemd/system)"); return 1; }
  command -v systemd-run >/dev/null || { refused+=("systemd: no systemd-run"); return 1; }
  $v2_memory || { refused+=("systemd: no cgroup v2 memory controller for this process"); return 1; }
  user_flag=()
  ((EUID == 0)) || user_flag=(--user)
  if ! systemd-run "${user_flag[@]}" --scope --quiet --collect -p MemoryMax="$limit" -- true 2>/dev/null; then
    refused+=("systemd: systemd-run --scope -p MemoryMax=$limit failed")
    return 1
  fi
  return 0
}

try_v2() {
  $v2_memory || { refused+=("v2: no cgroup v2 memory controller for this process${v2_own:+ ($v2_own/cgroup.controllers)}"); return 1; }
  if ! grep -qw memory "$v2_own/cgroup.subtree_control" 2>/dev/null &&
     ! { echo +memory >"$v2_own/cgroup.subtree_control"; } 2>/dev/null; then
    refused+=("v2: cannot enable the memory controller in $v2_own/cgroup.subtree_control (no permission, or our cgroup holds processes: cgroup v2 hands controllers only to children of cgroups without processes, the usual case in a container without systemd)")
    return 1
  fi
  child="$v2_own/$prog.$$"
  if ! mkdir "$child" 2>/dev/null; then
    refused+=("v2: cannot create $child")
    child=""
    return 1
  fi
  if ! { echo "$limit" >"$child/memory.max"; } 2>/dev/null; then
    refused+=("v2: cannot write $child/memory.max")
    rmdir "$child" 2>/dev/null || true
    child=""
    return 1
  fi
  return 0
}

try_v1() {
  [[ -n $v1_own ]] || { refused+=("v1: no cgroup v1 memory hierarchy mounted"); return 1; }
  child="$v1_own/$prog.$$"
  if ! mkdir "$child" 2>/dev/null; then
    refused+=("v1: cannot create $child (not root, or $v1_own is read-only)")
    child=""
    return 1
  fi
  if ! { echo "$limit" >"$child/memory.limit_in_bytes"; } 2>/dev/null; then
    refused+=("v1: cannot write $child/memory.limit_in_bytes")
    rmdir "$child" 2>/dev/null || true
    child=""
    return 1
  fi
  return 0
}

case $method in
  auto) methods=(systemd v2 v1) ;;
  *) methods=("$method") ;;
esac
for m in "${methods[@]}"; do
  if "try_$m"; then kind=$m; break; fi
done
if [[ -z $kind ]]; then
  echo "$prog: no memory limit could be applied; the command was not run:" >&2
  printf '  %s\n' "${refused[@]}" >&2
  exit 125
fi

if [[ $kind == systemd ]]; then
  echo "$prog: limit $limit bytes ($(mib "$limit")) via systemd-run --scope -p MemoryMax=$limit (cgroup v2)" >&2
  exec systemd-run "${user_flag[@]}" --scope --quiet --collect -p MemoryMax="$limit" -- \
    bash "$(readlink -f "${BASH_SOURCE[0]}")" --in-scope -- "$@"
fi

cleanup() {
  [[ -n $child && -d $child ]] || return 0
  local pids=()
  mapfile -t pids <"$child/cgroup.procs" 2>/dev/null || true
  if ((${#pids[@]} > 0)); then
    echo "$prog: killing processes the command left in $child: ${pids[*]}" >&2
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  for _ in $(seq 50); do
    rmdir "$child" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$prog: could not remove $child; remove it with rmdir" >&2
}
trap cleanup EXIT

if [[ $kind == v1 ]]; then
  effective=$(<"$child/memory.limit_in_bytes")
  echo "$prog: limit $effective bytes ($(mib "$effective")) via cgroup v1: $child/memory.limit_in_bytes" >&2
else
  effective=$(<"$child/memory.max")
  echo "$prog: limit $effective bytes ($(mib "$effective")) via cgroup v2: $child/memory.max" >&2
fi

# Run the command in the child cgroup: a subshell moves itself there, then execs the command.  This
# shell stays outside, waits, forwards INT/TERM/HUP, reads the peak and removes the cgroup.
command_pid=""
forward() { if [[ -n $command_pid ]]; then kill -s "$1" "$command_pid" 2>/dev/null || true; fi; }
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward HUP' HUP
(
  trap - INT QUIT TERM HUP EXIT
  echo "$BASHPID" >"$child/cgroup.procs" || { echo "$prog: cannot move into $child" >&2; exit 125; }
  exec "$@"
) &
command_pid=$!
set +e
while :; do
  wait "$command_pid" 2>/dev/null  # (no "Killed …" job notice: the status line below says it)
  status=$?
  kill -0 "$command_pid" 2>/dev/null || break  # wait was interrupted by a forwarded signal: wait again
done
set -e

if [[ $kind == v1 ]]; then
  peak=$(<"$child/memory.max_usage_in_bytes")
  oom_kills=$(awk '$1 == "oom_kill" { print $2 }' "$child/memory.oom_control")
  echo "$prog: exit status $status; peak usage $peak bytes ($(mib "$peak"), memory.max_usage_in_bytes);" \
    "limit hit $(<"$child/memory.failcnt") times (memory.failcnt); OOM kills ${oom_kills:-unknown};" \
    "major faults $(major_faults "$child")" >&2
else
  peak="unavailable (no memory.peak: kernel < 5.19)"
  [[ -r $child/memory.peak ]] && peak="$(<"$child/memory.peak") bytes ($(mib "$(<"$child/memory.peak")"), memory.peak)"
  events=$(awk '$1 == "max" || $1 == "oom_kill" { printf "%s%s %s", sep, $1, $2; sep = ", " }' "$child/memory.events")
  echo "$prog: exit status $status; peak usage $peak; memory.events: $events; major faults $(major_faults "$child")" >&2
fi
exit "$status"
