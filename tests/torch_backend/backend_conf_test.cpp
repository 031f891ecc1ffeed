// SPDX-License-Identifier: Apache-2.0
// PyTorch's keys (gpukit_torch/alloc_conf.hpp): each takes effect with PyTorch's meaning or is
// refused with its reason; PyTorch's rounding; the backend's defaults; the README's table.
// gpukit's own keys are tested with the library (tests/memory/alloc_conf_test.cpp).
#include <gpukit/memory/alloc_conf.hpp>
#include <gpukit_torch/alloc_conf.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::string torch_error_of(std::string const& conf)
{
  try {
    (void)gpukit_torch::parse_backend_conf(conf);
  } catch (gpukit::logic_error const& e) {
    return e.what();
  }
  return "";
}

bool contains(std::string const& text, std::string const& part)
{
  return text.find(part) != std::string::npos;
}

// Sets (or with nullptr unsets) the variables PyTorch and gpukit read; restores them when done.
struct env_vars {
  static constexpr char const* names[] = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                                          "PYTORCH_ALLOC_CONF", "GPUKIT_ALLOC_CONF"};
  std::string saved[4];
  bool had[4]{};
  env_vars(char const* cuda, char const* hip, char const* generic, char const* gpukit)
  {
    char const* values[] = {cuda, hip, generic, gpukit};
    for (int i = 0; i < 4; ++i) {
      char const* v = std::getenv(names[i]);
      had[i]        = v != nullptr;
      if (had[i]) { saved[i] = v; }
      if (values[i] != nullptr) {
        ::setenv(names[i], values[i], 1);
      } else {
        ::unsetenv(names[i]);
      }
    }
  }
  ~env_vars()
  {
    for (int i = 0; i < 4; ++i) {
      if (had[i]) {
        ::setenv(names[i], saved[i].c_str(), 1);
      } else {
        ::unsetenv(names[i]);
      }
    }
  }
  env_vars(env_vars const&)            = delete;
  env_vars& operator=(env_vars const&) = delete;
};

}  // namespace

