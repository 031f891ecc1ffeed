// SPDX-License-Identifier: Apache-2.0
// The Runtime contract as data: the traits it generates, the checks that hold for every operation
// on the simulated GPU, the committed table docs/runtime_contract.md, and the error macros that
// name a failed call.
#include <gpukit/runtime/contract.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace {

using gpukit::sim_op;
using gpukit::sim_runtime;

// ---- Traits
// ---------------------------------------------------------------------------------------

static_assert(gpukit::is_runtime_v<sim_runtime>);
static_assert(gpukit::is_runtime_v<gpukit::cuda_runtime>);
static_assert(std::is_same_v<sim_runtime::error_type, cudaError_t>);
static_assert(std::is_same_v<gpukit::cuda_runtime::error_type, cudaError_t>);
static_assert(sim_runtime::out_of_memory == cudaErrorMemoryAllocation);
static_assert(gpukit::cuda_runtime::capture_mode_relaxed == cudaStreamCaptureModeRelaxed);

/// A runtime offering only the core: it forwards every core operation to a simulated GPU and
/// declares nothing else of the contract (no physical_handle, no ipc_mem_handle, no capture).
template <bool WithoutOneCall>
class core_only : public gpukit::detail::cuda_error_vocabulary {
 public:
  using stream_type                  = sim_runtime::stream_type;
  using event_type                   = sim_runtime::event_type;
  static constexpr bool is_simulated = true;
  static core_only& instance();

#define GPUKIT_TEST_FORWARD(name, params, doc) \
  template <class... A>                        \
  [[nodiscard]] error_type name(A&&... a)      \
  {                                            \
    return sim_->name(std::forward<A>(a)...);  \
  }
  GPUKIT_RUNTIME_DEVICE_OPS(GPUKIT_TEST_FORWARD)
  GPUKIT_RUNTIME_MEMORY_OPS(GPUKIT_TEST_FORWARD)
  GPUKIT_RUNTIME_HOST_OPS(GPUKIT_TEST_FORWARD)
  GPUKIT_RUNTIME_STREAM_OPS(GPUKIT_TEST_FORWARD)
  GPUKIT_RUNTIME_COPY_OPS(GPUKIT_TEST_FORWARD)
  // The events, less event_elapsed_time when asked to leave one call out.
  GPUKIT_TEST_FORWARD(event_create, , )
  GPUKIT_TEST_FORWARD(event_destroy, , )
  GPUKIT_TEST_FORWARD(event_record, , )
  GPUKIT_TEST_FORWARD(event_query, , )
  GPUKIT_TEST_FORWARD(event_synchronize, , )
#undef GPUKIT_TEST_FORWARD
  template <bool B = WithoutOneCall, class = std::enable_if_t<!B>>
  [[nodiscard]] error_type event_elapsed_time(float& ms, event_type a, event_type b)
  {
    return sim_->event_elapsed_time(ms, a, b);
  }

 private:
  sim_runtime* sim_{nullptr};
};

static_assert(gpukit::runtime_has_core_v<core_only<false>>);
static_assert(!gpukit::runtime_has_vm_v<core_only<false>>);
static_assert(!gpukit::runtime_has_ipc_v<core_only<false>>);
static_assert(!gpukit::runtime_has_capture_v<core_only<false>>);
static_assert(!gpukit::is_runtime_v<core_only<false>>);
static_assert(!gpukit::runtime_has_core_v<core_only<true>>, "a missing core call is noticed");
static_assert(!gpukit::runtime_has_core_v<int>);

// ---- Every operation
// -----------------------------------------------------------------------------

/// Value-initialized arguments for a signature `void (*)(A...)`, kept as lvalues so that output
/// parameters bind.
template <class F>
struct arguments_of;
template <class... A>
struct arguments_of<void (*)(A...)> {
  using type = std::tuple<std::remove_cv_t<std::remove_reference_t<A>>...>;
};

template <class F, class Call>
cudaError_t call_with_defaults(Call call)
{
  typename arguments_of<F>::type args{};
  return std::apply([&](auto&... a) { return call(a...); }, args);
}

}  // namespace

