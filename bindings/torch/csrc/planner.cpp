// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/csrc/planner.cpp: gpukit's checkpoint planner for Python (gpukit_torch.checkpoint).
//
// Bound into gpukit_torch._C by module.cpp (bind_planner). Compiled alone with
// -DGPUKIT_TORCH_PLANNER_MODULE it is a module of its own, `_gpukit_planner`: what
// gpukit_torch.checkpoint builds on a machine where the CUDA extension is not installed (it needs
// pybind11's headers only, no CUDA).
#include <gpukit/checkpoint/planners.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace gpukit_torch {

namespace py      = pybind11;
using stage_costs = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

namespace {

gpukit::checkpoint_chain to_chain(std::vector<stage_costs> const& stages)
{
  std::vector<gpukit::checkpoint_stage> v;
  v.reserve(stages.size());
  for (auto const& [f, b, a, t] : stages) v.push_back({f, b, a, t});
  return gpukit::checkpoint_chain{std::move(v)};
}

// The planner named `planner` ("best": plan_best, gpukit's default; "optimal": rotor's dynamic
// program alone) at a finer resolution each time rounding the sizes alone made the budget too
// small (the budget is at or above the least one), up to `max_slots` slots.
gpukit::checkpoint_plan plan_at_finest(gpukit::checkpoint_chain const& chain, std::int64_t budget,
                                       std::int64_t max_slots, std::string const& planner)
{
  if (planner != "best" && planner != "optimal") {
    throw py::value_error("gpukit: planner '" + planner + "' is not one of 'best', 'optimal'");
  }
  gpukit::checkpoint_planner_options o;
  for (;;) {
    try {
      return planner == "best" ? gpukit::plan_best(chain, budget, o)
                               : gpukit::plan_optimal(chain, budget, o);
    } catch (gpukit::checkpoint_infeasible const& e) {
      if (budget < e.minimum_budget() || o.slots * 4 > max_slots) throw;
      o.slots *= 4;
    }
  }
}

// A plan as a dict: {"schedule", "time", "peak", "exact", "proven_optimal", "unit"}, or
// {"infeasible": True, "minimum_budget"} when no schedule fits. Bad costs: ValueError naming the
// stage and value.
py::dict plan(std::vector<stage_costs> const& stages, std::int64_t budget, std::int64_t max_slots,
              std::string const& planner)
{
  py::dict d;
  try {
    auto const chain    = to_chain(stages);
    auto const p        = plan_at_finest(chain, budget, max_slots, planner);
    d["infeasible"]     = false;
    d["schedule"]       = gpukit::to_string(p.schedule);
    d["time"]           = p.time;
    d["peak"]           = p.peak;
    d["exact"]          = p.exact;
    d["proven_optimal"] = p.proven_optimal;
    d["unit"]           = p.unit;
  } catch (gpukit::checkpoint_infeasible const& e) {
    d["infeasible"]     = true;
    d["minimum_budget"] = e.minimum_budget();
    d["message"]        = std::string{e.what()};
  } catch (gpukit::logic_error const& e) {
    throw py::value_error(e.what());
  }
  return d;
}

// The simulator's (time, peak) of a schedule written as text ("Fn1 Fe2 B2 Fe1 B1").
std::tuple<std::int64_t, std::int64_t> simulate(std::vector<stage_costs> const& stages,
                                                std::string const& schedule)
{
  try {
    auto const r = gpukit::simulate_checkpoint_schedule(
      to_chain(stages), gpukit::parse_checkpoint_schedule(schedule));
    return {r.time, r.peak};
  } catch (gpukit::logic_error const& e) {
    throw py::value_error(e.what());
  }
}

// The simulator's time and, per operation, its peak (the memory before it plus what it creates)
// and the memory right after it: what gpukit_torch.checkpoint adds the costs to that the chain's
// four numbers do not carry (transients, gradients, what runs around the chain).
py::dict simulate_ops(std::vector<stage_costs> const& stages, std::string const& schedule)
{
  try {
    auto const r = gpukit::simulate_checkpoint_schedule(
      to_chain(stages), gpukit::parse_checkpoint_schedule(schedule));
    py::dict d;
    d["time"]    = r.time;
    d["peak"]    = r.peak;
    d["op_peak"] = r.op_peak;
    d["after"]   = r.after;
    return d;
  } catch (gpukit::logic_error const& e) {
    throw py::value_error(e.what());
  }
}

}  // namespace

void bind_planner(py::module_& m)
{
  m.def("plan", &plan, py::arg("stages"), py::arg("budget"),
        py::arg("max_slots") = std::int64_t{8192}, py::arg("planner") = std::string{"best"},
        "gpukit::plan_best (planner='best') or plan_optimal (planner='optimal') on stages "
        "[(f, b, a, t), ...] under `budget` (same units as a, t), "
        "its resolution raised (up to max_slots) while rounding alone makes the budget too small: "
        "a dict with the schedule text, time, peak, exact, unit; or infeasible=True and "
        "minimum_budget");
  m.def("simulate_schedule", &simulate, py::arg("stages"), py::arg("schedule"),
        "(time, peak) of a schedule's text on stages [(f, b, a, t), ...] in gpukit's simulator");
  m.def("simulate_ops", &simulate_ops, py::arg("stages"), py::arg("schedule"),
        "gpukit's simulator on a schedule's text: a dict with time, peak, and per operation "
        "op_peak (memory before it plus what it creates) and after (memory right after it)");
}

}  // namespace gpukit_torch

#ifdef GPUKIT_TORCH_PLANNER_MODULE
PYBIND11_MODULE(_gpukit_planner, m)
{
  m.doc() = "gpukit's checkpoint planner (the CUDA extension's planner functions, built alone)";
  gpukit_torch::bind_planner(m);
}
#endif
