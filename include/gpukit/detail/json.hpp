// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/json.hpp: the JSON writing helpers that every gpukit report shares. Not public
// API.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

namespace gpukit::detail {

/// `s` as a JSON string literal (quotes included), control characters escaped.
inline std::string json_string(std::string_view s)
{
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

/// `v` as a JSON number (null when not finite), with up to 6 significant decimals.
inline std::string json_number(double v)
{
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

/// Appends `[...]` to `o`: write(item) for each item, separated by ", ".
template <class Items, class Write>
void json_list(std::string& o, Items const& items, Write&& write)
{
  o += '[';
  bool first = true;
  for (auto const& item : items) {
    if (!first) o += ", ";
    first = false;
    write(item);
  }
  o += ']';
}

}  // namespace gpukit::detail
