// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness for the GPUKIT_SIM_* parser (sim_config::from_env on given values): the input's
// first line is GPUKIT_SIM_DEVICES, the rest GPUKIT_SIM_CAPACITY (a NUL in either ends it). Any
// value is read to a configuration or refused with a logic_error; an accepted one must say what
// the text says: 1 to 64 devices, and the capacity the digits and suffix spell, without overflow.
#include <gpukit/runtime/sim_runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

// The reference reading: digits, then at most one of K M G T; false when it does not fit 64 bits.
bool reference_bytes(std::string const& text, unsigned __int128& out)
{
  if (text.empty() || text[0] < '0' || text[0] > '9') { return false; }
  unsigned __int128 v = 0;
  std::size_t i       = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    v = v * 10 + static_cast<unsigned>(text[i] - '0');
    if (v > ~std::uint64_t{0}) { return false; }
  }
  unsigned shift = 0;
  if (i < text.size()) {
    switch (text[i]) {
      case 'k':
      case 'K': shift = 10; break;
      case 'm':
      case 'M': shift = 20; break;
      case 'g':
      case 'G': shift = 30; break;
      case 't':
      case 'T': shift = 40; break;
      default: return false;
    }
    ++i;
  }
  if (i != text.size()) { return false; }
  v <<= shift;
  if (v > ~std::uint64_t{0}) { return false; }
  out = v;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  std::string const input{reinterpret_cast<char const*>(data), size};
  auto const nl             = input.find('\n');
  std::string const devices = input.substr(0, std::min(nl, input.find('\0')));
  std::string capacity      = nl == std::string::npos ? std::string{} : input.substr(nl + 1);
  capacity                  = capacity.substr(0, capacity.find('\0'));
  char const* dev_arg = nl == std::string::npos && devices.empty() ? nullptr : devices.c_str();
  try {
    gpukit::sim_config const c = gpukit::detail::sim_config_from_values(
      dev_arg, capacity.empty() ? nullptr : capacity.c_str());
    auto const n = c.device_capacities.size();
    if (n < 1 || n > 64) { std::abort(); }
    unsigned __int128 want = std::uint64_t{80} << 30;
    if (!capacity.empty() && !reference_bytes(capacity, want)) { std::abort(); }  // accepted junk
    for (auto cap : c.device_capacities) {
      if (cap != want) { std::abort(); }
    }
    unsigned __int128 d = 1;
    if (!devices.empty() && (!reference_bytes(devices, d) || d != n)) { std::abort(); }
  } catch (gpukit::logic_error const&) {
    // Refused: then the reference must refuse one of the two too.
    unsigned __int128 v = 0;
    bool const cap_ok   = capacity.empty() || reference_bytes(capacity, v);
    bool const dev_ok =
      devices.empty() || (devices.find_first_not_of("0123456789") == std::string::npos &&
                          reference_bytes(devices, v) && v >= 1 && v <= 64);
    if (cap_ok && dev_ok) { std::abort(); }
  }
  return 0;
}
