// SPDX-License-Identifier: Apache-2.0
// tests/profile/nvtx_injection.cpp: a minimal NVTX tool (an injection library) for gpukit's tests.
//
// NVTX calls InitializeInjectionNvtx2 once per NVTX instance (each binary and shared library
// carries its own) and InitializeInjectionNvtxExtension once per extension module. This library
// fills the core, domain and memory/counters function slots with recorders, and exports
// gpukit_nvtx_count / gpukit_nvtx_get / gpukit_nvtx_clear to read the log (see nvtx_injection.h).
#include "nvtx_injection.h"

// A tool: the NVTX types and callback ids, not an NVTX instance of its own.
#define NVTX_NO_IMPL

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCounters.h>
#include <nvtx3/nvToolsExtMem.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define GPUKIT_INJ_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct domain_rec {
  std::string name;
};
struct string_rec {
  std::string text;
};

std::mutex& log_mutex()
{
  static std::mutex m;
  return m;
}
std::vector<gpukit_nvtx_record>& log_records()
{
  static std::vector<gpukit_nvtx_record> v;
  return v;
}
// Handles handed out live as long as the process (never freed: NVTX never destroys them safely).
std::deque<domain_rec>& domains()
{
  static std::deque<domain_rec> d;
  return d;
}
std::deque<string_rec>& strings()
{
  static std::deque<string_rec> s;
  return s;
}

std::atomic<std::uint64_t> next_thread{1};
std::atomic<std::uint64_t> next_range{1};
std::atomic<std::uint64_t> next_heap{0x1000};
std::atomic<std::uint64_t> next_counter{1u << 24};
thread_local std::uint64_t this_thread = 0;
thread_local int depth                 = 0;

void copy(char* dst, std::size_t n, char const* src)
{
  if (src == nullptr) src = "";
  std::snprintf(dst, n, "%s", src);
}

gpukit_nvtx_record make(int kind, nvtxDomainHandle_t d)
{
  gpukit_nvtx_record r{};
  r.kind = kind;
  if (this_thread == 0) this_thread = next_thread++;
  r.thread = this_thread;
  if (d != nullptr) copy(r.domain, sizeof r.domain, reinterpret_cast<domain_rec*>(d)->name.c_str());
  return r;
}

void push(gpukit_nvtx_record const& r)
{
  std::lock_guard<std::mutex> lock{log_mutex()};
  log_records().push_back(r);
}

void message_of(gpukit_nvtx_record& r, int type, nvtxMessageValue_t const& m)
{
  r.message_type = type;
  switch (type) {
    case NVTX_MESSAGE_TYPE_ASCII: copy(r.message, sizeof r.message, m.ascii); break;
    case NVTX_MESSAGE_TYPE_REGISTERED:
      copy(r.message, sizeof r.message,
           m.registered ? reinterpret_cast<string_rec*>(m.registered)->text.c_str() : "");
      break;
    case NVTX_MESSAGE_TYPE_UNICODE: copy(r.message, sizeof r.message, "<unicode>"); break;
    default: break;
  }
}

void attributes_of(gpukit_nvtx_record& r, nvtxEventAttributes_t const* a)
{
  if (a == nullptr) return;
  r.color_type   = a->colorType;
  r.color        = a->color;
  r.category     = a->category;
  r.payload_type = a->payloadType;
  switch (a->payloadType) {
    case NVTX_PAYLOAD_TYPE_INT64: r.payload_i = a->payload.llValue; break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64:
      r.payload_i = static_cast<std::int64_t>(a->payload.ullValue);
      break;
    case NVTX_PAYLOAD_TYPE_INT32: r.payload_i = a->payload.iValue; break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32: r.payload_i = a->payload.uiValue; break;
    case NVTX_PAYLOAD_TYPE_DOUBLE: r.payload_d = a->payload.dValue; break;
    case NVTX_PAYLOAD_TYPE_FLOAT: r.payload_d = a->payload.fValue; break;
    default: break;
  }
  message_of(r, a->messageType, a->message);
}

