// SPDX-License-Identifier: Apache-2.0
// gpukit/profile/nvtx.hpp: NVTX ranges and marks that cost nothing when no tool listens.
//
// Quick start:
//
//   #include <gpukit/profile/nvtx.hpp>
//
//   #include <string>
//
//   void forward();
//
//   void train_step(std::string const& layer_name, int layer)
//   {
//     GPUKIT_FUNC_RANGE();  // "train_step" in the gpukit domain, for the scope
//     {
//       GPUKIT_RANGE("forward");  // a literal name: registered once, colored once
//       forward();
//     }
//     gpukit::scoped_range r{"backward"};  // nvtx3::v1::scoped_range_in<gpukit::nvtx_domain>
//     gpukit::named_range n{layer_name.c_str(), gpukit::payload{layer}};  // colored by name
//     gpukit::mark("checkpoint saved");                            // an instant event
//   }
//
//   // Ranges in your own domain (its own row in Nsight Systems):
//   struct my_lib {
//     static constexpr char const* name{"my_lib"};
//   };
//
//   void decode()
//   {
//     GPUKIT_RANGE_IN(my_lib, "decode");
//     auto const transfer = gpukit::category_of<gpukit::categories::transfer>();
//     gpukit::named_range_in<my_lib> r{"encode", transfer};
//   }
//
// Everything here is NVTX3 (`nvtx3::v1::`, the versioned names, so that another copy of NVTX in the
// program cannot clash) in a domain named "gpukit". With no tool attached (no Nsight, no
// NVTX_INJECTION64_PATH) a range costs what NVTX3's own does (about 2 ns): names given to the
// GPUKIT_RANGE macros are registered strings built once per call site, colors are computed once per
// call site, nothing allocates. `named_range` hashes its name on each construction to pick a color
// (a few ns for short names); prefer the macros on hot paths.
//
// Define GPUKIT_DISABLE_NVTX (or NVTX_DISABLE, which NVTX3 itself honors) before including this
// header, or on the command line, and every range, mark and macro here compiles to nothing. The two
// builds live in different inline namespaces, so translation units built each way can share a
// program without an ODR violation.
//
// gpukit's own ranges: the allocator, the pinned pool, the transfer pipeline and the checkpoint
// executor mark their slow paths (segments allocated, grown, released or trimmed, each step of the
// out-of-memory ladder, pinned growth, staged chunks, recomputation) with ranges in this domain,
// in the categories `allocator`, `pinned_pool`, `transfer` and `checkpoint`; never on the cached
// allocate/free path. Define GPUKIT_DISABLE_INTERNAL_NVTX (alike in every translation unit) to
// compile those away and keep your own.
//
// Colors: `name_color(name)` maps a name to a stable, saturated ARGB color (FNV-1a hash to a hue),
// the same in every run and process, so a phase keeps its color across profiles.
#pragma once

#if defined(NVTX_DISABLE) && !defined(GPUKIT_DISABLE_NVTX)
#define GPUKIT_DISABLE_NVTX
#endif

#include <nvtx3/nvtx3.hpp>

#include <cstdint>
#include <string_view>

