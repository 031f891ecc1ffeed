# SPDX-License-Identifier: Apache-2.0
# The gpukit-plan executable end to end: its output format (the schedule, then a JSON line with
# time and peak), reading a file or standard input, the planners, revolve, and every error path
# (exit status and a message naming the problem).
#   cmake -DTOOL=<gpukit-plan> -DOUT=<scratch dir> -P gpukit_plan_cli.cmake
cmake_minimum_required(VERSION 3.25)
file(MAKE_DIRECTORY "${OUT}")
set(CLI_STDIN "${OUT}/empty.chain")  # what a case reads unless it names a chain
set(CLI_QUIET_FAILURES ON)           # errors go to standard error only
include(${CMAKE_CURRENT_LIST_DIR}/cli_expect.cmake)

# Chains. hand: the simulator's hand-worked chain (store-all: time 66, peak 66). uniform8: 8
# stages (1 2 1 2), whose least persistent budget is 5 and whose optimal time at budget 15 is 28.
file(WRITE "${OUT}/hand.chain" "# f b a t\n1 10 10 1\n2 20 20 2\n\n3 30 30 3\n")
file(WRITE "${OUT}/uniform8.chain" "")
foreach(i RANGE 1 8)
  file(APPEND "${OUT}/uniform8.chain" "1 2 1 2\n")
endforeach()
file(WRITE "${OUT}/uniform5.chain" "1 1 1 1\n1 1 1 1\n1 1 1 1\n1 1 1 1\n1 1 1 1\n")
file(WRITE "${OUT}/fields.chain" "1 2 3 4\n1 2 3\n")
file(WRITE "${OUT}/word.chain" "# comment\n\n1 2 x 4\n")
file(WRITE "${OUT}/negative.chain" "1 2 3 4\n1 2 -5 4\n")
file(WRITE "${OUT}/extra.chain" "1 2 3 4 5\n")
file(WRITE "${OUT}/empty.chain" "# nothing but a comment\n")

set(json_num "-?[0-9]+")

# ---- plans -------------------------------------------------------------------------------------
expect(store-all EXIT 0 LINES 2
  STDOUT "^Fe1 Fe2 Fe3 B3 B2 B1\n"
  LAST "^{\"planner\": \"store-all\", \"stages\": 3, \"budget\": null, \"time\": 66, \"peak\": 66, .*}$"
  ARGS --chain "${OUT}/hand.chain" --planner store-all)
expect(optimal-from-stdin EXIT 0 LINES 2 STDIN "${OUT}/hand.chain"
  LAST "\"budget\": 66, \"time\": 66, \"peak\": 66,"
  ARGS --budget 66)
expect(best-is-the-default EXIT 0 LINES 2
  STDOUT "^(Fn|Fe|B)[0-9]+( (Fn|Fe|B)[0-9]+)* B1\n"
  LAST "^{\"planner\": \"best\", \"stages\": 8, \"budget\": 15, \"time\": 27, \"peak\": (1[0-5]|[0-9]), \"recomputations\": ${json_num}, \"exact\": true}$"
  ARGS --chain "${OUT}/uniform8.chain" --budget 15)
# rotor's program alone misses the optimum by one: not "exact".
expect(optimal-not-proven EXIT 0 LINES 2
  LAST "^{\"planner\": \"optimal\", \"stages\": 8, \"budget\": 15, \"time\": 28, .*\"exact\": false}$"
  ARGS --chain "${OUT}/uniform8.chain" --budget 15 --planner optimal)
# The 6-stage chain on which rotor's program takes 54 at budget 25 and the optimum is 51.
file(WRITE "${OUT}/gap6.chain" "5 1 4 5\n6 1 2 4\n3 6 5 1\n3 4 1 5\n3 1 1 5\n5 2 3 6\n")
expect(best-closes-the-gap EXIT 0 LINES 2
  LAST "\"planner\": \"best\", \"stages\": 6, \"budget\": 25, \"time\": 51, .*\"exact\": true}$"
  ARGS --chain "${OUT}/gap6.chain" --budget 25)
# Offload: at infinite bandwidth, store-all's time (8 x 3) at budget 20, below its peak of 40.
string(REPEAT "1 2 4 1\n" 8 chain_a4)
file(WRITE "${OUT}/act8.chain" "${chain_a4}")
file(WRITE "${OUT}/act8bw.chain" "bandwidth inf\n${chain_a4}")
expect(offload-infinite-bandwidth EXIT 0 LINES 2
  STDOUT "^Fe1 Fe2 O1 .* P1 B2 B1\n"
  LAST "^{\"planner\": \"offload\", \"stages\": 8, \"budget\": 20, \"time\": 24, \"peak\": (1[0-9]|20), \"recomputations\": 0, \"exact\": true, \"offloads\": [1-9], \"copy_time\": 0, \"stall\": 0}$"
  ARGS --chain "${OUT}/act8.chain" --budget 20 --planner offload --bandwidth inf)