TEST_SUITE("runtime")
{
  TEST_CASE("contract: every operation has a sim_op of its own name")
  {
    CHECK(static_cast<std::size_t>(sim_op::count_) == gpukit::runtime_op_count);
    std::set<std::string> names;
    for (int i = 0; i < static_cast<int>(sim_op::count_); ++i) {
      std::string const name = gpukit::to_string(static_cast<sim_op>(i));
      CHECK(name != "unknown");
      CHECK(names.insert(name).second);
    }
#define GPUKIT_TEST_NAME(name, params, doc) \
  CHECK(std::string{gpukit::to_string(sim_op::name)} == #name);
    GPUKIT_RUNTIME_OPS(GPUKIT_TEST_NAME)
#undef GPUKIT_TEST_NAME
    CHECK(std::string{gpukit::to_string(sim_op::count_)} == "unknown");
  }

  TEST_CASE("contract: both shipped runtimes name their errors as CUDA does")
  {
    for (auto const name : {sim_runtime::error_name, gpukit::cuda_runtime::error_name}) {
      CHECK(std::string{name(sim_runtime::success)} == "cudaSuccess");
      CHECK(std::string{name(sim_runtime::not_ready)} == "cudaErrorNotReady");
      CHECK(std::string{name(sim_runtime::out_of_memory)} == "cudaErrorMemoryAllocation");
    }
  }

  TEST_CASE("contract: every operation can be made to fail by injection, counts and reports it")
  {
    sim_runtime rt{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
#define GPUKIT_TEST_INJECT(name, params, doc)                                                      \
  {                                                                                                \
    INFO("operation: " #name);                                                                     \
    using signature         = decltype(&gpukit::detail::runtime_signatures_of<sim_runtime>::name); \
    auto const calls_before = rt.calls(sim_op::name);                                              \
    rt.inject_fault(sim_op::name, 1, cudaErrorECCUncorrectable);                                   \
    cudaError_t const e =                                                                          \
      call_with_defaults<signature>([&](auto&... a) { return rt.name(a...); });                    \
    CHECK(e == cudaErrorECCUncorrectable);                                                         \
    CHECK(rt.calls(sim_op::name) == calls_before + 1);                                             \
    CHECK(rt.pending_faults() == 0);                                                               \
  }
    GPUKIT_RUNTIME_OPS(GPUKIT_TEST_INJECT)
#undef GPUKIT_TEST_INJECT
    CHECK(rt.misuse_count() == 0);  // an injected fault is not a misuse
  }
}

// ---- The documentation table
// ---------------------------------------------------------------------

namespace {

std::string render_contract_doc()
{
  std::ostringstream out;
  out
    << "# The Runtime contract\n\n"
       "Generated from the lists in `include/gpukit/runtime/contract.hpp` by\n"
       "`tests/runtime/contract_test.cpp` (run `runtime_contract_test` with\n"
       "`GPUKIT_UPDATE_CONTRACT_DOC=1` to rewrite it); a test fails when this copy is stale.\n\n"
       "Every operation returns the runtime's `error_type`: `success`, or the error, already\n"
       "cleared from any last-error slot the platform keeps. Unless its line says otherwise an\n"
       "operation acts on the calling thread's current device, does not block, and may be called\n"
       "from any thread. A component checks the capabilities it uses with\n"
       "`gpukit::runtime_has_core_v<R>`, `runtime_has_vm_v<R>`, `runtime_has_ipc_v<R>` and\n"
       "`runtime_has_capture_v<R>`; `is_runtime_v<R>` is all four.\n";
#define GPUKIT_TEST_ROW(name, params, doc) out << "| `" #name "` | `" #params "` | " doc " |\n";
#define GPUKIT_TEST_SECTION(capability, title, list)                   \
  out << "\n## " title " (`" #capability "`)\n\n"                      \
      << "| operation | parameters | what it does |\n|---|---|---|\n"; \
  list(GPUKIT_TEST_ROW)
  GPUKIT_RUNTIME_SECTIONS(GPUKIT_TEST_SECTION)
#undef GPUKIT_TEST_SECTION
#undef GPUKIT_TEST_ROW
  out
    << "\n## Named error codes (`static constexpr error_type`)\n\n| name | meaning |\n|---|---|\n";
#define GPUKIT_TEST_CONSTANT(name, doc) out << "| `" #name "` | " doc " |\n";
  GPUKIT_RUNTIME_ERRORS(GPUKIT_TEST_CONSTANT)
  out << "\n## Capture modes (`static constexpr int`, for `exchange_capture_mode`)\n\n"
         "| name | meaning |\n|---|---|\n";
  GPUKIT_RUNTIME_CAPTURE_MODES(GPUKIT_TEST_CONSTANT)
#undef GPUKIT_TEST_CONSTANT
  return out.str();
}

/// The source tree: the first of this file's folder (when __FILE__ is absolute) and the working
/// directory's ancestors that holds the contract; empty when none does (an installed test).
std::string source_tree()
{
  auto const holds_contract = [](std::string const& dir) {
    return std::ifstream{dir + "/include/gpukit/runtime/contract.hpp"}.good();
  };
  std::string here = __FILE__;  // <source>/tests/runtime/contract_test.cpp, maybe relative
  for (int i = 0; i < 3 && here.find('/') != std::string::npos; ++i) {
    here = here.substr(0, here.find_last_of('/'));
  }
  if (!here.empty() && here.front() == '/' && holds_contract(here)) { return here; }
  std::string dir = std::filesystem::current_path().string();
  while (!dir.empty() && dir != "/") {
    if (holds_contract(dir)) { return dir; }
    dir = std::filesystem::path{dir}.parent_path().string();
  }
  return {};
}

bool no_source_tree() { return source_tree().empty(); }

}  // namespace

TEST_SUITE("runtime")
{
  TEST_CASE("contract: docs/runtime_contract.md is the table the lists render" *
            doctest::skip(no_source_tree()))
  {
    std::string const path     = source_tree() + "/docs/runtime_contract.md";
    std::string const rendered = render_contract_doc();
    if (char const* update = std::getenv("GPUKIT_UPDATE_CONTRACT_DOC");
        update != nullptr && std::string{update} == "1") {
      std::ofstream{path} << rendered;
    }
    std::ifstream in{path};
    REQUIRE_MESSAGE(in.good(), "missing " << path);
    std::stringstream committed;
    committed << in.rdbuf();
    CHECK_MESSAGE(committed.str() == rendered,
                  path << " is stale: rerun with GPUKIT_UPDATE_CONTRACT_DOC=1 and commit it");
  }
}

// ---- Error macros
// ----------------------------------------------------------------------------------

namespace {

/// A runtime family that is not CUDA: its errors must be named by its own traits.
enum class fake_error { ok, broken };

}  // namespace

template <>
struct gpukit::error_traits<fake_error> {
  static constexpr fake_error success = fake_error::ok;
  static char const* name(fake_error e) noexcept
  {
    return e == fake_error::ok ? "fakeSuccess" : "fakeBroken";
  }
  static char const* description(fake_error) noexcept { return "the fake device broke"; }
};

namespace {

template <class Fn>
std::string message_of(Fn fn)
{
  std::string message = "no exception";
  try {
    fn();
  } catch (gpukit::cuda_error const& e) {
    message = e.what();
  }
  return message;
}

bool contains(std::string const& s, std::string const& part)
{
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_SUITE("runtime")
{
  TEST_CASE("GPUKIT_CUDA_TRY names errors through the failing runtime's own traits")
  {
    auto const m = message_of([] { GPUKIT_CUDA_TRY(fake_error::broken); });
    CHECK(contains(m, "fakeBroken"));
    CHECK(contains(m, "the fake device broke"));
    CHECK_NOTHROW(GPUKIT_CUDA_TRY(fake_error::ok));

    sim_runtime rt{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
    void* p = nullptr;
    try {
      GPUKIT_CUDA_TRY(rt.malloc(&p, std::size_t{2} << 30));
      FAIL("no exception");
    } catch (gpukit::cuda_error const& e) {
      CHECK(e.code() == sim_runtime::out_of_memory);
      CHECK(std::string{e.name()} == sim_runtime::error_name(sim_runtime::out_of_memory));
      CHECK(contains(e.what(),
                     "rt.malloc(&p, std::size_t{2} << 30) failed with "
                     "cudaErrorMemoryAllocation"));
    }
  }

  TEST_CASE(
    "GPUKIT_CUDA_TRY of a status variable says so, and the two-argument form names the call")
  {
    sim_runtime rt{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
    cudaError_t const r = rt.stream_destroy(reinterpret_cast<sim_runtime::stream_type>(12345));
    REQUIRE(r == sim_runtime::invalid_resource_handle);

    auto const plain = message_of([&] { GPUKIT_CUDA_TRY(r); });
    CHECK_FALSE(contains(plain, "gpukit: r failed"));
    CHECK(contains(plain,
                   "the runtime call whose status is `r` failed with "
                   "cudaErrorInvalidResourceHandle"));

    auto const named = message_of([&] { GPUKIT_CUDA_TRY(r, "stream_destroy(s)"); });
    CHECK(contains(named, "gpukit: stream_destroy(s) failed with cudaErrorInvalidResourceHandle"));
  }

  TEST_CASE("cuda_error keeps its own copy of the call's text")
  {
    auto const make = [] {
      std::string what = "host_register (a pool made for this test)";
      try {
        gpukit::detail::throw_cuda_error(cudaErrorInvalidValue, what.c_str(), "here.cpp", 7, true);
      } catch (gpukit::cuda_error const& e) {
        return e;
      }
      return gpukit::cuda_error{0, "", "", "", "", 0};
    };
    gpukit::cuda_error const e = make();
    std::string const overwrite(64, 'x');  // reuse the freed storage
    CHECK(std::string{e.call()} == "host_register (a pool made for this test)");
    CHECK(e.code() == cudaErrorInvalidValue);
    CHECK(e.line() == 7);
  }
}
