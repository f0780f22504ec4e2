// The bodies of the libFuzzer targets, shared by the fuzz executables (fuzz/fuzz_*.cpp, built by
// the clang-only `fuzz` preset) and the corpus replay test (tests/test_fuzz_corpus.cpp, built in
// every normal build), so CI checks the kept corpus even without a clang run.
//
// Each function runs one input through a parser and checks what the parser promises about its
// result, not only that it returns: a round trip that changes the value, a count or total out of
// its bound, or an error message that could split a RESP reply is reported as a violation. A
// crash, a sanitizer report or an exception escaping the parser is left to propagate, so that
// libFuzzer records it as a crash and gtest as a failure.
//
// Thread-safety: pure functions of their input.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace dma::fuzz {

// What went wrong with one input, or nothing if every invariant held.
using Violation = std::optional<std::string>;

// parse_advertisement (both overloads), hex_decode/hex_encode and parse_decimal on arbitrary
// bytes: a parsed advertisement survives to_wire and re-parsing, and its fields are the input's
// fields in their one canonical spelling; hex and decimal agree with a straightforward reference
// (which never wraps a number past 2^64 - 1); errors are printable ASCII.
Violation advertisement(std::span<const std::uint8_t> input);

// Configuration::parse_toml on arbitrary text: an accepted configuration validates, and written
// back as TOML parses to the same configuration; a refused one has a one-line message.
Violation configuration(std::span<const std::uint8_t> input);

// The input split on spaces into fields, given to parse_module_arguments, parse_regions,
// parse_set_arguments (with a small and the default max-value-size) and parse_setplain_options:
// accepted options are in range, accepted regions are 1..kMaxRemoteRegions non-empty triples
// whose total is their exact sum, an accepted SET length fits both max-value-size and the
// regions, a write's options (CRC, TTL, NX/XX, GET) agree with a reference grammar; every error
// (replied to a client, or logged at load time) is printable ASCII.
Violation module_arguments(std::span<const std::uint8_t> input);

struct Target {
  std::string_view name;  // also the corpus directory: fuzz/corpus/<name>/
  Violation (*run)(std::span<const std::uint8_t>);
};
inline constexpr std::array<Target, 3> kTargets{{
    {"advertisement", &advertisement},
    {"configuration", &configuration},
    {"module_arguments", &module_arguments},
}};

// For the libFuzzer entry points: runs `target` and aborts, printing the violation, if an
// invariant broke (libFuzzer then saves the input as a crash).
void run_or_abort(Violation (*target)(std::span<const std::uint8_t>), const std::uint8_t* data,
                  std::size_t size);

}  // namespace dma::fuzz
