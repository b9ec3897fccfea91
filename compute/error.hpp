#pragma once
// Errors of the compute library: values, never exceptions, at every boundary a user can reach.

#include <expected>
#include <string>
#include <utility>

namespace tepdist::compute {

/// What kind of thing went wrong; the message says which file, field or shape.
enum class Errc {
  invalid_argument,  ///< A caller passed something out of contract (bad layer spec, bad shape).
  io,                ///< A file could not be opened, read, written or renamed.
  corrupt,           ///< A file exists but its contents are malformed or fail their checksum.
  mismatch,          ///< Two things that must agree do not (checkpoint vs model, names, sizes).
  diverged,          ///< Training met a loss or gradient that is not finite.
};

/// An error with a message fit to show a user as it is.
struct Error {
  Errc code;
  std::string message;
};

template <class T>
using Result = std::expected<T, Error>;

inline std::unexpected<Error> fail(Errc code, std::string message) {
  return std::unexpected<Error>{Error{code, std::move(message)}};
}

}  // namespace tepdist::compute
