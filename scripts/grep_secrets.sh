#!/usr/bin/env bash
# Fail when a test secret leaked into a log or a file a test run left behind.
#
#   scripts/grep_secrets.sh LOG_OR_DIR...
#
# Every password and token the test suite hands to millstream contains one marker (MARKER in
# tests/secrets.py; SECRET_MARKER overrides it). Folders are searched recursively, binary files
# included. Each hit is printed as FILE:LINE: TEXT with the marker masked as *** (so this
# output is safe to keep). Exit 1 on any hit, 0 when clean, 2 on a usage error. Paths that do
# not exist are skipped with a note: a run does not always create every folder.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
marker="${SECRET_MARKER:-$(sed -n 's/^MARKER = "\(.*\)"$/\1/p' "$REPO/tests/secrets.py" 2>/dev/null || true)}"
if [[ -z "$marker" ]]; then
  echo "grep_secrets: no marker: set SECRET_MARKER or define MARKER in tests/secrets.py" >&2
  exit 2
fi
if [[ $# -eq 0 ]]; then
  echo "usage: $0 LOG_OR_DIR..." >&2
  exit 2
fi

paths=()
for path in "$@"; do
  if [[ -e "$path" ]]; then paths+=("$path"); else echo "grep_secrets: skipping $path (missing)" >&2; fi
done
if [[ ${#paths[@]} -eq 0 ]]; then
  echo "grep_secrets: nothing to scan"
  exit 0
fi

# -a: binary files too (Spark and broker data); -F: the marker is a plain string.
rc=0
found="$(grep -r -H -n -a -F -e "$marker" -- "${paths[@]}" | tr '\0' '?')" || rc=$?
# grep: 0 = found, 1 = nothing found, 2 = an error (e.g. an unreadable file): report, go on.
if [[ $rc -ge 2 ]]; then echo "grep_secrets: grep reported errors (exit $rc); see above" >&2; fi

hits=0
while IFS= read -r line; do
  [[ -n "$line" ]] || continue
  hits=$((hits + 1))
  line="${line//"$marker"/***}"
  printf '%s\n' "${line:0:300}" | LC_ALL=C tr -c '[:print:]\n' '?'
done <<<"$found"

if [[ $hits -gt 0 ]]; then
  echo "grep_secrets: $hits line(s) in ${paths[*]} contain the test secret marker (shown as ***):" \
    "a secret reached a log or a file" >&2
  exit 1
fi
echo "grep_secrets: no test secret in ${paths[*]}"
