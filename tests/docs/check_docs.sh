#!/usr/bin/env bash
# Keeps the documentation honest as the code moves: README.md and docs/**/*.md name
# no file outside the repository, their relative links resolve, every doc under docs/
# is reachable from README.md by links, every source file docs/architecture.md names
# exists (and every source path the other current docs name), and every message struct and atom of actors/protocol is described there.
# Usage: check_docs.sh REPOSITORY_ROOT
set -euo pipefail
root=$(realpath "$1")
cd "$root"
arch=docs/architecture.md
mapfile -t docs < <(printf '%s\n' README.md; find docs -name '*.md' -type f | LC_ALL=C sort)
problems=0
problem() { echo "FAIL: $*" >&2; problems=$((problems + 1)); }

[[ -f $arch ]] || { echo "FAIL: $arch is missing" >&2; exit 1; }

# 1. Nothing outside the repository: no parent-directory paths, no absolute
#    paths into a workstation, no links to them. A relative link may climb out of
#    a folder of docs/ (docs/results/x.md -> ../trace.md) when it lands inside the
#    repository. Fenced code blocks are quoted output (a test log's paths are
#    relative to its build folder) and are left out.
outside='(^|[ `(\[])\.\./|\]\(/|`/(work|home|tmp|root)/'
for f in "${docs[@]}"; do
  dir=$(dirname "$f")
  while IFS= read -r hit; do
    line=${hit%%:*} rest=${hit#*:}
    while [[ $rest =~ \]\((\.\./[^\)]*)\) ]]; do
      target=${BASH_REMATCH[1]}
      resolved=$(realpath -m "$dir/${target%%#*}")
      [[ $resolved == "$root" || $resolved == "$root"/* ]] ||
        problem "$f:$line: links to $target, outside the repository"
      rest=${rest//"](${target})"/"]"}
    done
    if grep -qE "$outside" <<<"$rest"; then
      problem "$f:$line: names a file outside the repository: ${hit#*:}"
    fi
  done < <(pat=$outside awk '/^```/ { fenced = !fenced; next } !fenced && $0 ~ ENVIRON["pat"] { print NR ":" $0 }' "$f")
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

# 2b. Every doc under docs/ is reachable from README.md, following relative
#     markdown links between .md files breadth first (a link to a folder counts
#     as a link to its README.md).
declare -A reached=([README.md]=1)
queue=(README.md)
while ((${#queue[@]} > 0)); do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  dir=$(dirname "$f")
  while IFS= read -r target; do
    target=${target%%#*}
    [[ -z $target || $target == *://* || $target == mailto:* ]] && continue
    [[ -d $dir/$target ]] && target=${target%/}/README.md
    [[ $target == *.md && -f $dir/$target ]] || continue
    next=$(realpath -m --relative-to="$root" "$dir/$target")
    [[ -n ${reached[$next]+x} ]] && continue
    reached[$next]=1
    queue+=("$next")
  done < <(grep -oE '\]\([^)]+\)' "$f" | sed -E 's/^\]\((.*)\)$/\1/')
done
for f in "${docs[@]}"; do
  [[ -n ${reached[$f]+x} ]] || problem "$f is not reachable from README.md by links"
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

# 3b. The other current docs (not the dated records under docs/results/ and docs/gpu/,
#     which describe the tree of their day) name only source files that exist: paths
#     into the source folders, as written.
for f in "${docs[@]}"; do
  [[ $f == "$arch" || $f == docs/results/* || $f == docs/gpu/* ]] && continue
  while IFS= read -r name; do
    [[ -e $name ]] || problem "$f names $name, which does not exist"
  done < <(awk '/^```/ { fenced = !fenced; next } !fenced' "$f" |
    grep -oE '`(actors|kernels|io|optim|models|configs|tools|tests|core)/[A-Za-z0-9_./-]+\.(hpp|cpp|cu|cuh|sh|py|toml)`' |
    tr -d '`' | sort -u)
done

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
