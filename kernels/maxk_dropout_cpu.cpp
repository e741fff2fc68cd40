// Dropout on CBSR values with the dense form's masks (kernels/maxk.hpp), CPU reference.
#include <tbb/parallel_for.h>

#include "kernels/maxk.hpp"
#include "kernels/random.hpp"

namespace gale::kernels {

void cbsr_dropout_cpu(const CbsrView& x, float p, uint64_t key) {
  if (p <= 0.0f) return;
  const float scale = 1.0f / (1.0f - p);  // as dropout_forward computes it
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, x.rows, 1024), [&](const tbb::blocked_range<int64_t>& rows) {
    for (int64_t r = rows.begin(); r < rows.end(); ++r) {
      for (int64_t t = 0; t < x.k; ++t) {
        const uint64_t counter = static_cast<uint64_t>(r * x.width + x.column(r, t));
        float& v = x.values[r * x.k + t];
        v = random_uniform(key, counter) >= p ? v * scale : 0.0f;
      }
    }
  });
}

}  // namespace gale::kernels