expect(offload-bandwidth-line EXIT 0 LINES 2 LAST "\"time\": 24, .*\"offloads\": [1-9]"
  ARGS --chain "${OUT}/act8bw.chain" --budget 20 --planner offload)
expect(offload-needs-bandwidth EXIT 2 STDERR "--planner offload needs a copy bandwidth"
  ARGS --chain "${OUT}/act8.chain" --budget 20 --planner offload)
expect(bandwidth-zero EXIT 2 STDERR "--bandwidth 0: a copy bandwidth is positive"
  ARGS --chain "${OUT}/act8.chain" --budget 20 --planner offload --bandwidth 0)
expect(exhaustive EXIT 0 LINES 2
  LAST "\"planner\": \"exhaustive\", \"stages\": 6, \"budget\": 25, \"time\": 51, .*\"exact\": true}$"
  ARGS --chain "${OUT}/gap6.chain" --budget 25 --planner exhaustive)
string(REPEAT "1 2 1 2\n" 12 chain12)
file(WRITE "${OUT}/uniform12.chain" "${chain12}")
expect(exhaustive-too-long EXIT 2 STDERR "--planner exhaustive takes chains of up to 11 stages; this one has 12"
  ARGS --chain "${OUT}/uniform12.chain" --budget 50 --planner exhaustive)
expect(optimal-equals-sign EXIT 0 LINES 2 LAST "\"budget\": 5, \"time\": ${json_num}, \"peak\": 5,"
  ARGS --chain=${OUT}/uniform8.chain --budget=5 --planner=optimal)
expect(sequential EXIT 0 LINES 2
  STDOUT "^Fn1 Fn2 Fe3 Fe4 Fe5 B5 B4 B3 Fe1 Fe2 B2 B1\n"
  LAST "\"planner\": \"sequential:2\", \"stages\": 5, \"budget\": null, \"time\": 12,"
  ARGS --chain "${OUT}/uniform5.chain" --planner sequential:2)
expect(sqrt EXIT 0 LINES 2
  LAST "\"planner\": \"sqrt\", \"stages\": 5, \"budget\": 100, \"time\": ${json_num}, \"peak\": ${json_num}"
  ARGS --chain "${OUT}/uniform5.chain" --planner sqrt --budget 100)
expect(chain-from-dash EXIT 0 LINES 2 STDIN "${OUT}/uniform5.chain" LAST "\"stages\": 5,"
  ARGS --chain - --planner store-all)
expect(revolve EXIT 0 LINES 2
  STDOUT "^(Fn|Fe|B)[0-9]+( (Fn|Fe|B)[0-9]+)* Fe1 B1\n"
  LAST "^{\"steps\": 10, \"slots\": 3, \"advances\": 15}$"
  ARGS revolve --steps 10 --slots 3)
expect(revolve-one-slot EXIT 0 LINES 2 LAST "\"advances\": 6}$" ARGS revolve --slots 1 --steps 4)
expect(help EXIT 0 STDOUT "usage: gpukit-plan" "  best  " "  optimal  " "  exhaustive  " "sequential:K"
  "  offload  " "--bandwidth B"
  ARGS --help)

# ---- infeasible budgets (exit 3) ----------------------------------------------------------------
expect(optimal-infeasible EXIT 3 STDERR "budget 4 is infeasible" "the least budget is 5"
  ARGS --chain "${OUT}/uniform8.chain" --budget 4)
expect(store-all-infeasible EXIT 3 STDERR "budget 10 is infeasible" "needs a budget of at least 66"
  ARGS --chain "${OUT}/hand.chain" --planner store-all --budget 10)
expect(sqrt-infeasible EXIT 3 STDERR "budget 1 is infeasible for sqrt"
  ARGS --chain "${OUT}/uniform5.chain" --planner sqrt --budget 1)

# ---- malformed input (exit 1) -------------------------------------------------------------------
expect(too-few-fields EXIT 1 STDERR "fields.chain: checkpoint chain: line 2 has 3 fields, expected 4"
  ARGS --chain "${OUT}/fields.chain" --planner store-all)
expect(not-an-integer EXIT 1 STDERR "line 3: \"x\" is not an integer"
  ARGS --chain "${OUT}/word.chain" --budget 10)
expect(negative-value EXIT 1 STDERR "line 2: output size a = -5 is negative"
  ARGS --chain "${OUT}/negative.chain" --budget 10)
expect(too-many-fields EXIT 1 STDERR "line 1 has more than 4 fields"
  ARGS --chain "${OUT}/extra.chain" --budget 10)
expect(stdin-malformed EXIT 1 STDIN "${OUT}/negative.chain"
  STDERR "standard input: checkpoint chain: line 2: output size a = -5"
  ARGS --budget 10)