// ---- core2 (domain) API -----------------------------------------------------------------------
void NVTX_API domain_mark(nvtxDomainHandle_t d, nvtxEventAttributes_t const* a)
{
  auto r = make(gpukit_nvtx_mark, d);
  attributes_of(r, a);
  r.depth = depth;
  push(r);
}
nvtxRangeId_t NVTX_API domain_start(nvtxDomainHandle_t d, nvtxEventAttributes_t const* a)
{
  auto r = make(gpukit_nvtx_start, d);
  attributes_of(r, a);
  r.id    = next_range++;
  r.depth = depth;
  push(r);
  return r.id;
}
void NVTX_API domain_end(nvtxDomainHandle_t d, nvtxRangeId_t id)
{
  auto r  = make(gpukit_nvtx_end, d);
  r.id    = id;
  r.depth = depth;
  push(r);
}
int NVTX_API domain_push(nvtxDomainHandle_t d, nvtxEventAttributes_t const* a)
{
  auto r = make(gpukit_nvtx_push, d);
  attributes_of(r, a);
  r.depth = ++depth;
  push(r);
  return r.depth - 1;
}
int NVTX_API domain_pop(nvtxDomainHandle_t d)
{
  auto r  = make(gpukit_nvtx_pop, d);
  r.depth = --depth;
  push(r);
  return r.depth;
}
void NVTX_API domain_name_category(nvtxDomainHandle_t d, std::uint32_t category, char const* name)
{
  auto r     = make(gpukit_nvtx_name_category, d);
  r.category = category;
  copy(r.message, sizeof r.message, name);
  push(r);
}
nvtxStringHandle_t NVTX_API domain_register_string(nvtxDomainHandle_t d, char const* s)
{
  auto r = make(gpukit_nvtx_register_string, d);
  copy(r.message, sizeof r.message, s);
  push(r);
  std::lock_guard<std::mutex> lock{log_mutex()};
  strings().push_back(string_rec{s ? s : ""});
  return reinterpret_cast<nvtxStringHandle_t>(&strings().back());
}
nvtxDomainHandle_t NVTX_API domain_create(char const* name)
{
  auto r = make(gpukit_nvtx_domain_create, nullptr);
  copy(r.message, sizeof r.message, name);
  push(r);
  std::lock_guard<std::mutex> lock{log_mutex()};
  domains().push_back(domain_rec{name ? name : ""});
  return reinterpret_cast<nvtxDomainHandle_t>(&domains().back());
}
void NVTX_API domain_destroy(nvtxDomainHandle_t) {}

// ---- core (global domain) API -----------------------------------------------------------------
void NVTX_API mark_ex(nvtxEventAttributes_t const* a) { domain_mark(nullptr, a); }
void NVTX_API mark_a(char const* m)
{
  auto r = make(gpukit_nvtx_mark, nullptr);
  copy(r.message, sizeof r.message, m);
  r.message_type = NVTX_MESSAGE_TYPE_ASCII;
  r.depth        = depth;
  push(r);
}
nvtxRangeId_t NVTX_API start_ex(nvtxEventAttributes_t const* a) { return domain_start(nullptr, a); }
nvtxRangeId_t NVTX_API start_a(char const* m)
{
  nvtxEventAttributes_t a{};
  a.version       = NVTX_VERSION;
  a.size          = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType   = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = m;
  return domain_start(nullptr, &a);
}
void NVTX_API end(nvtxRangeId_t id) { domain_end(nullptr, id); }
int NVTX_API push_ex(nvtxEventAttributes_t const* a) { return domain_push(nullptr, a); }
int NVTX_API push_a(char const* m)
{
  nvtxEventAttributes_t a{};
  a.version       = NVTX_VERSION;
  a.size          = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType   = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = m;
  return domain_push(nullptr, &a);
}
int NVTX_API pop() { return domain_pop(nullptr); }
void NVTX_API name_category_a(std::uint32_t c, char const* n)
{
  domain_name_category(nullptr, c, n);
}

