// The multi-process tests' child helper (tests/support/process.hpp).

#include <catch2/catch.hpp>

#include "tests/support/process.hpp"

using tepdist::test::Child;

TEST_CASE("a child that writes more than a pipe holds before it exits is waited for, and all it wrote kept",
          "[cli][process]") {
  // 1 MiB: sixteen times a pipe's 64 KiB, so a wait that does not read would wait forever.
  Child child({"/bin/sh", "-c", "head -c 1048576 /dev/zero | tr '\\000' x; exit 3"});
  CHECK(child.wait() == 3);
  CHECK(child.all().size() == 1048576);
}