namespace gpukit {

/// The NVTX domain of gpukit's own ranges (a tag type, as NVTX3 expects): "gpukit".
struct nvtx_domain {
  static constexpr char const* name{"gpukit"};
};

// NVTX3's building blocks, by their versioned names.
using rgb              = nvtx3::v1::rgb;       ///< a color from red, green, blue
using argb             = nvtx3::v1::argb;      ///< a color with alpha
using color            = nvtx3::v1::color;     ///< an event's color
using category         = nvtx3::v1::category;  ///< a category id (unnamed)
using payload          = nvtx3::v1::payload;   ///< an int64/uint64/int32/uint32/float/double
using message          = nvtx3::v1::message;   ///< an event's text
using event_attributes = nvtx3::v1::event_attributes;  ///< message, color, category, payload
/// A string registered once with the domain `D` (`gpukit::nvtx_domain` by default).
template <class D = nvtx_domain>
using registered_string_in = nvtx3::v1::registered_string_in<D>;
/// A category with a name, registered once with the domain `D`.
template <class D = nvtx_domain>
using named_category_in = nvtx3::v1::named_category_in<D>;

/// Maps `name` to a stable opaque ARGB color: FNV-1a of the bytes picks a hue, saturation and value
/// are fixed (0.75, 0.9) so every color reads well on Nsight's dark and light themes. constexpr:
/// free at run time for literals.
[[nodiscard]] constexpr std::uint32_t name_color(std::string_view name) noexcept
{
  std::uint32_t h = 2166136261u;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  // HSV to RGB with integer arithmetic: hue in [0, 1536) (6 sectors of 256).
  std::uint32_t const hue = (h ^ (h >> 16)) % 1536u;
  std::uint32_t const v   = 230;            // value 0.9
  std::uint32_t const lo  = v - v * 3 / 4;  // v * (1 - s), s = 0.75
  std::uint32_t const f   = hue % 256u;     // position inside the sector
  std::uint32_t const dn  = v - (v - lo) * f / 256u;
  std::uint32_t const up  = lo + (v - lo) * f / 256u;
  std::uint32_t r = 0, g = 0, b = 0;
  switch (hue / 256u) {
    case 0: r = v, g = up, b = lo; break;
    case 1: r = dn, g = v, b = lo; break;
    case 2: r = lo, g = v, b = up; break;
    case 3: r = lo, g = dn, b = v; break;
    case 4: r = up, g = lo, b = v; break;
    default: r = v, g = lo, b = dn; break;
  }
  return 0xFF000000u | (r << 16) | (g << 8) | b;
}

/// `name_color(name)` as an NVTX color.
[[nodiscard]] constexpr color color_for(std::string_view name) noexcept
{
  std::uint32_t const c = name_color(name);
  return color{argb{0xFF, static_cast<std::uint8_t>(c >> 16), static_cast<std::uint8_t>(c >> 8),
                    static_cast<std::uint8_t>(c)}};
}

/// gpukit's predefined categories (tags for `category_of`): ids 1..7 in any domain, named on
/// first use. gpukit's own ranges use one per component: allocator, pinned_pool, transfer,
/// checkpoint.
namespace categories {
struct memory {  ///< allocation, release, defragmentation
  static constexpr std::uint32_t id{1};
  static constexpr char const* name{"memory"};
};
struct transfer {  ///< host-device copies, staging
  static constexpr std::uint32_t id{2};
  static constexpr char const* name{"transfer"};
};
struct compute {  ///< forward, backward, optimizer
  static constexpr std::uint32_t id{3};
  static constexpr char const* name{"compute"};
};
struct checkpoint {  ///< activation checkpointing: recompute, offload
  static constexpr std::uint32_t id{4};
  static constexpr char const* name{"checkpoint"};
};
struct sync {  ///< waits on streams, events, devices
  static constexpr std::uint32_t id{5};
  static constexpr char const* name{"sync"};
};
struct allocator {  ///< the caching allocator's segments and out-of-memory recovery
  static constexpr std::uint32_t id{6};
  static constexpr char const* name{"allocator"};
};
struct pinned_pool {  ///< the pinned host pool's growth
  static constexpr std::uint32_t id{7};
  static constexpr char const* name{"pinned pool"};
};
}  // namespace categories

#ifndef GPUKIT_DISABLE_NVTX
inline namespace nvtx_enabled {

/// A range for the lifetime of a scope in domain `D`: NVTX3's own scoped range (push on
/// construction, pop on destruction, on the calling thread). Takes what `event_attributes` takes,
/// in any order: a message (`char const*`, registered string), color, category, payload.
template <class D = nvtx_domain>
using scoped_range_in = nvtx3::v1::scoped_range_in<D>;

/// A scoped range in the gpukit domain (`nvtx3::v1::scoped_range_in<gpukit::nvtx_domain>`).
using scoped_range = scoped_range_in<nvtx_domain>;

/// A range that may end on another thread, or outlive its scope (start/end, not push/pop):
/// movable, ends when destroyed.
template <class D = nvtx_domain>
using unique_range_in = nvtx3::v1::unique_range_in<D>;
/// A unique range in the gpukit domain.
using unique_range = unique_range_in<nvtx_domain>;

/// The named category `C` (a tag with `id` and `name`, e.g. `categories::transfer`) of domain `D`.
template <class C, class D = nvtx_domain>
[[nodiscard]] inline named_category_in<D> const& category_of() noexcept
{
  return named_category_in<D>::template get<C>();
}

/// A scoped range whose color is derived from its name (`name_color`). `args` are more event
/// attributes (payload, category, or a color that overrides the derived one). `name` must outlive
/// the constructor only. Hashes the name once per construction.
template <class D = nvtx_domain>
class named_range_in {
 public:
  template <class... Args>
  explicit named_range_in(char const* name, Args const&... args) noexcept
  {
    // In nvtx3's event_attributes the first attribute of a kind wins: the caller's go first.
    nvtxDomainRangePushEx(nvtx3::v1::domain::get<D>(),
                          event_attributes{args..., message{name}, color_for(name)}.get());
  }
  ~named_range_in() noexcept { nvtxDomainRangePop(nvtx3::v1::domain::get<D>()); }
  named_range_in(named_range_in const&)            = delete;
  named_range_in& operator=(named_range_in const&) = delete;
  named_range_in(named_range_in&&)                 = delete;
  named_range_in& operator=(named_range_in&&)      = delete;
  void* operator new(std::size_t)                  = delete;
};
/// A named range in the gpukit domain.
using named_range = named_range_in<nvtx_domain>;

/// An instant event named `name` in domain `D`, colored by `name_color`, with optional attributes.
template <class D = nvtx_domain, class... Args>
inline void mark_in(char const* name, Args const&... args) noexcept
{
  nvtxDomainMarkEx(nvtx3::v1::domain::get<D>(),
                   event_attributes{args..., message{name}, color_for(name)}.get());
}
/// An instant event in the gpukit domain.
template <class... Args>
inline void mark(char const* name, Args const&... args) noexcept
{
  mark_in<nvtx_domain>(name, args...);
}

/// True: ranges are compiled in (false when GPUKIT_DISABLE_NVTX or NVTX_DISABLE is defined).
inline constexpr bool nvtx_compiled_in = true;

}  // namespace nvtx_enabled
#else   // GPUKIT_DISABLE_NVTX
inline namespace nvtx_disabled {

/// Compiled out: takes any arguments and does nothing.
template <class D = nvtx_domain>
class scoped_range_in {
 public:
  template <class... Args>
  explicit scoped_range_in(Args const&...) noexcept
  {}
  scoped_range_in(scoped_range_in const&)            = delete;
  scoped_range_in& operator=(scoped_range_in const&) = delete;
};
using scoped_range = scoped_range_in<nvtx_domain>;
/// Compiled out: takes any arguments and does nothing.
template <class D = nvtx_domain>
class unique_range_in {
 public:
  template <class... Args>
  explicit unique_range_in(Args const&...) noexcept
  {}
};
using unique_range = unique_range_in<nvtx_domain>;
template <class D = nvtx_domain>
using named_range_in = scoped_range_in<D>;
using named_range    = named_range_in<nvtx_domain>;
/// Compiled out: a category without a name (never registered).
template <class C, class D = nvtx_domain>
[[nodiscard]] inline category category_of() noexcept
{
  return category{C::id};
}
template <class D = nvtx_domain, class... Args>
inline void mark_in(char const*, Args const&...) noexcept
{}
template <class... Args>
inline void mark(char const*, Args const&...) noexcept
{}
inline constexpr bool nvtx_compiled_in = false;

}  // namespace nvtx_disabled
#endif  // GPUKIT_DISABLE_NVTX

}  // namespace gpukit

