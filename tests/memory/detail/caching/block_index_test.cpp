// SPDX-License-Identifier: Apache-2.0
// detail::caching::block_index alone, with no runtime: blocks of a fake segment (plain addresses,
// never dereferenced) split, carved, coalesced and recycled, and the tiling checked after each
// step.
#include <gpukit/memory/detail/caching/block_index.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

struct no_runtime {
  using stream_type = int;  // a stream is a number here
};
using block = gpukit::detail::caching_block<no_runtime>;
using index = gpukit::detail::caching::block_index<block>;
using gpukit::detail::block_state;
using free_list = gpukit::detail::tlsf_index<block>;

constexpr std::size_t kib = 1024;

// Indices as the allocator keeps them: the global one (the index's own) and one per stream.
struct indices {
  index& idx;
  free_list per_stream[4];
  free_list& operator()(block* b)
  {
    return b->global ? idx.global(b->kind) : per_stream[b->stream];
  }
};

// A segment of `bytes` at a fake address, as one free block of `stream`, indexed.
block* segment(index& idx, indices& where, std::uintptr_t at, std::size_t bytes, int stream)
{
  block* b = idx.new_block();
  idx.add_segment(b, reinterpret_cast<void*>(at), bytes, &idx);
  b->stream = stream;
  b->state.store(block_state::free);
  where(b).insert(b);
  return b;
}

// The blocks of the segment starting at `head` tile [head, head + bytes) and are all in the map.
void check_tiling(index const& idx, block const* head, std::size_t bytes)
{
  std::uintptr_t at = head->address();
  block const* prev = nullptr;
  for (block const* x = head; x != nullptr; x = x->next) {
    CHECK(x->address() == at);
    CHECK(x->prev == prev);
    CHECK(idx.find(x->address()) == x);
    at += x->size;
    prev = x;
  }
  CHECK(at == head->address() + bytes);
}

}  // namespace

