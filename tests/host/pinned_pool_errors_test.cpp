// SPDX-License-Identifier: Apache-2.0
// The errors a pinned pool throws when the runtime fails it, read after the throw: cuda_error keeps
// the failed call as a pointer, which must still name text once the pool has returned.
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <functional>
#include <string>

using gpukit::sim_op;
using gpukit::sim_runtime;
using sim_pool = gpukit::basic_pinned_pool<sim_runtime>;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

gpukit::sim_config small_gpu()
{
  return gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30);
}

/// Runs `grow` once with the next `op` failing, and returns the cuda_error's call() and what(),
/// read after the pool has returned.
struct caught {
  std::string call;
  std::string what;
  int code{cudaSuccess};
};

caught fail_growth(sim_runtime& sim, sim_op op, std::function<void()> const& grow)
{
  sim.inject_fault(op, 1, cudaErrorMemoryAllocation);
  caught c;
  try {
    grow();
    FAIL("the growth should have thrown");
  } catch (gpukit::cuda_error const& e) {
    c.call = e.call();
    c.what = e.what();
    c.code = static_cast<cudaError_t>(e.code());
  }
  return c;
}

bool has(std::string const& text, char const* part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_SUITE("pinned_pool")
{
  TEST_CASE("pinned_pool: a failed growth's cuda_error names its call after the pool returns")
  {
    struct growth_case {
      gpukit::pinned_growth growth;
      sim_op op;
      char const* runtime_call;
    };
    for (growth_case const g :
         {growth_case{gpukit::pinned_growth::map_and_register, sim_op::host_register,
                      "host_register"},
          growth_case{gpukit::pinned_growth::host_alloc, sim_op::host_alloc, "host_alloc"}}) {
      CAPTURE(g.runtime_call);
      sim_runtime sim{small_gpu()};
      gpukit::pinned_pool_options o;
      o.growth = g.growth;
      sim_pool pool{sim, o};
      struct member_case {
        char const* name;
        std::function<void()> grow;
      };
      for (member_case const& m :
           {member_case{"pinned_pool::allocate", [&] { (void)pool.allocate(3 * mib); }},
            member_case{"pinned_pool::reserve", [&] { pool.reserve(8 * mib); }},
            member_case{"pinned_pool::prewarm", [&] { pool.prewarm(mib, 2); }}}) {
        CAPTURE(m.name);
        caught const c = fail_growth(sim, g.op, m.grow);
        CHECK(c.code == cudaErrorMemoryAllocation);
        CHECK(has(c.call, g.runtime_call));
        CHECK(has(c.call, m.name));
        CHECK(has(c.what, c.call.c_str()));
        CHECK(pool.stats().reserved_bytes.current == 0);
      }
    }
  }

  TEST_CASE("pinned_pool: release_cached throws the first failed free once every range is tried")
  {
    sim_runtime sim{small_gpu()};
    sim_pool pool{sim};  // map_and_register: ranges are given back with host_unregister
    pool.reserve(4 * mib);
    pool.reserve(4 * mib);
    sim.inject_fault(sim_op::host_unregister, 1, cudaErrorInvalidValue);
    sim.inject_fault(sim_op::host_unregister, 2, cudaErrorHostMemoryNotRegistered);
    std::string call;
    try {
      (void)pool.release_cached();
      FAIL("release_cached should have thrown");
    } catch (gpukit::cuda_error const& e) {
      CHECK(e.code() == cudaErrorInvalidValue);  // the first failure, not the second
      call = e.call();
    }
    CHECK(call == "host_unregister (pinned_pool::release_cached)");
    auto const s = pool.stats();
    CHECK(s.num_host_unregisters == 2);  // both ranges were tried
    CHECK(s.segment_count.current == 2);
  }
}
