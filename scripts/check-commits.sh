#!/usr/bin/env bash
# Commit messages since the rule began: a subject of at most 72 characters, then a blank
# line before any body. `git log --oneline` stays readable; the detail (cause, figures,
# what was seen failing) goes in the body. Older history is left as it was written.
# Usage: scripts/check-commits.sh [REV] (default HEAD). TALLY_COMMITS_REPO and
# TALLY_COMMITS_SINCE point it at another repository and base (its test does).
set -euo pipefail
cd "${TALLY_COMMITS_REPO:-$(dirname "$0")/..}"
# The last commit with a longer subject: every commit after it is checked.
SINCE=${TALLY_COMMITS_SINCE:-9ea0b62cbe86602ff1cf084e877cca45f09f837f}
rev="${1:-HEAD}"
if ! git cat-file -e "$SINCE^{commit}" 2>/dev/null; then
  echo "check-commits: $SINCE is not in this clone (shallow?): nothing to check." >&2
  exit 0
fi
bad=0
while read -r hash; do
  subject=$(git log -1 --format=%s "$hash")
  second=$(git log -1 --format=%B "$hash" | sed -n 2p)
  if [ "${#subject}" -gt 72 ]; then
    echo "check-commits: ${hash:0:8} subject is ${#subject} characters (at most 72): $subject" >&2
    bad=1
  fi
  if [ -n "$second" ]; then
    echo "check-commits: ${hash:0:8} needs a blank line between subject and body" >&2
    bad=1
  fi
done < <(git rev-list "$SINCE..$rev")
exit "$bad"
