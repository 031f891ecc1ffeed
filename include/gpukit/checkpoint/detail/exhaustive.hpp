// gpukit/checkpoint/detail/exhaustive.hpp: the general optimum by shortest path over memory states.
// Not public API.
//
// A state is (backward operations done, resident activations, resident tapes); edges are the
// operations (weighted by their time, allowed when their peak fits the budget) and free drops.
// Objects that no later operation can use (x_j once B<j+1> ran, tapes of finished stages) are
// dropped at once. Dijkstra finds the least total time over every schedule of the cost model, with
// drops at any time; its operations, replayed with every object dropped right after its last use,
// peak no higher (dropping earlier never raises memory), so the plan keeps the path's time.
//
// With nb = L - (backward operations done) the next backward, the activations that matter are
// x_1..x_{nb-1} and the tapes tape_1..tape_nb: 2^(2 nb - 1) states per nb, about 2^(2L+1)/3 in all.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

namespace gpukit::detail {

struct ckpt_exhaustive_result {
  std::int64_t time{-1};  ///< -1 when no schedule fits
  checkpoint_schedule schedule;
};

inline ckpt_exhaustive_result ckpt_exhaustive(checkpoint_chain const& chain, std::int64_t budget)
{
  std::size_t const L = chain.size();
  // offset[nb]: first index of the states whose next backward is nb (nb = L .. 0).
  std::vector<std::uint64_t> offset(L + 2, 0);
  auto x_bits         = [](std::size_t nb) { return nb == 0 ? 0 : nb - 1; };
  std::uint64_t total = 0;
  for (std::size_t nb = L + 1; nb-- > 0;) {
    offset[nb] = total;
    total += std::uint64_t{1} << (x_bits(nb) + nb);
  }
  auto index = [&](std::size_t nb, std::uint64_t X, std::uint64_t T) {
    return offset[nb] + (X << nb) + T;
  };
  auto memory = [&](std::size_t nb, std::uint64_t X, std::uint64_t T) {
    std::int64_t m = chain.gradient_size(nb);
    for (std::size_t j = 1; j < nb; ++j)
      if (X >> (j - 1) & 1) m += chain[j].output_size;
    for (std::size_t i = 1; i <= nb; ++i)
      if (T >> (i - 1) & 1) m += chain[i].tape_size;
    return m;
  };
  constexpr std::int64_t inf = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> dist(total, inf);
  std::vector<std::uint64_t> parent(total, 0);
  std::vector<checkpoint_op> via(total);
  std::vector<char> is_op(total, 0);
  using item = std::pair<std::int64_t, std::uint64_t>;
  std::priority_queue<item, std::vector<item>, std::greater<item>> queue;
  auto start  = index(L, 0, 0);
  dist[start] = 0;
  queue.push({0, start});
  auto relax = [&](std::uint64_t from, std::uint64_t to, std::int64_t d, checkpoint_op op,
                   bool real) {
    if (d < dist[to]) {
      dist[to]   = d;
      parent[to] = from;
      via[to]    = op;
      is_op[to]  = real;
      queue.push({d, to});
    }
  };
  std::uint64_t const goal = index(0, 0, 0);
  while (!queue.empty()) {
    auto [d, id] = queue.top();
    queue.pop();
    if (d != dist[id]) continue;
    if (id == goal) break;
    // Decode.
    std::size_t nb = L;
    while (id >= offset[nb] + (std::uint64_t{1} << (x_bits(nb) + nb))) --nb;
    std::uint64_t const local = id - offset[nb];
    std::uint64_t const X = local >> nb, T = local & ((std::uint64_t{1} << nb) - 1);
    std::int64_t const mem = memory(nb, X, T);
    auto has_x             = [&](std::size_t j) { return j == 0 || (X >> (j - 1) & 1); };
    // Drops.
    for (std::size_t j = 1; j < nb; ++j)
      if (X >> (j - 1) & 1)
        relax(id, index(nb, X & ~(std::uint64_t{1} << (j - 1)), T), d, {}, false);
    for (std::size_t i = 1; i <= nb; ++i)
      if (T >> (i - 1) & 1)
        relax(id, index(nb, X, T & ~(std::uint64_t{1} << (i - 1))), d, {}, false);
    // Forwards.
    for (std::size_t i = 1; i <= nb; ++i) {
      if (!has_x(i - 1)) continue;
      auto const& st         = chain[i];
      std::uint64_t const X2 = i < nb ? X | (std::uint64_t{1} << (i - 1)) : X;
      if (mem + st.output_size <= budget) {
        relax(id, index(nb, X2, T), d + st.forward_time, fn_op(static_cast<std::uint32_t>(i)),
              true);
      }
      if (mem + st.output_size + st.tape_size <= budget) {
        relax(id, index(nb, X2, T | (std::uint64_t{1} << (i - 1))), d + st.forward_time,
              fe_op(static_cast<std::uint32_t>(i)), true);
      }
    }
    // Backward.
    if (nb >= 1 && (T >> (nb - 1) & 1) && has_x(nb - 1) &&
        mem + chain.gradient_size(nb - 1) <= budget) {
      std::size_t const nb2 = nb - 1;
      // x_{nb-1} and tape_nb are no longer useful; what remains fits the smaller state.
      std::uint64_t const X2 = X & ((std::uint64_t{1} << x_bits(nb2)) - 1);
      std::uint64_t const T2 = T & ((std::uint64_t{1} << nb2) - 1);
      relax(id, index(nb2, X2, T2), d + chain[nb].backward_time,
            b_op(static_cast<std::uint32_t>(nb)), true);
    }
  }
  ckpt_exhaustive_result r;
  if (dist[goal] == inf) return r;
  r.time = dist[goal];
  for (std::uint64_t id = goal; id != start; id = parent[id])
    if (is_op[id]) r.schedule.push_back(via[id]);
  std::reverse(r.schedule.begin(), r.schedule.end());
  return r;
}

}  // namespace gpukit::detail
