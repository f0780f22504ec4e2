// parse_module_arguments (dma/configuration.hpp): the module's load arguments, read through the
// same schema as TOML files (protocol/settings.hpp). Here, not in module/, so that the schema's
// two parsers live side by side and the tests reach both without a Redis server.
#include <algorithm>
#include <string>
#include <utility>

#include "dma/configuration.hpp"
#include "dma/protocol.hpp"
#include "protocol/settings.hpp"

namespace dma {
namespace {

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

// `value` read for `setting` as its kind says. The argument's name comes from the table; its
// value, and any unknown name, from the server's command line into the log: shown only through
// quote_for_log, clipped so that a huge argument cannot flood the log (found by fuzz/).
template <typename Target>
Result<settings::Value> value_of(const settings::Setting<Target>& setting,
                                 const std::string& value) {
  const std::string name(setting.argument_name);
  switch (setting.kind) {
    case settings::Kind::kStringList:
      return settings::Value(split_list(value));
    case settings::Kind::kString:
      return settings::Value(value);
    case settings::Kind::kBoolean:
      if (value == "true") return settings::Value(true);
      if (value == "false") return settings::Value(false);
      return fail(ErrorCode::kConfiguration, "module argument " + name +
                                                 " must be true or false, not " +
                                                 quote_for_log(value, kMaxQuotedBytes));
    case settings::Kind::kInteger:
    case settings::Kind::kMilliseconds: {
      auto number = parse_decimal(value, name);
      if (!number) {
        return fail(ErrorCode::kConfiguration,
                    "module argument " + name + ": " + number.error().message());
      }
      if (*number < setting.minimum || *number > setting.maximum) {
        return fail(ErrorCode::kConfiguration,
                    "module argument " + name + " must be " +
                        settings::describe_range(setting.minimum, setting.maximum) + ", not " +
                        std::to_string(*number));
      }
      return settings::Value(*number);
    }
  }
  return fail(ErrorCode::kConfiguration, "module argument " + name + " has an unknown kind");
}

template <typename Target>
const settings::Setting<Target>* find_setting(std::span<const settings::Setting<Target>> table,
                                              std::string_view name) {
  const auto found = std::find_if(table.begin(), table.end(), [&](const auto& setting) {
    return setting.argument_name == name;
  });
  return found == table.end() ? nullptr : &*found;
}

}  // namespace

Result<ModuleOptions> parse_module_arguments(std::span<const std::string> arguments) {
  ModuleOptions options;
  if (arguments.size() % 2 != 0) {
    return fail(ErrorCode::kConfiguration,
                "module argument " + quote_for_log(arguments.back(), kMaxQuotedBytes) +
                    " has no value (arguments are name value pairs)");
  }
  for (std::size_t index = 0; index < arguments.size(); index += 2) {
    const std::string& name = arguments[index];
    const std::string& value = arguments[index + 1];
    if (const auto* setting = find_setting(settings::configuration_settings(), name)) {
      DMA_TRY_ASSIGN(settings::Value parsed, value_of(*setting, value));
      setting->apply(options.configuration, std::move(parsed));
    } else if (const auto* own = find_setting(settings::module_settings(), name)) {
      DMA_TRY_ASSIGN(settings::Value parsed, value_of(*own, value));
      own->apply(options, std::move(parsed));
    } else {
      return fail(ErrorCode::kConfiguration, "unknown module argument " +
                                                 quote_for_log(name, kMaxQuotedBytes) +
                                                 " (known: " + settings::known_argument_names() +
                                                 ")");
    }
  }
  if (Status valid = options.configuration.validate(); !valid) {
    return fail(ErrorCode::kConfiguration, "module arguments: " + valid.error().message());
  }
  return options;
}

}  // namespace dma