// ---- memory extension -------------------------------------------------------------------------
nvtxMemHeapHandle_t NVTX_API heap_register(nvtxDomainHandle_t d, nvtxMemHeapDesc_t const* desc)
{
  auto r     = make(gpukit_nvtx_heap_register, d);
  r.usage    = desc->usage;
  r.type     = desc->type;
  r.heap     = next_heap++;
  r.category = desc->category;
  message_of(r, static_cast<int>(desc->messageType), desc->message);
  if (desc->type == NVTX_MEM_TYPE_VIRTUAL_ADDRESS && desc->typeSpecificDesc != nullptr) {
    auto const* v = static_cast<nvtxMemVirtualRangeDesc_t const*>(desc->typeSpecificDesc);
    r.address     = reinterpret_cast<std::uintptr_t>(v->ptr);
    r.size        = v->size;
  }
  push(r);
  return reinterpret_cast<nvtxMemHeapHandle_t>(r.heap);
}
void NVTX_API heap_unregister(nvtxDomainHandle_t d, nvtxMemHeapHandle_t h)
{
  auto r = make(gpukit_nvtx_heap_unregister, d);
  r.heap = reinterpret_cast<std::uintptr_t>(h);
  push(r);
}
void NVTX_API heap_reset(nvtxDomainHandle_t d, nvtxMemHeapHandle_t h)
{
  auto r = make(gpukit_nvtx_heap_reset, d);
  r.heap = reinterpret_cast<std::uintptr_t>(h);
  push(r);
}
void NVTX_API regions_register(nvtxDomainHandle_t d, nvtxMemRegionsRegisterBatch_t const* b)
{
  for (std::size_t i = 0; i < b->regionCount; ++i) {
    auto r        = make(gpukit_nvtx_region_register, d);
    r.heap        = reinterpret_cast<std::uintptr_t>(b->heap);
    r.type        = b->regionType;
    auto const* v = reinterpret_cast<nvtxMemVirtualRangeDesc_t const*>(
      static_cast<char const*>(b->regionDescElements) + i * b->regionDescElementSize);
    r.address = reinterpret_cast<std::uintptr_t>(v->ptr);
    r.size    = v->size;
    push(r);
    if (b->regionHandleElementsOut != nullptr) {
      b->regionHandleElementsOut[i] = reinterpret_cast<nvtxMemRegionHandle_t>(r.address);
    }
  }
}
void NVTX_API regions_resize(nvtxDomainHandle_t d, nvtxMemRegionsResizeBatch_t const* b)
{
  for (std::size_t i = 0; i < b->regionDescCount; ++i) {
    auto r        = make(gpukit_nvtx_region_resize, d);
    auto const* v = reinterpret_cast<nvtxMemVirtualRangeDesc_t const*>(
      static_cast<char const*>(b->regionDescElements) + i * b->regionDescElementSize);
    r.address = reinterpret_cast<std::uintptr_t>(v->ptr);
    r.size    = v->size;
    push(r);
  }
}
void NVTX_API regions_unregister(nvtxDomainHandle_t d, nvtxMemRegionsUnregisterBatch_t const* b)
{
  for (std::size_t i = 0; i < b->refCount; ++i) {
    auto r          = make(gpukit_nvtx_region_unregister, d);
    auto const* ref = reinterpret_cast<nvtxMemRegionRef_t const*>(
      reinterpret_cast<char const*>(b->refElements) + i * b->refElementSize);
    r.address = b->refType == NVTX_MEM_REGION_REF_TYPE_POINTER
                  ? reinterpret_cast<std::uintptr_t>(ref->pointer)
                  : reinterpret_cast<std::uintptr_t>(ref->handle);
    push(r);
  }
}
void NVTX_API regions_name(nvtxDomainHandle_t d, nvtxMemRegionsNameBatch_t const* b)
{
  for (std::size_t i = 0; i < b->regionCount; ++i) {
    auto r        = make(gpukit_nvtx_region_name, d);
    auto const* e = reinterpret_cast<nvtxMemRegionNameDesc_t const*>(
      reinterpret_cast<char const*>(b->regionElements) + i * b->regionElementSize);
    r.address  = reinterpret_cast<std::uintptr_t>(e->region.pointer);
    r.category = e->category;
    message_of(r, static_cast<int>(e->nameType), e->name);
    push(r);
  }
}

// ---- counters extension -----------------------------------------------------------------------
std::uint64_t NVTX_API counter_register(nvtxDomainHandle_t d, nvtxCounterAttr_t const* a)
{
  auto r = make(gpukit_nvtx_counter_register, d);
  r.id   = a->counterId != NVTX_COUNTER_ID_NONE ? a->counterId : next_counter++;
  r.type = static_cast<std::uint32_t>(a->schemaId);
  copy(r.message, sizeof r.message, a->name);
  push(r);
  return r.id;
}
void NVTX_API counter_sample_i64(nvtxDomainHandle_t d, std::uint64_t id, std::int64_t v)
{
  auto r         = make(gpukit_nvtx_counter_sample, d);
  r.id           = id;
  r.payload_type = 1;
  r.payload_i    = v;
  push(r);
}
void NVTX_API counter_sample_f64(nvtxDomainHandle_t d, std::uint64_t id, double v)
{
  auto r         = make(gpukit_nvtx_counter_sample, d);
  r.id           = id;
  r.payload_type = 2;
  r.payload_d    = v;
  push(r);
}