TEST_SUITE("block_index")
{
  TEST_CASE("a carve splits off the tail, free and indexed where its block was")
  {
    index idx;
    indices where{idx, {}};
    block* s = segment(idx, where, 0x100000, 64 * kib, 1);
    CHECK(where.per_stream[1].find(4 * kib) == s);
    block* b = idx.carve(s, 4 * kib, where);
    CHECK(b == s);
    CHECK(b->size == 4 * kib);
    CHECK(b->state.load() == block_state::allocated);
    REQUIRE(b->next != nullptr);
    CHECK(b->next->size == 60 * kib);
    CHECK(b->next->state.load() == block_state::free);
    CHECK(where.per_stream[1].count() == 1);
    CHECK(where.per_stream[1].bytes() == 60 * kib);
    CHECK(idx.size() == 2);
    check_tiling(idx, s, 64 * kib);
  }

  TEST_CASE("a tail under 256 bytes stays with the block")
  {
    index idx;
    indices where{idx, {}};
    block* s = segment(idx, where, 0x200000, 4 * kib, 0);
    block* b = idx.carve(s, 4 * kib - 256, where);
    CHECK(b->size == 4 * kib - 256);
    CHECK(b->next != nullptr);  // 256 bytes: split
    block* t = idx.new_block();
    idx.add_segment(t, reinterpret_cast<void*>(0x300000), 1024, &idx);
    t->state.store(block_state::free);
    where(t).insert(t);
    block* c = idx.carve(t, 1024 - 128, where);  // a 128-byte tail: no split
    CHECK(c->size == 1024);
    CHECK(c->next == nullptr);
  }

  TEST_CASE("freeing coalesces with free neighbours of the same stream, keeping the first address")
  {
    index idx;
    indices where{idx, {}};
    block* s = segment(idx, where, 0x400000, 16 * kib, 2);
    block* a = idx.carve(s, 4 * kib, where);
    block* b = idx.carve(where.per_stream[2].find(4 * kib), 4 * kib, where);
    block* c = idx.carve(where.per_stream[2].find(4 * kib), 4 * kib, where);
    CHECK(idx.size() == 4);
    check_tiling(idx, a, 16 * kib);
    // Free the middle one: its neighbours are allocated, nothing merges.
    CHECK(idx.insert_free(b, where) == b);
    CHECK(idx.size() == 4);
    // Free the first: it absorbs b and keeps its own address.
    CHECK(idx.insert_free(a, where) == a);
    CHECK(a->size == 8 * kib);
    CHECK(idx.size() == 3);
    // Free the third: the block before it absorbs it and the free tail after it.
    block* whole = idx.insert_free(c, where);
    CHECK(whole == a);
    CHECK(whole->size == 16 * kib);
    CHECK(whole->next == nullptr);
    CHECK(idx.size() == 1);
    CHECK(where.per_stream[2].count() == 1);
    CHECK(where.per_stream[2].bytes() == 16 * kib);
    check_tiling(idx, whole, 16 * kib);
  }

  TEST_CASE("blocks of different streams do not merge; a global block takes the other's stream")
  {
    index idx;
    indices where{idx, {}};
    block* s = segment(idx, where, 0x500000, 12 * kib, 1);
    block* a = idx.carve(s, 4 * kib, where);
    block* b = idx.carve(where.per_stream[1].find(4 * kib), 4 * kib, where);
    block* c = where.per_stream[1].find(4 * kib);
    REQUIRE(c != nullptr);
    idx.carve(c, 4 * kib, where);
    a->stream = 3;  // freed on stream 3: not mergeable with stream 1's blocks
    idx.insert_free(a, where);
    c->stream = 1;
    idx.insert_free(c, where);
    CHECK(idx.size() == 3);
    // b freed as usable on any stream merges with the block before it and takes its stream (3);
    // then it no longer merges with c (stream 1).
    b->global = true;
    block* m  = idx.insert_free(b, where);
    CHECK(m == a);
    CHECK(m->size == 8 * kib);
    CHECK(!m->global);
    CHECK(m->stream == 3);
    CHECK(idx.size() == 2);
    CHECK(where.per_stream[3].count() == 1);
    CHECK(where.per_stream[1].count() == 1);
    CHECK(idx.global(0).empty());
    check_tiling(idx, m, 12 * kib);
  }

  TEST_CASE("blocks of different capture pools never merge")
  {
    index idx;
    indices where{idx, {}};
    block* s = segment(idx, where, 0x600000, 8 * kib, 0);
    block* a = idx.carve(s, 4 * kib, where);
    block* b = a->next;
    where(b).remove(b);
    b->state.store(block_state::allocated);
    b->capture_pool = 7;
    idx.insert_free(a, where);
    CHECK(!index::mergeable(a, b));
    CHECK(idx.size() == 2);
  }

  TEST_CASE("descriptors are recycled, never freed, and come back clean")
  {
    index idx;
    std::vector<block*> got;
    for (std::size_t i = 0; i < index::chunk_blocks + 3; ++i) { got.push_back(idx.new_block()); }
    block* b        = got.back();
    b->capture_pool = 9;
    b->recorded.push_back(2);
    idx.recycle(b);
    CHECK(b->state.load() == block_state::dead);
    block* again = idx.new_block();
    CHECK(again == b);  // the spare list is LIFO
    CHECK(again->capture_pool == 0);
    CHECK(again->recorded.empty());
    CHECK(again->free_next == nullptr);
  }

  TEST_CASE("remove takes a whole segment out of the map")
  {
    index idx;
    indices where{idx, {}};
    block* s = segment(idx, where, 0x700000, 2 * kib, 0);
    CHECK(idx.find(reinterpret_cast<void const*>(0x700000)) == s);
    where(s).remove(s);
    idx.remove(s);
    CHECK(idx.size() == 0);
    CHECK(idx.find(std::uintptr_t{0x700000}) == nullptr);
    CHECK(s->state.load() == block_state::dead);
  }

  TEST_CASE("the global indices are per pool kind")
  {
    index idx;
    indices where{idx, {}};
    block* s = idx.new_block();
    idx.add_segment(s, reinterpret_cast<void*>(0x800000), 8 * kib, &idx);
    s->kind   = 1;
    s->global = true;
    s->state.store(block_state::free);
    where(s).insert(s);
    CHECK(idx.global(1).find(8 * kib) == s);
    CHECK(idx.global(0).find(256) == nullptr);
    CHECK(idx.global_bytes() == 8 * kib);
  }

  TEST_CASE("a free list visits every block, or those of a size's class and above, by its bitmaps")
  {
    index idx;
    indices where{idx, {}};
    std::vector<std::size_t> const sizes = {256,
                                            768,
                                            4 * kib,
                                            3 * kib,
                                            1024 * kib,
                                            2048 * kib,
                                            2048 * kib + 256,
                                            3072 * kib,
                                            64 * 1024 * kib};
    std::uintptr_t at                    = 0x10000000;
    for (std::size_t bytes : sizes) {
      segment(idx, where, at, bytes, 0);
      at += 128 * 1024 * kib;
    }
    free_list const& list = where.per_stream[0];
    std::vector<std::size_t> all;
    list.for_each([&](block* b) { all.push_back(b->size); });
    CHECK(all.size() == sizes.size());
    for (std::size_t from : {std::size_t{0}, std::size_t{100}, 3 * kib, 2048 * kib, 2100 * kib,
                             64 * 1024 * kib, 128 * 1024 * kib}) {
      CAPTURE(from);
      std::size_t visited = 0, at_least = 0;
      list.for_each_from(from, [&](block* b) {
        ++visited;
        at_least += b->size >= from ? 1 : 0;
        // Only the class holding `from` may hold a smaller block.
        if (b->size < from && from >= 256) {
          CHECK(gpukit::detail::tlsf_floor_class(b->size) ==
                gpukit::detail::tlsf_floor_class(from));
        }
      });
      std::size_t expected = 0;
      for (std::size_t bytes : sizes) { expected += bytes >= from ? 1 : 0; }
      CHECK(at_least == expected);  // every block of at least `from` bytes
      CHECK(visited >= expected);
    }
    // The classes below 2 MiB are skipped: the 256 B .. 1 MiB blocks are not visited.
    std::size_t visited = 0;
    list.for_each_from(2048 * kib, [&](block*) { ++visited; });
    CHECK(visited == 4);
  }
}