#define GPUKIT_NVTX_CONCAT_DETAIL(a, b) a##b
#define GPUKIT_NVTX_CONCAT(a, b)        GPUKIT_NVTX_CONCAT_DETAIL(a, b)

#ifndef GPUKIT_DISABLE_NVTX
namespace gpukit::detail {
/// The first macro argument: a range's name.
constexpr char const* nvtx_first(char const* name) noexcept { return name; }
template <class... Rest>
constexpr char const* nvtx_first(char const* name, Rest const&...) noexcept
{
  return name;
}
/// The attributes of a GPUKIT_RANGE without extra attributes: the call site's static ones.
[[nodiscard]] inline nvtx3::v1::event_attributes const& nvtx_attributes(
  nvtx3::v1::event_attributes const& fixed, char const*) noexcept
{
  return fixed;
}
/// With extra attributes (payload, category, color): the caller's first (the first of a kind
/// wins), then the registered name and its color.
template <class First, class... Rest>
[[nodiscard]] inline nvtx3::v1::event_attributes nvtx_attributes(
  nvtx3::v1::event_attributes const& fixed, char const*, First const& first,
  Rest const&... rest) noexcept
{
  nvtx3::v1::event_attributes a{first, rest...};
  nvtxEventAttributes_t const& f = *fixed.get();
  nvtxEventAttributes_t& out     = const_cast<nvtxEventAttributes_t&>(*a.get());
  if (out.messageType == NVTX_MESSAGE_UNKNOWN) {
    out.messageType = f.messageType;
    out.message     = f.message;
  }
  if (out.colorType == NVTX_COLOR_UNKNOWN) {
    out.colorType = f.colorType;
    out.color     = f.color;
  }
  return a;
}
}  // namespace gpukit::detail

