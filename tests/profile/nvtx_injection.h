// SPDX-License-Identifier: Apache-2.0
// tests/profile/nvtx_injection.h: what the test NVTX tool (nvtx_injection.cpp) records, and how a
// test reads it.
//
// NVTX loads the library named by NVTX_INJECTION64_PATH on a program's first NVTX call and calls
// its InitializeInjectionNvtx2 (core API: ranges, marks, domains, strings, categories) and, on the
// first call of an extension, InitializeInjectionNvtxExtension (memory API, counters). The library
// records every call in an in-process log; tests reach it with dlopen(path, RTLD_NOLOAD) and dlsym
// (the library is loaded RTLD_LOCAL). Usage: set the variable before the first NVTX call
// (gpukit_test::attach_nvtx_tool() in nvtx_test_support.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

/// What a record describes.
enum gpukit_nvtx_kind : int {
  gpukit_nvtx_push = 1,           ///< nvtxDomainRangePushEx / nvtxRangePush*
  gpukit_nvtx_pop,                ///< nvtxDomainRangePop / nvtxRangePop
  gpukit_nvtx_start,              ///< nvtxDomainRangeStartEx / nvtxRangeStart*: id = range id
  gpukit_nvtx_end,                ///< nvtxDomainRangeEnd / nvtxRangeEnd: id = range id
  gpukit_nvtx_mark,               ///< nvtxDomainMarkEx / nvtxMark*
  gpukit_nvtx_domain_create,      ///< message = domain name
  gpukit_nvtx_register_string,    ///< message = the string
  gpukit_nvtx_name_category,      ///< category, message = name
  gpukit_nvtx_heap_register,      ///< heap = handle returned, address/size, usage, type, message
  gpukit_nvtx_heap_unregister,    ///< heap
  gpukit_nvtx_heap_reset,         ///< heap
  gpukit_nvtx_region_register,    ///< one record per region: heap, address, size
  gpukit_nvtx_region_unregister,  ///< one record per region: address
  gpukit_nvtx_region_resize,      ///< one record per region: address, size
  gpukit_nvtx_region_name,        ///< one record per region: address, message
  gpukit_nvtx_counter_register,   ///< id = counter id returned, message = name, type = schema id
  gpukit_nvtx_counter_sample,     ///< id = counter id, payload_type 1 (int64) or 2 (double)
};

/// One recorded call.
struct gpukit_nvtx_record {
  int kind;                ///< gpukit_nvtx_kind
  char domain[64];         ///< domain name; "" for the global (null) domain
  char message[128];       ///< resolved message (registered strings looked up), "" when none
  int message_type;        ///< nvtxMessageType_t as given (ASCII, REGISTERED, ...), 0 when none
  int color_type;          ///< nvtxColorType_t (1 = ARGB), 0 when none
  std::uint32_t color;     ///< ARGB
  std::uint32_t category;  ///< 0 when none
  int payload_type;        ///< nvtxPayloadType_t, 0 when none
  std::int64_t payload_i;  ///< payload as int64 (INT64, INT32; UINT64/UINT32 reinterpreted)
  double payload_d;        ///< payload as double (DOUBLE, FLOAT)
  std::uint64_t id;        ///< range id (start/end), counter id
  std::uint64_t heap;      ///< heap handle
  std::uint64_t address;   ///< region or heap start
  std::uint64_t size;      ///< region or heap size
  std::uint32_t usage;     ///< heap usage (NVTX_MEM_HEAP_USAGE_TYPE_*)
  std::uint32_t type;      ///< memory type (NVTX_MEM_TYPE_*), or a counter's schema id
  int depth;               ///< push/pop nesting on the calling thread after the call
  std::uint64_t thread;    ///< a per-thread number (1, 2, ... in order of first call)
};

/// Number of records so far.
typedef std::size_t (*gpukit_nvtx_count_fn)(void);
/// Copies record `i` to *out; returns 0 when i is out of range.
typedef int (*gpukit_nvtx_get_fn)(std::size_t i, gpukit_nvtx_record* out);
/// Forgets every record (not domains, strings or heaps).
typedef void (*gpukit_nvtx_clear_fn)(void);
}
