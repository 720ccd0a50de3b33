// The error measure the kernel and model tests compare with (METHOD.md): the norm-wise relative
// error ‖got − want‖ / ‖want‖, computed in float64; the absolute norm ‖got‖ when want is all
// zeros. NaN anywhere in `got` gives NaN, which fails every `err < tol`.
#pragma once

#include <cmath>
#include <cstddef>

namespace kt::test {

// `got` and `want`: anything with size() and operator[] (std::vector of float, double, ...),
// compared over got.size() elements.
template <class Got, class Want>
double rel_error(const Got& got, const Want& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    num += (g - w) * (g - w);
    den += w * w;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace kt::test