/// A range named by the string literal that starts `...`, in domain `D`, until the end of the
/// enclosing scope; more attributes (payload, category, color) may follow the name. The name is
/// registered with the domain and its color computed once per call site: a range costs one push
/// and one pop.
#define GPUKIT_RANGE_IN(D, ...)                                                                \
  static ::nvtx3::v1::registered_string_in<D> const GPUKIT_NVTX_CONCAT(                        \
    gpukit_range_name_, __LINE__){::gpukit::detail::nvtx_first(__VA_ARGS__)};                  \
  static ::nvtx3::v1::event_attributes const GPUKIT_NVTX_CONCAT(gpukit_range_attr_, __LINE__){ \
    GPUKIT_NVTX_CONCAT(gpukit_range_name_, __LINE__),                                          \
    ::gpukit::color_for(::gpukit::detail::nvtx_first(__VA_ARGS__))};                           \
  ::nvtx3::v1::scoped_range_in<D> const GPUKIT_NVTX_CONCAT(gpukit_range_, __LINE__)            \
  {                                                                                            \
    ::gpukit::detail::nvtx_attributes(GPUKIT_NVTX_CONCAT(gpukit_range_attr_, __LINE__),        \
                                      __VA_ARGS__)                                             \
  }
/// A range for the rest of the enclosing function, named after it (`__func__`), colored by its
/// name, in domain `D`.
#define GPUKIT_FUNC_RANGE_IN(D)                                                        \
  static ::nvtx3::v1::registered_string_in<D> const gpukit_func_range_name_{__func__}; \
  static ::nvtx3::v1::event_attributes const gpukit_func_range_attr_{                  \
    gpukit_func_range_name_, ::gpukit::color_for(__func__)};                           \
  ::nvtx3::v1::scoped_range_in<D> const gpukit_func_range_ { gpukit_func_range_attr_ }
#else
#define GPUKIT_RANGE_IN(D, ...) static_cast<void>(0)
#define GPUKIT_FUNC_RANGE_IN(D) static_cast<void>(0)
#endif

/// GPUKIT_RANGE_IN in the gpukit domain.
#define GPUKIT_RANGE(...) GPUKIT_RANGE_IN(::gpukit::nvtx_domain, __VA_ARGS__)
/// GPUKIT_FUNC_RANGE_IN in the gpukit domain.
#define GPUKIT_FUNC_RANGE() GPUKIT_FUNC_RANGE_IN(::gpukit::nvtx_domain)
