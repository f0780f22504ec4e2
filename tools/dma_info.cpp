// dma-info: what each libfabric provider offers on this machine, as the library sees it. For
// every provider named (default: tcp, net, shm, sockets, efa, verbs) it lists the domains
// dma::discover_domains finds and opens a FabricService on each, printing its describe(), or
// says why the provider or domain was rejected. Exits 0 if at least one service opened.
#include <CLI/CLI.hpp>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/service.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dma-info: the providers and domains this machine offers"};
  std::vector<std::string> providers{"tcp", "net", "shm", "sockets", "efa", "verbs"};
  std::optional<std::string> bind;
  app.add_option("--provider", providers, "providers to try (repeatable)")
      ->capture_default_str();
  app.add_option("--bind", bind, "local address to bind");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : 2;
  }

  bool any_opened = false;
  for (const std::string& provider : providers) {
    dma::Configuration configuration;
    configuration.providers = {provider};
    configuration.bind = bind;
    std::cout << provider << " (" << dma::canonical_provider(provider) << "):\n";
    auto domains = dma::discover_domains(configuration);
    if (!domains) {
      std::cout << "  rejected: " << domains.error().message() << "\n";
      continue;
    }
    for (const dma::DomainChoice& choice : *domains) {
      auto service = dma::FabricService::start(configuration, nullptr, nullptr, choice.domain);
      if (!service) {
        std::cout << "  domain " << choice.domain << ": rejected: " << service.error().message()
                  << "\n";
        continue;
      }
      any_opened = true;
      std::cout << "  domain " << choice.domain << ": " << (*service)->describe().to_string()
                << "\n";
    }
  }
  std::cout.flush();
  return any_opened ? 0 : 1;
}