expect(empty-chain EXIT 1 STDERR "a chain needs at least one stage" ARGS --budget 10)
expect(missing-file EXIT 1 STDERR "cannot open the chain file \"${OUT}/nope.chain\""
  ARGS --chain "${OUT}/nope.chain" --budget 10)

# ---- bad command lines (exit 2) -----------------------------------------------------------------
expect(unknown-option EXIT 2 STDERR "unknown option \"--bogus\"" "usage:" ARGS --bogus 3)
expect(stray-argument EXIT 2 STDERR "unexpected argument \"plan\"" ARGS plan)
expect(budget-not-a-number EXIT 2 STDERR "--budget: \"12x\" is not a non-negative integer"
  ARGS --chain "${OUT}/hand.chain" --budget 12x)
expect(budget-negative EXIT 2 STDERR "--budget: \"-3\" is not a non-negative integer"
  ARGS --chain "${OUT}/hand.chain" --budget -3)
expect(budget-missing-value EXIT 2 STDERR "--budget needs a value" ARGS --budget)
expect(best-needs-budget EXIT 2 STDERR "the best planner needs --budget"
  ARGS --chain "${OUT}/hand.chain")
expect(exhaustive-needs-budget EXIT 2 STDERR "the exhaustive planner needs --budget"
  ARGS --chain "${OUT}/hand.chain" --planner exhaustive)
expect(unknown-planner EXIT 2
  STDERR "--planner \"fastest\" is not one of best, optimal, exhaustive, sqrt, sequential:K, store-all, offload"
  ARGS --chain "${OUT}/hand.chain" --planner fastest)
expect(sequential-zero EXIT 2 STDERR "0 segments is outside 1..5"
  ARGS --chain "${OUT}/uniform5.chain" --planner sequential:0)
expect(sequential-too-many EXIT 2 STDERR "9 segments is outside 1..5"
  ARGS --chain "${OUT}/uniform5.chain" --planner sequential:9)
expect(sequential-beyond-int EXIT 2 STDERR "99999999999999999999 segments is outside 1..5"
  ARGS --chain "${OUT}/uniform5.chain" --planner sequential:99999999999999999999)
# Numbers beyond any integer type are usage errors naming the option and the value, never aborts.
expect(budget-twenty-digits EXIT 2
  STDERR "--budget: \"99999999999999999999\" is not a non-negative integer below 10\\^18"
  ARGS --chain "${OUT}/hand.chain" --budget 99999999999999999999)
expect(bandwidth-twenty-digits EXIT 2
  STDERR "--bandwidth: \"18446744073709551616\" is not a non-negative integer below 10\\^18"
  ARGS --chain "${OUT}/act8.chain" --budget 20 --planner offload --bandwidth 18446744073709551616)
expect(revolve-steps-beyond-int EXIT 2 STDERR "--steps 2147483648 is outside 1..4096"
  ARGS revolve --steps 2147483648 --slots 3)
expect(revolve-slots-twenty-digits EXIT 2
  STDERR "--slots: \"99999999999999999999\" is not a non-negative integer below 10\\^18"
  ARGS revolve --steps 4 --slots 99999999999999999999)
expect(sequential-no-k EXIT 2 STDERR "K in sequential:K must be a positive integer"
  ARGS --chain "${OUT}/uniform5.chain" --planner sequential:)
expect(option-twice EXIT 2 STDERR "--budget is given twice" ARGS --budget 3 --budget 4)
expect(revolve-no-steps EXIT 2 STDERR "revolve needs --steps L" ARGS revolve --slots 3)
expect(revolve-zero-steps EXIT 2 STDERR "--steps 0 is outside 1..4096" ARGS revolve --steps 0 --slots 3)
expect(revolve-zero-slots EXIT 2 STDERR "--slots 0 is below 1" ARGS revolve --steps 4 --slots 0)
expect(revolve-foreign-option EXIT 2 STDERR "unknown option \"--budget\" for revolve"
  ARGS revolve --steps 4 --slots 2 --budget 3)

# ---- inputs whose tables would not fit (exit 1, refused before anything is allocated) ----------
string(REPEAT "1 2 1 2\n" 16384 long_chain)
file(WRITE "${OUT}/long16384.chain" "${long_chain}")
expect(optimal-too-many-stages EXIT 1
  STDERR "the best planner on 16384 stages needs tables of about [0-9]+ MiB, over the limit of 1024 MiB"
  "at most [0-9]+ stages"
  ARGS --chain "${OUT}/long16384.chain" --budget 50)
expect(long-chain-sqrt EXIT 0 LINES 2 LAST "\"stages\": 16384,"
  ARGS --chain "${OUT}/long16384.chain" --planner store-all)
expect(revolve-too-much-work EXIT 1
  STDERR "revolve with --steps 4096 and --slots 100000 takes about [0-9]+ table steps, over the limit of [0-9]+"
  ARGS revolve --steps 4096 --slots 100000)

expect_summary()
