// SPDX-License-Identifier: Apache-2.0
// fuzz_argv.hpp: a fuzz input as a command line, for the argument harnesses
// (tests/fuzz/*_args_fuzz.cpp). The input is split at newline and NUL bytes into arguments (so
// empty arguments and arguments with spaces can be spelled; a trailing separator adds nothing),
// at most max_arguments of them, after the program's name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gpukit_fuzz {

/// A command line that owns its strings: argc() and argv() as main receives them.
class fuzz_argv {
 public:
  static constexpr std::size_t max_arguments = 24;

  fuzz_argv(char const* program, std::uint8_t const* data, std::size_t size)
  {
    words_.emplace_back(program);
    std::string word;
    for (std::size_t i = 0; i < size && words_.size() <= max_arguments; ++i) {
      char const c = static_cast<char>(data[i]);
      if (c == '\n' || c == '\0') {
        words_.push_back(word);
        word.clear();
      } else {
        word += c;
      }
    }
    if (!word.empty() && words_.size() <= max_arguments) words_.push_back(word);
  }

  /// The program's name, then the arguments: to look at or rewrite before argv() is taken.
  [[nodiscard]] std::vector<std::string>& words() noexcept { return words_; }

  [[nodiscard]] int argc() const noexcept { return static_cast<int>(words_.size()); }
  /// Pointers into words(): valid until words() changes.
  [[nodiscard]] char** argv()
  {
    pointers_.clear();
    for (auto& w : words_) pointers_.push_back(w.data());
    pointers_.push_back(nullptr);
    return pointers_.data();
  }

 private:
  std::vector<std::string> words_;
  std::vector<char*> pointers_;
};

}  // namespace gpukit_fuzz
