// A client's report line: writing it, parsing it, and naming an error's cause for it.
#include "soak/tally.hpp"

#include <cstdlib>
#include <sstream>

namespace dma::soak {

std::uint64_t sum_of(const Counts& counts) {
  std::uint64_t total = 0;
  for (const auto& [cause, count] : counts) total += count;
  return total;
}

std::string Tally::line() const {
  std::ostringstream out;
  out << "stats " << gets << ' ' << sets << ' ' << bytes << ' ' << mismatches;
  for (const auto& [cause, count] : errors) out << " op:" << cause << '=' << count;
  for (const auto& [cause, count] : reconnects) out << " reconnect:" << cause << '=' << count;
  return out.str();
}

std::optional<Tally> Tally::parse(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  Tally tally;
  if (!(in >> word) || word != "stats") return std::nullopt;
  if (!(in >> tally.gets >> tally.sets >> tally.bytes >> tally.mismatches)) return std::nullopt;
  while (in >> word) {
    const auto colon = word.find(':');
    const auto equals = word.rfind('=');
    if (colon == std::string::npos || equals == std::string::npos || equals < colon) continue;
    const std::string kind = word.substr(0, colon);
    Counts& counts = kind == "op" ? tally.errors : tally.reconnects;
    counts[word.substr(colon + 1, equals - colon - 1)] +=
        std::strtoull(word.c_str() + equals + 1, nullptr, 10);
  }
  return tally;
}

void Tally::add(const Tally& other) {
  gets += other.gets;
  sets += other.sets;
  bytes += other.bytes;
  mismatches += other.mismatches;
  for (const auto& [cause, count] : other.errors) errors[cause] += count;
  for (const auto& [cause, count] : other.reconnects) reconnects[cause] += count;
}

std::string cause_of(const Error& error) {
  std::string cause(to_string(error.code()));
  std::string words;
  int taken = 0;
  for (char c : error.message()) {
    if (c == ' ') {
      if (++taken == 4) break;
      words += '_';
    } else if (c == ':' || c == '=' || c == '\n' || c == '\r') {
      break;
    } else {
      words += c;
    }
  }
  for (char& c : cause) c = c == ' ' ? '_' : c;
  return cause + "/" + words;
}

}  // namespace dma::soak
