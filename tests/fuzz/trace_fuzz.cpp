// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness for read_allocation_trace: any input is read to a trace or refused with a
// trace_error; nothing else may escape, crash or grow without bound.
#include <gpukit/memory/allocation_trace.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  std::istringstream in{std::string{reinterpret_cast<char const*>(data), size}};
  gpukit::trace_limits limits;
  limits.max_line_chars = 256;
  limits.max_streams    = 16;
  try {
    gpukit::allocation_trace const t = gpukit::read_allocation_trace(in, "fuzz", limits);
    // What a replay relies on: dense ids and streams within the counts.
    for (auto const& e : t.events) {
      if (e.id >= t.ids || (e.alloc && e.stream >= t.streams)) { std::abort(); }
    }
  } catch (gpukit::trace_error const&) {}
  return 0;
}
