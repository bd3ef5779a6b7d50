#!/usr/bin/env bash
# tests/valgrind/run.sh B: `make -C csrc valgrind` after building into B
# (build-valgrind/, -DKP_VALGRIND=1). Runs each case of vg_demo under
# memcheck and checks its report: every error case must make memcheck exit
# with the error status and print every "expect: " line the case printed;
# the clean case, and the C tests test_heap, test_pool and test_arena (with
# only their deliberate misuse suppressed: tests.supp), must give 0 errors
# and no leak. --fair-sched=yes: memcheck runs one thread at a time, and its
# default lock lets two spinning threads pass it between them while a third
# waits (test_heap's fork test took 7 minutes, test_pool's stats race 8).
set -uo pipefail
B=${1:?usage: run.sh BUILD_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
ERR=42
VG=(valgrind --tool=memcheck --error-exitcode=$ERR --leak-check=full --show-leak-kinds=definite,indirect,possible
    --errors-for-leak-kinds=definite,indirect,possible --num-callers=20 --fair-sched=yes)
command -v valgrind >/dev/null || { echo "valgrind: not installed"; exit 1; }
fail=0

expect_case() {   # case: memcheck must report it
    local c=$1 log=$B/vg_demo.$1.log out=$B/vg_demo.$1.out
    "${VG[@]}" --log-file="$log" "$B/vg_demo" "$c" >"$out" 2>&1
    local rc=$? missing=0
    if [ $rc -ne $ERR ]; then echo "valgrind: $c: exit status $rc, not $ERR (memcheck saw no error?)"; fail=1; return; fi
    while IFS= read -r want; do
        grep -qF -- "$want" "$log" || { echo "valgrind: $c: memcheck did not print: $want"; missing=1; }
    done < <(sed -n 's/^expect: //p' "$out")
    [ "$(grep -c '^expect: ' "$out")" -gt 0 ] || { echo "valgrind: $c: printed no expectations"; missing=1; }
    if [ $missing -ne 0 ]; then fail=1; echo "--- $log"; cat "$log"; return; fi
    echo "== $c: $(grep -m1 -E 'Invalid (read|write)|Conditional jump|definitely lost in loss record' "$log" | sed 's/^==[0-9]*== //')"
}

clean_run() {   # name, program...: memcheck must report nothing
    local name=$1; shift
    local log=$B/vg_$name.log
    "${VG[@]}" --log-file="$log" "$@" >"$B/vg_$name.out" 2>&1
    local rc=$?
    # forked children (test_heap forks) write to the same log: the first
    # line names the process run here
    local pid; pid=$(sed -n '1s/^==\([0-9]*\)==.*/\1/p' "$log")
    if [ $rc -ne 0 ] || ! grep -q "^==$pid== ERROR SUMMARY: 0 errors" "$log"; then
        echo "valgrind: $name: exit status $rc under memcheck"; fail=1
        tail -40 "$B/vg_$name.out"; cat "$log"; return
    fi
    echo "== $name: $(grep "^==$pid== " "$log" | grep -o 'ERROR SUMMARY: .*'); $(grep "^==$pid== " "$log" | grep -oE '(definitely lost: .*|All heap blocks were freed.*)')"
}

plain_case() {   # case, on the library without client requests: memcheck must see nothing
    local c=$1 log=$B/vg_demo_plain.$1.log
    "${VG[@]}" --log-file="$log" "$B/vg_demo_plain" "$c" >/dev/null 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then echo "valgrind: $c: memcheck saw it without KP_VALGRIND too (exit status $rc)"; fail=1; fi
}

CASES="uaf-small uaf-large uaf-pool uaf-arena overflow uninit leak"
for c in $CASES; do expect_case "$c"; done
if [ -x "$B/vg_demo_plain" ]; then
    for c in $CASES; do plain_case "$c"; done
    [ $fail -eq 0 ] && echo "== each of them missed by memcheck with KP_VALGRIND=0 (vg_demo_plain)"
fi
clean_run demo_clean "$B/vg_demo" clean
for t in test_heap test_pool test_arena; do clean_run $t --suppressions="$HERE/tests.supp" "$B/$t"; done
[ $fail -eq 0 ] && echo "valgrind: every detection seen, clean runs clean"
exit $fail
