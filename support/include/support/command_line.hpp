// Comma-separated lists on the command line, shared by dma-demo and dma-bench: sizes with k/m/g
// suffixes ("4k,1m" -> 4096, 1048576; powers of 1024, CLI11's AsSizeValue) and counts ("1,64").
// Each entry is checked on its own, so a bad one is refused by CLI11 naming the option and the
// entry (CLI11 drops empty entries: "4k,,1m" is "4k,1m").
//
// Header-only over CLI11; the options bind to the caller's vectors, which keep their defaults
// unless the option is given.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dma::support {

// AsSizeValue (powers of 1024), its refusal naming the entry: "'4x' is not a size: ...".
inline CLI::Validator size_value() {
  const CLI::AsSizeValue convert(false);
  return CLI::Validator(
      [convert](std::string& input) -> std::string {
        const std::string given = input;
        try {
          const std::string refused = convert(input);
          if (refused.empty()) return {};
          return "'" + given + "' is not a size: " + refused;
        } catch (const CLI::ValidationError& error) {
          return "'" + given + "' is not a size: " + error.what();
        }
      },
      "SIZE[k|m|g]");
}

// --name SIZE[,SIZE...]: each between 1 byte and `largest`.
inline CLI::Option* add_size_list(CLI::App& app, const std::string& name,
                                  std::vector<std::size_t>& sizes, const std::string& description,
                                  std::size_t largest = std::size_t{1} << 40) {
  return app.add_option(name, sizes, description + " (comma-separated; k, m, g suffixes)")
      ->delimiter(',')
      ->transform(size_value())
      ->check(CLI::Range(std::size_t{1}, largest, ""))
      ->capture_default_str();
}

// --name COUNT[,COUNT...]: each at least 1.
inline CLI::Option* add_count_list(CLI::App& app, const std::string& name,
                                   std::vector<std::size_t>& counts,
                                   const std::string& description) {
  return app.add_option(name, counts, description + " (comma-separated)")
      ->delimiter(',')
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20, ""))
      ->capture_default_str();
}

}  // namespace dma::support
