// SPDX-License-Identifier: Apache-2.0
// tests/support/doctest_main.hpp: what gpukit's two doctest mains (tests/test_main.cpp,
// tests/gpu_main.cpp) share. Include it in exactly one translation unit, after defining
// DOCTEST_CONFIG_IMPLEMENT.
//
// run_cases runs doctest and turns a run whose every case skipped itself (support/skip.hpp) into
// exit code 77, which CTest reports as skipped.
#pragma once

#include "support/skip.hpp"

#include <doctest/doctest.h>

#include <atomic>

namespace gpukit::test {
namespace detail {

/// The cases that started in this run (a listener: it prints nothing).
inline std::atomic<int>& started_cases()
{
  static std::atomic<int> count{0};
  return count;
}

struct case_counter final : doctest::IReporter {
  explicit case_counter(doctest::ContextOptions const&) {}
  void report_query(doctest::QueryData const&) override {}
  void test_run_start() override {}
  void test_run_end(doctest::TestRunStats const&) override {}
  void test_case_start(doctest::TestCaseData const&) override { started_cases().fetch_add(1); }
  void test_case_reenter(doctest::TestCaseData const&) override {}
  void test_case_end(doctest::CurrentTestCaseStats const&) override {}
  void test_case_exception(doctest::TestCaseException const&) override {}
  void subcase_start(doctest::SubcaseSignature const&) override {}
  void subcase_end() override {}
  void log_assert(doctest::AssertData const&) override {}
  void log_message(doctest::MessageData const&) override {}
  void test_case_skipped(doctest::TestCaseData const&) override {}
};

}  // namespace detail

/// The code a test binary whose every case skipped itself exits with: CTest's SKIP_RETURN_CODE.
inline constexpr int skip_exit_code = 77;

/// Runs the cases `argv` selects; 77 when every case that ran skipped itself and none failed.
inline int run_cases(int argc, char** argv)
{
  doctest::Context context{argc, argv};
  int const failed = context.run();
  if (context.shouldExit() || failed != 0) { return failed; }
  int const started = detail::started_cases().load();
  if (started > 0 && skipped_cases().load() == started) { return skip_exit_code; }
  return 0;
}

}  // namespace gpukit::test

DOCTEST_REGISTER_LISTENER("gpukit_case_counter", 0, gpukit::test::detail::case_counter);
