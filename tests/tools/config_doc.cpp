// Rewrites the schema tables of docs/config.md from the code's schema:
//   config_doc docs/config.md
// Everything outside the markers is left as written.

#include <fmt/core.h>

#include <fstream>
#include <sstream>

#include "elastic/config.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: config_doc docs/config.md\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  std::string doc = text.str();
  const std::string begin = "<!-- schema:begin -->\n", end = "<!-- schema:end -->";
  const auto b = doc.find(begin), e = doc.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) {
    fmt::print(stderr, "{}: schema markers not found\n", argv[1]);
    return 1;
  }
  doc.replace(b + begin.size(), e - b - begin.size(), tepdist::elastic::schema_markdown());
  std::ofstream(argv[1]) << doc;
  return 0;
}
