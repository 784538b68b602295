# Sourced by the test runners (run-tests, test-gpu, .ci/run): their counts
# and the two closing lines every one of them prints,
#   skipped: <why> (<n>); <why> (<n>)      (or "skipped: none")
#   N passed, N failed, N skipped
#   sum_add P F [S]               adds counts
#   sum_skip N WHY                adds N skipped, for the reason WHY
#   sum_cmocka LOG RC NAME        a cmocka binary's counts; a crash or no
#                                 summary counts one failure
#   sum_tap LOG LABEL             busted -o TAP's counts (# SKIP lines skipped)
#   sum_pytest LOG RC             pytest -q -rs's counts, skip reasons from -rs
#   sum_log LOG RC                another runner's closing lines, as above
#   sum_print                     the two closing lines
sum_p=0 sum_f=0 sum_s=0
sum_why= # lines "n<TAB>why"

sum_add() { sum_p=$((sum_p + $1)); sum_f=$((sum_f + $2)); sum_s=$((sum_s + ${3:-0})); }

sum_skip() { # n why
  [ "${1:-0}" -gt 0 ] || return 0
  sum_s=$((sum_s + $1))
  sum_why+="$1"$'\t'"$(printf '%s' "$2" | tr ';\t\n' ',  ')"$'\n'
}

sum_cmocka() { # log rc name
  local p f s
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -n 1); p=${p:-0}
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -n 1); f=${f:-0}
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$1" | tail -n 1); s=${s:-0}
  if [ "$2" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  if [ "$2" -eq 0 ] && [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then
    echo "!! $3 printed no cmocka summary"; f=1
  fi
  sum_add "$p" "$f"
  if [ "$s" -gt 0 ]; then
    # the tests' own "# ..." note says why (no CUDA backend: ...), else their names
    local why
    why=$(grep -m1 '^# no CUDA backend' "$1" | sed 's/^# //')
    [ -n "$why" ] || why="$3: $(sed -n 's/^\[  SKIPPED \] \(test_[A-Za-z0-9_]*\)$/\1/p' "$1" |
                               sort -u | tr '\n' ' ' | sed 's/ $//') (cmocka skip())"
    sum_skip "$s" "$why"
  fi
}

sum_tap() { # log label
  local p f s
  p=$(grep -c '^ok ' "$1"); f=$(grep -c '^not ok ' "$1"); s=$(grep -c '^ok [0-9]* - # SKIP' "$1")
  if ! grep -q '^1\.\.[0-9]' "$1"; then echo "!! busted $2 did not finish"; f=$((f + 1)); fi
  sum_add $((p - s)) "$f"
  local n why
  while read -r n why; do sum_skip "$n" "busted $2: $why"; done \
    < <(grep '^ok [0-9]* - # SKIP' "$1" | sed 's/^ok [0-9]* - # SKIP //' | sort | uniq -c)
}

sum_pytest() { # log rc
  local summary p f n
  summary=$(grep -E '^=*[ ]*[0-9]+ (passed|failed|skipped|error|deselected)' "$1" | tail -n 1)
  p=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '^[0-9]+'); p=${p:-0}
  f=0
  for n in $(echo "$summary" | grep -oE '[0-9]+ (failed|errors?)' | grep -oE '^[0-9]+'); do
    f=$((f + n))
  done
  if [ "$2" -ne 0 ] && [ "$f" -eq 0 ]; then echo "!! pytest exited with $2"; f=1; fi
  sum_add "$p" "$f"
  # -rs: "SKIPPED [2] python/tests/test_gpu.py:30: needs a CUDA device"
  local why
  while IFS=$'\t' read -r n why; do sum_skip "$n" "pytest: $why"; done \
    < <(sed -n 's/^SKIPPED \[\([0-9]*\)\] [^ ]*:[0-9]*: \(.*\)$/\1\t\2/p' "$1" |
        awk -F'\t' '{ n[$2] += $1 } END { for (w in n) printf "%d\t%s\n", n[w], w }')
}

sum_log() { # log rc: a runner that ends with sum_print's two lines
  local line p f s
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1)
  p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); p=${p:-0}
  f=$(echo "$line" | sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p'); f=${f:-0}
  s=$(echo "$line" | sed -n 's/.* failed, \([0-9]*\) skipped.*/\1/p'); s=${s:-0}
  if [ "$2" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  sum_add "$p" "$f"
  # its reasons: "skipped: why (n); why (n)"
  local why item rest n given=0
  why=$(grep '^skipped: ' "$1" | tail -n 1 | sed 's/^skipped: //')
  [ "$why" = none ] && why=
  rest=$why
  while [ -n "$rest" ]; do
    item=${rest%%; *}
    if [ "$item" = "$rest" ]; then rest=; else rest=${rest#*; }; fi
    n=$(printf '%s' "$item" | sed -n 's/.* (\([0-9]*\))$/\1/p'); n=${n:-1}
    sum_skip "$n" "$(printf '%s' "$item" | sed 's/ ([0-9]*)$//')"
    given=$((given + n))
  done
  [ "$s" -gt "$given" ] && sum_skip $((s - given)) "(no reason given)"
  return 0
}

sum_print() {
  if [ "$sum_s" -eq 0 ]; then
    echo "skipped: none"
  else
    echo "skipped: $(printf '%s' "$sum_why" | awk -F'\t' '{ if (!($2 in n)) order[++k] = $2; n[$2] += $1 }
      END { for (i = 1; i <= k; i++) printf "%s%s (%d)", (i > 1 ? "; " : ""), order[i], n[order[i]] }')"
  fi
  echo "$sum_p passed, $sum_f failed, $sum_s skipped"
}
