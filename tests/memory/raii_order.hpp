// SPDX-License-Identifier: Apache-2.0
// tests/memory/raii_order.hpp: every gpukit RAII type that refers to another, built the way a
// program uses them, then destroyed in a chosen order. raii_order_test runs every pair in both
// orders on the simulated GPU (and checks what the simulator can tell), raii_gpu_test on the real
// one.
#pragma once

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/cuda_stream.hpp>
#include <gpukit/memory/device_buffer.hpp>
#include <gpukit/memory/device_scalar.hpp>
#include <gpukit/memory/device_uvector.hpp>
#include <gpukit/transfer/prefetcher.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace gpukit::test::raii_order {

constexpr std::size_t kib = 1024;

template <class Runtime>
struct types {
  using alloc   = gpukit::basic_caching_allocator<Runtime>;
  using stream  = gpukit::basic_cuda_stream<Runtime>;
  using streams = gpukit::basic_stream_pool<Runtime>;
  using buffer  = gpukit::basic_device_buffer<alloc>;
  using uvector = gpukit::device_uvector<int, alloc>;
  using scalar  = gpukit::device_scalar<double, alloc>;
  using pinned  = gpukit::basic_pinned_pool<Runtime>;
  using pbuffer = gpukit::pinned_buffer<Runtime>;
  using pipe    = gpukit::basic_transfer_pipeline<Runtime>;
  using loader  = gpukit::basic_prefetcher<Runtime>;
};

/// The objects, in the order a user may declare them (each after what it refers to). Their names
/// hide gpukit's types in this namespace: name those with gpukit::.
enum object : int {
  allocator,
  stream,
  stream_pool,
  buffer,
  uvector,
  scalar,
  pinned_pool,
  pinned_buffer,
  pipeline,
  prefetcher,
  object_count
};

inline char const* name(int o)
{
  static constexpr std::array<char const*, object_count> names{
    "allocator",     "stream",      "stream_pool",   "device_buffer", "device_uvector",
    "device_scalar", "pinned_pool", "pinned_buffer", "pipeline",      "prefetcher"};
  return names[static_cast<std::size_t>(o)];
}

/// Every object, each using what it refers to the way a program does: the allocator served the
/// owning stream and a stream of the pool (so both must make it forget them), the buffers hold
/// its memory, the pinned buffer a pool's, and the pipeline staged a pageable copy through the
/// pool's chunks (so it holds them, each with an event); the prefetcher loads batches from it,
/// one of them handed out and not released.
template <class Runtime>
struct kit {
  using t = types<Runtime>;
  explicit kit(Runtime& rt) : batches(4, std::vector<unsigned char>(96 * kib, 7))
  {
    alloc.emplace(rt, 0);
    s.emplace(rt);
    pool.emplace(2, rt);
    {
      typename t::buffer on_pool{64 * kib, pool->get_stream(1), *alloc};  // freed on a pool stream
    }
    b.emplace(300 * kib, *s, *alloc);
    v.emplace(1000, pool->get_stream(0), *alloc);
    v->set_element_to_zero_async(7, pool->get_stream(0));
    x.emplace(2.5, *s, *alloc);
    pinned.emplace(rt);
    pb.emplace(pinned->acquire(10 * kib));
    std::memset(pb->data(), 0x5a, 10 * kib);
    transfer_options o;
    o.chunk_bytes     = 64 * kib;
    o.staging_threads = 2;
    pipe.emplace(rt, *pinned, o);
    std::vector<unsigned char> host(b->size(), 0xa5);
    pipe->copy_to_device_async(b->data(), host.data(), host.size(), host_memory::pageable,
                               s->value());
    loader.emplace(*pipe, *alloc, [this](std::size_t i) {
      if (i == batches.size()) { return host_batch{}; }
      return host_batch{batches[i].data(), batches[i].size()};
    });
    auto const first = loader->next(s->value());
    REQUIRE(first.has_value());  // handed out, never released: the prefetcher frees it
  }

  void destroy(int o)
  {
    switch (o) {
      case allocator: alloc.reset(); break;
      case stream: s.reset(); break;
      case stream_pool: pool.reset(); break;
      case buffer: b.reset(); break;
      case uvector: v.reset(); break;
      case scalar: x.reset(); break;
      case pinned_pool: pinned.reset(); break;
      case pinned_buffer: pb.reset(); break;
      case pipeline: pipe.reset(); break;
      case prefetcher: loader.reset(); break;
      default: FAIL("no object " << o);
    }
  }

  std::vector<std::vector<unsigned char>> batches;  // the prefetcher's source
  std::optional<typename t::alloc> alloc;
  std::optional<typename t::stream> s;
  std::optional<typename t::streams> pool;
  std::optional<typename t::buffer> b;
  std::optional<typename t::uvector> v;
  std::optional<typename t::scalar> x;
  std::optional<typename t::pinned> pinned;
  std::optional<typename t::pbuffer> pb;
  std::optional<typename t::pipe> pipe;
  std::optional<typename t::loader> loader;
};

/// Builds a kit on `rt`, calls built(), destroys `order` first (in that order), then the rest
/// newest first, and waits for the device.
template <class Runtime, class Built>
void build_and_destroy(Runtime& rt, std::vector<int> const& order, Built&& built)
{
  {
    kit<Runtime> k{rt};
    built();
    for (int o : order) { k.destroy(o); }
    for (int o = object_count - 1; o >= 0; --o) { k.destroy(o); }
  }
  REQUIRE(rt.device_synchronize() == cudaSuccess);  // stream-ordered frees have run
}

/// "a, b, c" for `order`.
inline std::string describe(std::vector<int> const& order)
{
  std::string what;
  for (int o : order) { what += std::string{what.empty() ? "" : ", "} + name(o); }
  return what;
}

/// Calls run(order) for every ordered pair of objects, each in a subcase of its own named "a
/// before b" (no commas: doctest splits -sc filters on them, so that one pair can run alone:
/// -sc="allocator before stream"), then for the declaration order and its reverse.
template <class Run>
void every_order(Run&& run)
{
  for (int first = 0; first < object_count; ++first) {
    for (int second = 0; second < object_count; ++second) {
      if (first == second) { continue; }
      std::string const pair = std::string{name(first)} + " before " + name(second);
      SUBCASE(pair.c_str()) { run(std::vector<int>{first, second}); }
    }
  }
  std::vector<int> forward;
  for (int o = 0; o < object_count; ++o) { forward.push_back(o); }
  SUBCASE("declaration order") { run(forward); }  // each object before what it refers to
  SUBCASE("reverse declaration order") { run(std::vector<int>{forward.rbegin(), forward.rend()}); }
}

}  // namespace gpukit::test::raii_order
