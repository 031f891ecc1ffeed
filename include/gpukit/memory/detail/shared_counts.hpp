// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/shared_counts.hpp: the counters behind the caching allocator's statistics
// that more than one thread writes: frees waiting on other streams (pending_counts) and the
// peaks once a second thread uses the allocator (shared_counts, batched per thread). Not public
// API; included by caching_allocator.hpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace gpukit::detail {

/// Bytes and blocks of each pool kind whose frees wait for other streams' work: freed by their
/// user, still active. Written under the allocator's lock, read on the fast path. While none is
/// pending, active equals allocated and its peaks follow the allocated ones: the fast path then
/// reads one counter (`blocks`), on a line of its own.
struct alignas(64) pending_counts {
  std::atomic<std::int64_t> blocks{0};  // of both kinds
  std::atomic<std::int64_t> bytes[2]{}, count[2]{};

  void add(int kind, std::int64_t size, std::int64_t n) noexcept
  {
    auto const k = static_cast<std::size_t>(kind);
    bytes[k].store(bytes[k].load(std::memory_order_relaxed) + size, std::memory_order_relaxed);
    count[k].store(count[k].load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    blocks.store(blocks.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

/// One pool kind's blocks, their bytes and the bytes asked for: a thread's net values (handed out
/// less taken back), or the part of them it has folded into the shared counts.
struct kind_counts {
  std::int64_t bytes{0}, requested{0}, count{0};
  friend kind_counts operator-(kind_counts const& a, kind_counts const& b) noexcept
  {
    return {a.bytes - b.bytes, a.requested - b.requested, a.count - b.count};
  }
};

/// The allocator's peaks once more than one thread has used it, kept the way Linux's percpu
/// counters keep a sum: batched. Until a second thread comes, the one thread's own counters are
/// exact and nothing here is written.
///
/// From then on each thread cache's net values (its own counters: one writer, no read-modify-write)
/// run ahead of what it has folded in here (`kind_counts folded`, per pool kind, in the cache);
/// the difference, its unfolded delta, stays in [0, batch] in every one of bytes, requested bytes
/// and blocks. An operation that takes it out of that range folds it: one fetch_add per value
/// (the pool kind's and both kinds'), which leaves the delta at `reserve` (half the batch, so that
/// a run of allocations or of frees folds once per half batch, not every operation), and raises
/// the peaks to the new shared values. The common path writes only the cache's own lines.
///
/// The delta is per thread cache, not per operation or per stream: a cache has one writer, so
/// keeping its delta costs compares on lines it owns; a cache outlives its thread (a thread that
/// exits folds its whole delta, leaving none), and the readers already walk the caches.
///
/// What it guarantees (the thread caches' counters give the current values; only the peaks come
/// from here):
/// - the shared value never exceeds the allocator's (every unfolded delta is >= 0), so a peak is
///   never above the true one;
/// - it is below it by at most threads x batch (the caches in use, each delta <= batch), so a
///   peak is at most that below the true one: per pool kind, `batch_bytes` of bytes and of
///   requested bytes and `batch_count` blocks per thread (both kinds: twice that);
/// - a thread exiting folds its delta (join_counts at its exit), so none is lost;
/// - reading with no operation in flight, current values are exact (summed over the caches) and
///   every peak is at least its current value.
/// Frees that wait on other streams (pending_counts) stay active: such a free is folded exactly
/// (its bytes leave the shared value as they join the pending ones), so the active peaks, raised
/// at folds with the pending frees then, keep the same bound.
struct shared_counts {
  static constexpr std::int64_t batch_bytes = std::int64_t{8} << 20;  // per thread, pool kind
  static constexpr std::int64_t batch_count = 128;
  static constexpr kind_counts reserve{batch_bytes / 2, batch_bytes / 2, batch_count / 2};
  static constexpr kind_counts none{};

  // Three groups on lines of their own: the switch, read by every operation and written once; the
  // shared values, written by folds; the peaks, read and written by folds.
  alignas(64) std::atomic<bool> on{false};
  // By pool kind, then [2]: both (its own counter, so that a peak of both is a value it had).
  alignas(64) std::atomic<std::int64_t> bytes[3]{}, requested[3]{}, count[3]{};
  // The counts of the threads that have not operated since the switch (each joins with its own
  // counts at its next operation): read by folds, written at joins.
  alignas(64) std::atomic<std::int64_t> unjoined_bytes[2]{}, unjoined_requested[2]{},
    unjoined_count[2]{};
  // Peaks by pool kind, then of both: [0] small, [1] large, [2] both. Active peaks are raised only
  // while frees are pending; otherwise they are the allocated ones.
  alignas(64) std::atomic<std::int64_t> peak_bytes[3]{}, peak_requested[3]{}, peak_count[3]{};
  std::atomic<std::int64_t> peak_active_bytes[3]{}, peak_active_count[3]{};

  static void raise(std::atomic<std::int64_t>& peak, std::int64_t v) noexcept
  {
    std::int64_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {}
  }

  /// Whether a cache whose net values of a pool kind are `net`, with `folded` of them folded in,
  /// keeps its delta: the whole common path, on the cache's own lines.
  __attribute__((always_inline)) static bool within(kind_counts const& net,
                                                    kind_counts const& folded) noexcept
  {
    auto in = [](std::int64_t d, std::int64_t batch) {
      return static_cast<std::uint64_t>(d) <= static_cast<std::uint64_t>(batch);  // 0 <= d <= b
    };
    return in(net.bytes - folded.bytes, batch_bytes) &&
           in(net.requested - folded.requested, batch_bytes) &&
           in(net.count - folded.count, batch_count);
  }

  /// An allocation or free of pool `kind` by a joined cache, whose net values of that kind are now
  /// `net`: folds when its delta left [0, batch].
  __attribute__((always_inline)) void count_op(int kind, kind_counts const& net,
                                               kind_counts& folded,
                                               pending_counts const& pending) noexcept
  {
    if (within(net, folded)) { return; }
    fold(kind, net, folded, reserve, pending);
  }

  /// Folds a cache's delta of pool `kind` (`net` less `folded`) into the shared values but for
  /// `keep` of it, and raises the peaks to the values that makes. Out of line: rare.
  __attribute__((noinline)) void fold(int kind, kind_counts const& net, kind_counts& folded,
                                      kind_counts const& keep,
                                      pending_counts const& pending) noexcept
  {
    auto const k = static_cast<std::size_t>(kind);
    kind_counts const d{net.bytes - folded.bytes - keep.bytes,
                        net.requested - folded.requested - keep.requested,
                        net.count - folded.count - keep.count};
    folded.bytes += d.bytes;
    folded.requested += d.requested;
    folded.count += d.count;
    auto const b    = add(bytes[k], bytes[2], d.bytes);
    auto const r    = add(requested[k], requested[2], d.requested);
    auto const c    = add(count[k], count[2], d.count);
    auto const load = [](std::atomic<std::int64_t> const& a) {
      return a.load(std::memory_order_relaxed);
    };
    kind_counts const u{load(unjoined_bytes[k]), load(unjoined_requested[k]),
                        load(unjoined_count[k])};
    kind_counts const uo{load(unjoined_bytes[k ^ 1]), load(unjoined_requested[k ^ 1]),
                         load(unjoined_count[k ^ 1])};
    raise(peak_bytes[k], b.first + u.bytes);
    raise(peak_requested[k], r.first + u.requested);
    raise(peak_count[k], c.first + u.count);
    raise(peak_bytes[2], b.second + u.bytes + uo.bytes);
    raise(peak_requested[2], r.second + u.requested + uo.requested);
    raise(peak_count[2], c.second + u.count + uo.count);
    if (pending.blocks.load(std::memory_order_relaxed) == 0) { return; }  // active == allocated
    std::int64_t const pb  = pending.bytes[k].load(std::memory_order_relaxed);
    std::int64_t const pc  = pending.count[k].load(std::memory_order_relaxed);
    std::int64_t const opb = pending.bytes[k ^ 1].load(std::memory_order_relaxed);
    std::int64_t const opc = pending.count[k ^ 1].load(std::memory_order_relaxed);
    raise(peak_active_bytes[k], b.first + u.bytes + pb);
    raise(peak_active_count[k], c.first + u.count + pc);
    raise(peak_active_bytes[2], b.second + u.bytes + uo.bytes + pb + opb);
    raise(peak_active_count[2], c.second + u.count + uo.count + pc + opc);
  }

 private:
  /// Adds `d` to a pool kind's value and to both kinds' one; returns the values it made. A rise
  /// goes to the kind first, a fall to both first, so that both never exceeds the kinds' sum.
  static std::pair<std::int64_t, std::int64_t> add(std::atomic<std::int64_t>& kind,
                                                   std::atomic<std::int64_t>& both,
                                                   std::int64_t d) noexcept
  {
    if (d >= 0) {
      std::int64_t const k = kind.fetch_add(d, std::memory_order_relaxed) + d;
      return {k, both.fetch_add(d, std::memory_order_relaxed) + d};
    }
    std::int64_t const b = both.fetch_add(d, std::memory_order_relaxed) + d;
    return {kind.fetch_add(d, std::memory_order_relaxed) + d, b};
  }
};

}  // namespace gpukit::detail