template <class F>
void set(NvtxFunctionTable table, unsigned size, unsigned id, F f)
{
  if (id < size && table[id] != nullptr) *table[id] = reinterpret_cast<NvtxFunctionPointer>(f);
}

}  // namespace

GPUKIT_INJ_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table)
{
  auto const* callbacks =
    static_cast<NvtxExportTableCallbacks const*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned size           = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) == 0) return 0;
  set(table, size, NVTX_CBID_CORE_MarkEx, &mark_ex);
  set(table, size, NVTX_CBID_CORE_MarkA, &mark_a);
  set(table, size, NVTX_CBID_CORE_RangeStartEx, &start_ex);
  set(table, size, NVTX_CBID_CORE_RangeStartA, &start_a);
  set(table, size, NVTX_CBID_CORE_RangeEnd, &end);
  set(table, size, NVTX_CBID_CORE_RangePushEx, &push_ex);
  set(table, size, NVTX_CBID_CORE_RangePushA, &push_a);
  set(table, size, NVTX_CBID_CORE_RangePop, &pop);
  set(table, size, NVTX_CBID_CORE_NameCategoryA, &name_category_a);
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) == 0) return 0;
  set(table, size, NVTX_CBID_CORE2_DomainMarkEx, &domain_mark);
  set(table, size, NVTX_CBID_CORE2_DomainRangeStartEx, &domain_start);
  set(table, size, NVTX_CBID_CORE2_DomainRangeEnd, &domain_end);
  set(table, size, NVTX_CBID_CORE2_DomainRangePushEx, &domain_push);
  set(table, size, NVTX_CBID_CORE2_DomainRangePop, &domain_pop);
  set(table, size, NVTX_CBID_CORE2_DomainNameCategoryA, &domain_name_category);
  set(table, size, NVTX_CBID_CORE2_DomainRegisterStringA, &domain_register_string);
  set(table, size, NVTX_CBID_CORE2_DomainCreateA, &domain_create);
  set(table, size, NVTX_CBID_CORE2_DomainDestroy, &domain_destroy);
  return 1;
}

GPUKIT_INJ_EXPORT int InitializeInjectionNvtxExtension(nvtxExtModuleInfo_t* info)
{
  if (info == nullptr || info->segmentsCount < 1) return 0;
  intptr_t* slots     = info->segments[0].functionSlots;
  std::size_t const n = info->segments[0].slotCount;
  auto put            = [&](std::size_t id, auto f) {
    if (id < n) slots[id] = reinterpret_cast<intptr_t>(f);
  };
  if (info->moduleId == NVTX_EXT_MODULEID_MEM) {
    put(NVTX3EXT_CBID_nvtxMemHeapRegister, &heap_register);
    put(NVTX3EXT_CBID_nvtxMemHeapUnregister, &heap_unregister);
    put(NVTX3EXT_CBID_nvtxMemHeapReset, &heap_reset);
    put(NVTX3EXT_CBID_nvtxMemRegionsRegister, &regions_register);
    put(NVTX3EXT_CBID_nvtxMemRegionsResize, &regions_resize);
    put(NVTX3EXT_CBID_nvtxMemRegionsUnregister, &regions_unregister);
    put(NVTX3EXT_CBID_nvtxMemRegionsName, &regions_name);
  } else if (info->moduleId == NVTX_EXT_COUNTERS_MODULEID) {
    put(NVTX3EXT_CBID_nvtxCounterRegister, &counter_register);
    put(NVTX3EXT_CBID_nvtxCounterSampleInt64, &counter_sample_i64);
    put(NVTX3EXT_CBID_nvtxCounterSampleFloat64, &counter_sample_f64);
  }
  return 1;
}

GPUKIT_INJ_EXPORT std::size_t gpukit_nvtx_count(void)
{
  std::lock_guard<std::mutex> lock{log_mutex()};
  return log_records().size();
}

GPUKIT_INJ_EXPORT int gpukit_nvtx_get(std::size_t i, gpukit_nvtx_record* out)
{
  std::lock_guard<std::mutex> lock{log_mutex()};
  if (i >= log_records().size() || out == nullptr) return 0;
  *out = log_records()[i];
  return 1;
}

GPUKIT_INJ_EXPORT void gpukit_nvtx_clear(void)
{
  std::lock_guard<std::mutex> lock{log_mutex()};
  log_records().clear();
}
