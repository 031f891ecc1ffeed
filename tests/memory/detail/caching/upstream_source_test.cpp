// SPDX-License-Identifier: Apache-2.0
// detail::caching::upstream_source alone: segments taken from and given back to a user's
// resource through the entry point family it has, with the size, alignment and stream taken.
#include "support/sim_gpu.hpp"

#include <gpukit/memory/detail/caching/upstream_source.hpp>
#include <gpukit/memory/malloc_async_resource.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

using namespace gpukit::test;  // sim_stream_fixture, mib
using gpukit::sim_runtime;
using sim_source  = gpukit::detail::caching::upstream_source<sim_runtime::stream_type>;
using cuda_source = gpukit::detail::caching::upstream_source<cudaStream_t>;

namespace {

// What a resource saw: every call with its arguments.
struct call {
  char what;  // 'a' allocate, 'd' deallocate
  void* p;
  std::size_t bytes;
  std::size_t align;  // 0: the call has none
  std::uintptr_t stream;
};

// A synchronous resource in CCCL 3.0's spelling only (host memory: nothing is dereferenced).
struct sync_resource {
  std::vector<call>* calls;
  void* allocate(std::size_t bytes, std::size_t align)
  {
    void* p = ::operator new (bytes, std::align_val_t{align});
    calls->push_back({'a', p, bytes, align, 0});
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t align)
  {
    calls->push_back({'d', p, bytes, align, 0});
    ::operator delete (p, std::align_val_t{align});
  }
};

// A stream-ordered resource in CCCL 3.1's spelling only, over CUDA streams (never launched on).
struct cccl31_resource {
  std::vector<call>* calls;
  void* allocate(cuda::stream_ref s, std::size_t bytes, std::size_t align)
  {
    void* p = ::operator new (bytes, std::align_val_t{align});
    calls->push_back({'a', p, bytes, align, reinterpret_cast<std::uintptr_t>(s.get())});
    return p;
  }
  void deallocate(cuda::stream_ref s, void* p, std::size_t bytes, std::size_t align)
  {
    calls->push_back({'d', p, bytes, align, reinterpret_cast<std::uintptr_t>(s.get())});
    ::operator delete (p, std::align_val_t{align});
  }
  void* allocate_sync(std::size_t bytes, std::size_t align) { return allocate({}, bytes, align); }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align)
  {
    deallocate({}, p, bytes, align);
  }
};

// A resource that is out of memory.
struct full_resource {
  void* allocate(std::size_t, std::size_t) { throw std::bad_alloc{}; }
  void deallocate(void*, std::size_t, std::size_t) {}
};

}  // namespace

TEST_SUITE("upstream_source")
{
  TEST_CASE("without a resource it is not engaged")
  {
    sim_source none;
    CHECK_FALSE(none.engaged());
    CHECK_FALSE(none.stream_ordered());
  }

  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "a gpukit resource gives stream-ordered segments on the allocator's stream")
  {
    gpukit::basic_malloc_async_resource<sim_runtime> mr{sim, 0};
    sim_source src{mr};
    REQUIRE(src.engaged());
    CHECK(src.stream_ordered());
    void* p = src.allocate(2 * mib, s);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % sim_source::alignment == 0);
    src.deallocate(p, 2 * mib, s);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
    // Given back to the resource, which keeps or frees it: taking it again succeeds.
    void* q = src.allocate(2 * mib, s);
    CHECK(q != nullptr);
    src.deallocate(q, 2 * mib, s);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
  }

  TEST_CASE("a synchronous CCCL 3.0 resource is used with the segment's size and alignment")
  {
    std::vector<call> calls;
    sync_resource r{&calls};
    sim_source src{r};
    CHECK_FALSE(src.stream_ordered());
    void* p = src.allocate(4096, sim_runtime::stream_type{});
    src.deallocate(p, 4096, sim_runtime::stream_type{});
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].what == 'a');
    CHECK(calls[0].bytes == 4096);
    CHECK(calls[0].align == sim_source::alignment);
    CHECK(calls[1].what == 'd');
    CHECK(calls[1].p == p);
    CHECK(calls[1].bytes == 4096);
    CHECK(calls[1].align == sim_source::alignment);
  }

  TEST_CASE("a CCCL 3.1 resource over CUDA streams gets the allocator's stream as a stream_ref")
  {
    std::vector<call> calls;
    cccl31_resource r{&calls};
    cuda_source src{r};
    CHECK(src.stream_ordered());
    auto const stream = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1234});
    void* p           = src.allocate(8192, stream);
    src.deallocate(p, 8192, stream);
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].stream == 0x1234);
    CHECK(calls[1].stream == 0x1234);
    CHECK(calls[1].p == p);
    CHECK(calls[1].align == cuda_source::alignment);
  }

  TEST_CASE("the resource's out-of-memory error reaches the caller")
  {
    full_resource r;
    sim_source src{r};
    CHECK_THROWS_AS((void)src.allocate(mib, sim_runtime::stream_type{}), std::bad_alloc);
  }
}
