# Sourced by the integration scripts: write_tiny_corpus DIR writes a deterministic
# 30-document plain-text corpus (12 sentences each) into DIR.
write_tiny_corpus() {
  local dir=$1 d s w line
  local words=(the river ran past old mill where children played every summer and sang songs about green hills far
    away from town Mary went to Boston in 1961 with John)
  mkdir -p "$dir"
  for d in $(seq -w 0 29); do
    for s in $(seq 1 12); do
      line=""
      for w in $(seq 1 $((5 + (10#$d * 7 + s * 3) % 9))); do line+="${words[$(( (10#$d * 31 + s * 17 + w * 13) % ${#words[@]} ))]} "; done
      echo "${line% }." >> "$dir/doc$d.txt"
    done
  done
}
