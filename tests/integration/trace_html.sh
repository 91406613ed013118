#!/usr/bin/env bash
# Integration: `dsactor trace RUN html FILE` on a real 2-stage run, opened in headless
# Chromium: the page's script draws the timeline without an error (#render-status
# data-status="ok" in --dump-dom, nothing in #render-errors) and the screenshot is
# not blank. Exit 77 (skipped) without Chromium. Usage: trace_html.sh PATH/TO/dsactor
# [SCREENSHOT]: with SCREENSHOT, the picture is kept there (docs/trace-html.png, shown in
# docs/trace.md, is made so).
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
keep=${2:-}

# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
browser=$(command -v chromium || command -v chromium-browser || true)
[[ -n $browser ]] || { echo "SKIP: no chromium (Debian package chromium; ./ds test installs it)"; exit 77; }

write_tiny_corpus "$work/corpus"
cat > "$work/run.toml" <<TOML
train_batch_size = 8
train_micro_batch_size_per_gpu = 2
train_steps = 3
run_dir = "$work/run"

$(tiny_bert_tables "$work")

[optimizer]
type = "Adam"
params = { lr = 1e-3 }

[pipeline]
stages = 2
TOML
"$dsactor" run "$work/run.toml" >"$work/out" 2>"$work/err" || fail "the 2-stage run"
"$dsactor" trace "$work/run" html "$work/page.html" >"$work/out" 2>"$work/err" || fail "dsactor trace RUN html"
grep -qF 'id="render-status"' "$work/page.html" || fail "the page lacks its status element"
if grep -qiE '<script[^>]+src=|<link[^>]+href=|https?://[^"<]*\.js' "$work/page.html"; then fail "the page loads something from elsewhere"; fi
grep -qF "steps of rank 0" "$work/page.html" || fail "the page lacks the summary's tables"
if "$dsactor" trace "$work/run" html >/dev/null 2>&1; then fail "html without a FILE should fail"; fi

# Chromium's own profile in the work directory; no GPU, no sandbox (CI runs as root).
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile"
  --window-size=1400,900 --virtual-time-budget=5000)
# #selftest: the page's script also zooms, pans, hovers and fits through its own handlers.
"$browser" "${flags[@]}" --dump-dom "file://$work/page.html#selftest" >"$work/dom.html" 2>"$work/err" ||
  fail "chromium --dump-dom"
status=$(grep -o 'data-status="[a-z]*">[^<]*' "$work/dom.html" | head -1)
errors=$(sed -n 's:.*<pre id="render-errors">\(.*\)</pre>.*:\1:p' "$work/dom.html")
[[ $status == 'data-status="ok"'*'self-test passed'* && -z $errors ]] || {
  echo "status: $status; script errors: $errors" >&2; fail "the page's script did not render the timeline"; }
"$browser" "${flags[@]}" --screenshot="$work/shot.png" "file://$work/page.html" >"$work/out" 2>"$work/err" ||
  fail "chromium --screenshot"
python3 "$(dirname "${BASH_SOURCE[0]}")/png_check.py" "$work/shot.png" 12 >"$work/out" || fail "the screenshot looks blank"
cat "$work/out"
[[ -z $keep ]] || cp "$work/shot.png" "$keep"
echo "ok: dsactor trace html renders in headless Chromium without script errors"
