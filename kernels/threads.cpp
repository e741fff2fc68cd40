#include "kernels/threads.hpp"

#include <cblas.h>

namespace gale::kernels {

void set_blas_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

}  // namespace gale::kernels