TEST_SUITE("torch_alloc_conf")
{
  using gpukit_torch::parse_backend_conf;

  TEST_CASE("torch conf: the backend's defaults are growable segments, released only on demand")
  {
    auto const c = parse_backend_conf(gpukit_torch::backend_default_conf);
    CHECK(c.options.source == gpukit::segment_source::growable);
    CHECK_FALSE(c.options.release_before_grow);
    CHECK(c.options.growable_page_bytes == 8 * MiB);  // not the allocator's 32 MiB: see the conf
    CHECK(c.rounding.round_size(1) == 512);
    CHECK(c.host_settings.empty());
    CHECK(c.options.limit_fraction == 0.0);  // no limit unless asked for
  }

  TEST_CASE("torch conf: PyTorch's round_size, with and without power-of-two divisions")
  {
    gpukit_torch::size_rounding plain;
    CHECK(plain.round_size(1) == 512);
    CHECK(plain.round_size(512) == 512);
    CHECK(plain.round_size(513) == 1024);
    CHECK(plain.round_size(10 * MiB + 1) == 10 * MiB + 512);
    auto const four = parse_backend_conf("roundup_power2_divisions:4").rounding;
    CHECK(four.round_size(2048) == 2048);                // not above 512 * 4: plain rounding
    CHECK(four.round_size(2049) == 2560);                // steps of 2048 / 4 between 2048 and 4096
    CHECK(four.round_size(1200 * 1024) == 1280 * 1024);  // 1 MiB .. 2 MiB in steps of 256 KiB
    CHECK(four.round_size(1280 * 1024) == 1280 * 1024);
    CHECK(four.round_size(4 * MiB) == 4 * MiB);  // powers of two stay
    CHECK(four.round_size(5 * MiB + 1) == 6 * MiB);
    // PyTorch's list: the first interval's divisions also below it, '>' from the last one on,
    // intervals between named ones and not covered keep plain rounding.
    auto const list = parse_backend_conf("roundup_power2_divisions:[2:8,8:2,>:4]").rounding;
    CHECK(list.divisions[0] == 8);
    CHECK(list.divisions[1] == 8);
    CHECK(list.divisions[2] == 0);
    CHECK(list.divisions[3] == 2);
    CHECK(list.divisions[4] == 4);
    CHECK(list.divisions[15] == 4);
    CHECK(list.round_size(MiB + 1) == MiB + 128 * 1024);   // [1 MiB, 2 MiB): 8 divisions
    CHECK(list.round_size(4 * MiB + 1) == 4 * MiB + 512);  // [4 MiB, 8 MiB): plain
    CHECK(list.round_size(8 * MiB + 1) == 12 * MiB);       // [8 MiB, 16 MiB): 2
    CHECK(list.round_size(64 * MiB + 1) == 80 * MiB);      // beyond: 4
    // Spaces, and the list as one entry among others.
    auto const mixed = parse_backend_conf(" roundup_power2_divisions: [ 256:4 , >:8 ] ,limit:1G");
    CHECK(mixed.rounding.divisions[8] == 4);
    CHECK(mixed.rounding.divisions[9] == 8);
    CHECK(mixed.options.limit_bytes == std::size_t{1} << 30);
  }

  TEST_CASE("torch conf: bad roundup_power2_divisions values are named with the key")
  {
    for (char const* conf : {"roundup_power2_divisions:3", "roundup_power2_divisions:[3:4]",
                             "roundup_power2_divisions:[4:3]", "roundup_power2_divisions:[4:4",
                             "roundup_power2_divisions:[]", "roundup_power2_divisions:[4]",
                             "roundup_power2_divisions:x", "roundup_power2_divisions:0"}) {
      std::string const e = torch_error_of(conf);
      INFO(std::string{conf}, " -> ", e);
      std::string const value{std::string{conf}.substr(std::string{conf}.find(':') + 1)};
      CHECK(contains(e, "'" + value + "' for 'roundup_power2_divisions'"));
    }
  }

  TEST_CASE("torch conf: every PyTorch key takes effect or is refused naming it and why")
  {
    for (auto const& k : gpukit_torch::pytorch_keys) {
      CAPTURE(k.key);
      std::string const key = k.key;
      switch (k.use) {
        case gpukit_torch::pytorch_key_use::refused: {
          std::string const e = torch_error_of(key + ":64");
          CHECK(contains(e, "'" + key + "'"));
          CHECK(contains(e, k.reason));
          break;
        }
        case gpukit_torch::pytorch_key_use::default_only: {
          CHECK(torch_error_of(key + ":" + k.accepted).empty());
          std::string const other = std::string{k.accepted} == "False" ? "True" : "cudaMallocAsync";
          std::string const e     = torch_error_of(key + ":" + other);
          CHECK(contains(e, "'" + key + ":" + other + "'"));
          CHECK(contains(e, k.reason));
          break;
        }
        case gpukit_torch::pytorch_key_use::host_allocator: {
          auto const c = parse_backend_conf("limit:1G," + key + ":4");
          CHECK(c.host_settings == key + ":4");
          break;
        }
        case gpukit_torch::pytorch_key_use::applied: break;  // each one below
      }
    }
    CHECK(gpukit_torch::find_pytorch_key("Max_Split_Size_MB") != nullptr);
    CHECK(gpukit_torch::find_pytorch_key("segments") == nullptr);
    // Keys PyTorch 2.11 does not have are unknown, and the message lists PyTorch's known ones.
    std::string const e = torch_error_of("throw_on_cudamalloc_oom:True");
    CHECK(contains(e, "unknown key 'throw_on_cudamalloc_oom'"));
    CHECK(contains(e, "roundup_power2_divisions"));
  }

  TEST_CASE("torch conf: the applied keys, with PyTorch's meanings")
  {
    CHECK(parse_backend_conf("expandable_segments:True").options.source ==
          gpukit::segment_source::growable);
    CHECK(parse_backend_conf("expandable_segments:False").options.source ==
          gpukit::segment_source::synchronous);  // PyTorch's cudaMalloc segments
    CHECK(parse_backend_conf("per_process_memory_fraction:0.5").options.limit_fraction ==
          doctest::Approx(0.5));
    CHECK(contains(torch_error_of("per_process_memory_fraction:0"),
                   "'0' for 'per_process_memory_fraction'"));
    CHECK(contains(torch_error_of("per_process_memory_fraction:1.5"),
                   "'1.5' for 'per_process_memory_fraction'"));
    auto const big = parse_backend_conf("large_segment_size_mb:64").options;
    CHECK(big.medium_segment_bytes == 64 * MiB);
    CHECK(big.growable_page_bytes == 64 * MiB);
    CHECK(contains(torch_error_of("large_segment_size_mb:4"), "'4' for 'large_segment_size_mb'"));
    CHECK(
      contains(torch_error_of("expandable_segments:maybe"), "'maybe' for 'expandable_segments'"));
    // A key PyTorch reads over the backend's defaults, as the environment layers them.
    auto const over = parse_backend_conf("expandable_segments:False",
                                         parse_backend_conf(gpukit_torch::backend_default_conf));
    CHECK(over.options.source == gpukit::segment_source::synchronous);
  }

  TEST_CASE("torch conf: keys that set one thing, or one key twice, are refused naming them")
  {
    for (char const* conf :
         {"expandable_segments:True,segments:growable",
          "per_process_memory_fraction:0.5,fraction:0.5", "large_segment_size_mb:32,page_size:8MiB",
          "large_segment_size_mb:32,medium_segment_bytes:32MiB"}) {
      CAPTURE(conf);
      std::string const c{conf};
      std::string const first  = c.substr(0, c.find(':'));
      std::string const rest   = c.substr(c.find(',') + 1);
      std::string const second = rest.substr(0, rest.find(':'));
      std::string const e      = torch_error_of(conf);
      CHECK(contains(e, "'" + first + "' and '" + second + "' both set"));
    }
    CHECK(contains(torch_error_of("roundup_power2_divisions:2,roundup_power2_divisions:4"),
                   "'roundup_power2_divisions' is given twice"));
    CHECK(contains(torch_error_of("max_split_size_mb"), "'max_split_size_mb' is not key:value"));
  }

  TEST_CASE("torch conf: each refusal starts with gpukit's one prefix, as the library's do")
  {
    for (char const* conf : {"max_split_size_mb", "expandable_segments:maybe", "no_such_key:1",
                             "roundup_power2_divisions:2,roundup_power2_divisions:4",
                             "per_process_memory_fraction:1.5"}) {
      CAPTURE(conf);
      std::string const e = torch_error_of(conf);
      CHECK(e.rfind("gpukit: ", 0) == 0);
      CHECK(e.find("gpukit: ", 1) == std::string::npos);
      CHECK_FALSE(contains(e, "gpukit_torch: "));
    }
  }

  TEST_CASE("torch conf: PyTorch's variables (the first set wins), then GPUKIT_ALLOC_CONF")
  {
    {
      env_vars e{"expandable_segments:False,pinned_use_cuda_host_register:True",
                 "roundup_power2_divisions:4", nullptr, nullptr};
      auto const c = gpukit_torch::backend_conf_from_env();
      CHECK(c.options.source == gpukit::segment_source::synchronous);
      CHECK(c.rounding.divisions[0] == 0);  // PYTORCH_HIP_ALLOC_CONF is not read
      CHECK(c.host_settings == "pinned_use_cuda_host_register:True");
      CHECK(gpukit_torch::effective_conf_from_env() ==
            std::string{gpukit_torch::backend_default_conf} +
              ",expandable_segments:False,pinned_use_cuda_host_register:True");
    }
    {
      env_vars e{nullptr, nullptr, "roundup_power2_divisions:4", "segments:synchronous"};
      auto const c = gpukit_torch::backend_conf_from_env();
      CHECK(c.rounding.divisions[0] == 4);
      CHECK(c.options.source == gpukit::segment_source::synchronous);
    }
    {
      env_vars e{"", "expandable_segments:False", nullptr, nullptr};  // empty: not set
      CHECK(gpukit_torch::backend_conf_from_env().options.source ==
            gpukit::segment_source::synchronous);
    }
    {
      env_vars e{"expandable_segments:False", nullptr, nullptr, "segments:growable"};
      CHECK(gpukit_torch::backend_conf_from_env().options.source ==
            gpukit::segment_source::growable);  // gpukit's variable wins
    }
    {
      env_vars e{"garbage_collection_threshold:0.6,max_split_size_mb:128", nullptr, nullptr,
                 nullptr};
      try {
        (void)gpukit_torch::backend_conf_from_env();
        FAIL("a refused key must throw");
      } catch (gpukit::logic_error const& x) {
        std::string const m = x.what();
        CHECK(contains(m, "'garbage_collection_threshold:0.6'"));
        CHECK(contains(m, "PYTORCH_CUDA_ALLOC_CONF"));
      }
    }
    {
      env_vars e{nullptr, nullptr, nullptr, nullptr};
      auto const c = gpukit_torch::backend_conf_from_env();
      CHECK(c.options.source == gpukit::segment_source::growable);
      CHECK(gpukit_torch::effective_conf_from_env() == gpukit_torch::backend_default_conf);
    }
  }

  TEST_CASE("torch conf: to_alloc_conf writes every setting, and parses back to the same")
  {
    for (char const* conf :
         {"", "roundup_power2_divisions:4", "roundup_power2_divisions:[2:8,8:2,>:4]",
          "roundup_power2_divisions:[1:2,64:4]", "roundup_power2_divisions:[256:4,>:8],limit:1G",
          "expandable_segments:False,pinned_use_cuda_host_register:True,"
          "pinned_num_register_threads:8",
          "per_process_memory_fraction:0.3,large_segment_size_mb:64,thread_cache:off"}) {
      CAPTURE(conf);
      auto const c =
        parse_backend_conf(conf, parse_backend_conf(gpukit_torch::backend_default_conf));
      std::string const written = gpukit_torch::to_alloc_conf(c);
      CAPTURE(written);
      auto const back = parse_backend_conf(written);
      CHECK(gpukit::to_alloc_conf(back.options) == gpukit::to_alloc_conf(c.options));
      CHECK(back.rounding.divisions == c.rounding.divisions);
      CHECK(back.host_settings == c.host_settings);
      CHECK(gpukit_torch::to_alloc_conf(back) == written);
      CHECK(contains(written, gpukit::to_alloc_conf(c.options)));  // gpukit's own formatter
    }
    auto const c = parse_backend_conf("roundup_power2_divisions:[2:8,8:2,>:4]");
    CHECK(contains(gpukit_torch::to_alloc_conf(c), "roundup_power2_divisions:[1:8,2:8,8:2,>:4]"));
    CHECK(contains(gpukit_torch::to_alloc_conf(parse_backend_conf("roundup_power2_divisions:4")),
                   "roundup_power2_divisions:4"));
    CHECK_FALSE(contains(gpukit_torch::to_alloc_conf(parse_backend_conf("")), "roundup"));
  }

  TEST_CASE("torch conf: PyTorch's keys go through gpukit's table: its ranges, its key names")
  {
    // large_segment_size_mb sets two of gpukit's options, each checked against gpukit's range.
    std::string const huge = torch_error_of("large_segment_size_mb:300000000");
    CHECK(contains(huge, "for 'large_segment_size_mb'"));
    CHECK(contains(huge, gpukit::alloc_conf_range(*gpukit::find_alloc_conf_key(
                           GPUKIT_ALLOC_CONF_FIELD(medium_segment_bytes)))));
    // The option both keys set is named by gpukit's key for it.
    CHECK(contains(torch_error_of("large_segment_size_mb:32,growable_page_bytes:8MiB"),
                   "both set page_size"));
    CHECK(contains(torch_error_of("fraction:0.5,per_process_memory_fraction:0.5"),
                   "'fraction' and 'per_process_memory_fraction' both set limit_fraction"));
    CHECK(
      contains(torch_error_of("release_lock_on_cudamalloc:False,release_lock_on_hipmalloc:False"),
               "both set the lock"));
  }

  TEST_CASE("torch conf: bindings/torch/README.md's table of PyTorch's keys is the table's")
  {
    std::ifstream in{GPUKIT_TORCH_README};
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    std::string const table = gpukit_torch::pytorch_keys_markdown();
    CHECK(contains(table, "| `max_split_size_mb` | refused |"));
    INFO("regenerate the README's table from gpukit_torch::pytorch_keys:\n", table);
    CHECK(contains(text.str(), table));
  }
}
