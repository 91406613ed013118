#!/usr/bin/env bash
# Keeps the documentation honest as the code moves: README.md and docs/*.md name
# no file outside the repository, their relative links resolve, every source file
# docs/architecture.md names exists, and every message struct and atom of
# actors/protocol is described there. Usage: check_docs.sh REPOSITORY_ROOT
set -euo pipefail
root=$(realpath "$1")
cd "$root"
arch=docs/architecture.md
docs=(README.md docs/*.md)
problems=0
problem() { echo "FAIL: $*" >&2; problems=$((problems + 1)); }

[[ -f $arch ]] || { echo "FAIL: $arch is missing" >&2; exit 1; }

# 1. Nothing outside the repository: no parent-directory paths, no absolute
#    paths into a workstation, no links to them.
for f in "${docs[@]}"; do
  while IFS= read -r hit; do
    problem "$f:${hit%%:*}: names a file outside the repository: ${hit#*:}"
  done < <(grep -nE '(^|[ `(\[])\.\./|\]\(/|`/(work|home|tmp|root)/' "$f" || true)
done

# 2. Relative markdown links resolve (from the file's own directory).
for f in "${docs[@]}"; do
  dir=$(dirname "$f")
  while IFS= read -r target; do
    target=${target%%#*}
    [[ -z $target || $target == http*://* || $target == mailto:* ]] && continue
    [[ -e $dir/$target ]] || problem "$f: link to $target, which does not exist"
  done < <(grep -oE '\]\([^)]+\)' "$f" | sed -E 's/^\]\((.*)\)$/\1/')
done

# 3. Source files named in the architecture document exist: a path with a
#    folder must exist as written; a bare file name somewhere in the tree.
tree=$(find . -path ./.git -prune -o -path './build*' -prune -o -type f -print | sed 's|^\./||')
while IFS= read -r name; do
  if [[ $name == */* ]]; then
    [[ -e $name ]] || problem "$arch names $name, which does not exist"
  else
    grep -qE "(^|/)${name//./\\.}\$" <<<"$tree" || problem "$arch names $name, found nowhere in the repository"
  fi
done < <(grep -oE '`[A-Za-z0-9_./-]+\.(hpp|cpp|sh|py|md)`|`[A-Za-z0-9_./-]*meson\.build`' "$arch" | tr -d '`' | sort -u)

# 4. Every message struct and atom of the protocol is described.
for type in $(grep -oE '^struct [a-z_]+' actors/protocol/messages.hpp | cut -d' ' -f2); do
  grep -q "\`$type" "$arch" || problem "$arch does not describe the message $type (actors/protocol/messages.hpp)"
done
for atom in $(grep -oE '^using [a-z_]+_atom' actors/protocol/atoms.hpp | cut -d' ' -f2); do
  grep -q "\`$atom" "$arch" || problem "$arch does not describe $atom (actors/protocol/atoms.hpp)"
done

if ((problems > 0)); then
  echo "$problems problem(s) in the documentation" >&2
  exit 1
fi
echo "documentation checks passed"
