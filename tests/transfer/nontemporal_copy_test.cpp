// SPDX-License-Identifier: Apache-2.0
// The staging threads' streaming-store copy, on its own: every length and alignment around its
// 64-byte lines copies exactly, and choosing its body leaves no macro behind for users.
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

TEST_SUITE("transfer")
{
  TEST_CASE("transfer_pipeline.hpp leaves no GPUKIT_HAVE_STREAMING_STORES macro behind")
  {
    bool leaked = false;
#ifdef GPUKIT_HAVE_STREAMING_STORES
    leaked = true;
#endif
    CHECK_FALSE(leaked);
  }

  TEST_CASE("copy_nontemporal: every head, line and tail length copies exactly, nothing beyond")
  {
    constexpr std::size_t room = 512;
    std::vector<unsigned char> src(room), dst(room);
    for (std::size_t i = 0; i < room; ++i) { src[i] = static_cast<unsigned char>(i * 7 + 3); }
    for (std::size_t dst_off : {0, 1, 15, 63}) {
      for (std::size_t src_off : {0, 5, 64}) {
        for (std::size_t bytes : {0, 1, 63, 64, 65, 127, 128, 200, 300}) {
          CAPTURE(dst_off);
          CAPTURE(src_off);
          CAPTURE(bytes);
          std::fill(dst.begin(), dst.end(), std::uint8_t{0xEE});
          gpukit::detail::copy_nontemporal(dst.data() + dst_off, src.data() + src_off, bytes);
          bool same = true;
          for (std::size_t i = 0; i < room; ++i) {
            bool const inside        = i >= dst_off && i < dst_off + bytes;
            unsigned char const want = inside ? src[i - dst_off + src_off] : 0xEE;
            same                     = same && dst[i] == want;
          }
          CHECK(same);
        }
      }
    }
  }
}
