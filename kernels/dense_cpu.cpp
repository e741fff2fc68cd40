#include <cblas.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/dense.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::kernels {

namespace {

// Runs body(r) for every row in parallel; grain keeps small matrices on one thread.
template <typename Body>
void for_rows(int64_t rows, int64_t cols, Body&& body) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, grain), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) body(i);
  });
}

// out[c] = the sum over rows of value(r, c) in double: each block of columns is summed over all rows
// in row order by one task, so results do not depend on the thread count.
template <typename Value>
void column_sums_of(int64_t rows, int64_t cols, Value value, double* out) {
  constexpr int64_t kBlock = 64;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, (cols + kBlock - 1) / kBlock), [&](const tbb::blocked_range<int64_t>& br) {
    for (int64_t b = br.begin(); b < br.end(); ++b) {
      const int64_t c0 = b * kBlock, c1 = std::min(cols, c0 + kBlock);
      double acc[kBlock] = {};
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += value(r, c);
      for (int64_t c = c0; c < c1; ++c) out[c] = acc[c - c0];
    }
  });
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void transpose(ConstMatrixView in, MatrixView out) {
  GALE_ASSERT(out.rows == in.cols && out.cols == in.rows);
  for_rows(out.rows, out.cols, [&](int64_t r) {
    for (int64_t c = 0; c < out.cols; ++c) out.data[r * out.ld + c] = in.data[c * in.ld + r];
  });
}

bool weight_transposed_first(int64_t m, int64_t n, int64_t k, bool tf32) {
  if (m < kWeightTransposedRows || k < 64 || k % 4 != 0 || n > kTransposedWeightBytes / sizeof(float) / k) return false;
  return tf32 || k < n;
}

void add_bias(MatrixView out, const float* bias) {
  for_rows(out.rows, out.cols, [&](int64_t r) {
    float* row = out.row(r);
    for (int64_t c = 0; c < out.cols; ++c) row[c] += bias[c];
  });
}

void fill_block(MatrixView out, float value) {
  for_rows(out.rows, out.cols, [&](int64_t r) { std::fill(out.row(r), out.row(r) + out.cols, value); });
}

void side_by_side(const ColumnBlock* blocks, int count, MatrixView out) {
  GALE_ASSERT(count >= 0 && count <= kMaxSideBySide);
  for_rows(out.rows, out.cols, [&](int64_t r) {
    float* row = out.row(r);
    std::fill(row, row + out.cols, 0.0f);
    for (int b = 0; b < count; ++b) {
      const ColumnBlock& k = blocks[b];
      if (r < k.x.rows) std::copy(k.x.row(r), k.x.row(r) + k.x.cols, row + k.col);
    }
  });
}

void add_bias_relu(MatrixView out, const float* bias) {
  for_rows(out.rows, out.cols, [&](int64_t r) {
    float* row = out.row(r);
    for (int64_t c = 0; c < out.cols; ++c) {
      const float v = row[c] + bias[c];
      row[c] = v > 0.0f ? v : 0.0f;
    }
  });
}

void axpy(ConstMatrixView x, float alpha, MatrixView y) {
  for_rows(y.rows, y.cols, [&](int64_t r) {
    const float* xr = x.row(r);
    float* yr = y.row(r);
    for (int64_t c = 0; c < y.cols; ++c) yr[c] = std::fma(alpha, xr[c], yr[c]);
  });
}

void column_sum(ConstMatrixView x, float* out, bool accumulate) {
  std::vector<double> sums(static_cast<size_t>(x.cols));
  column_sums_of(x.rows, x.cols, [&](int64_t r, int64_t c) { return x.row(r)[c]; }, sums.data());
  for (int64_t c = 0; c < x.cols; ++c) out[c] = static_cast<float>((accumulate ? out[c] : 0.0) + sums[c]);
}

void batch_norm_stats(ConstMatrixView x, float* mean, float* var) {
  std::vector<double> sums(static_cast<size_t>(x.cols)), squares(static_cast<size_t>(x.cols));
  const double n = static_cast<double>(x.rows);
  column_sums_of(x.rows, x.cols, [&](int64_t r, int64_t c) { return static_cast<double>(x.row(r)[c]); }, sums.data());
  column_sums_of(x.rows, x.cols, [&](int64_t r, int64_t c) {
    const double v = x.row(r)[c];
    return v * v;
  }, squares.data());
  for (int64_t c = 0; c < x.cols; ++c) {
    const double m = sums[c] / n;
    mean[c] = static_cast<float>(m);
    var[c] = static_cast<float>(std::max(squares[c] / n - m * m, 0.0));
  }
}

void batch_norm_apply(ConstMatrixView x, const float* mean, const float* var, float eps, const float* gamma,
                      const float* beta, bool relu, MatrixView y) {
  std::vector<float> s(static_cast<size_t>(x.cols));
  for (int64_t c = 0; c < x.cols; ++c) s[c] = gamma[c] / std::sqrt(var[c] + eps);
  for_rows(x.rows, x.cols, [&](int64_t r) {
    const float* in = x.row(r);
    float* out = y.row(r);
    for (int64_t c = 0; c < x.cols; ++c) {
      const float v = (in[c] - mean[c]) * s[c] + beta[c];
      out[c] = relu && !(v > 0.0f) ? 0.0f : v;
    }
  });
}

void batch_norm_backward(ConstMatrixView grad_out, ConstMatrixView x, const float* mean, const float* var, float eps,
                         const float* gamma, const uint32_t* relu_bits, float* grad_gamma, float* grad_beta,
                         MatrixView grad_x) {
  const int64_t cols = x.cols;
  const int64_t words = relu_mask_words(cols);
  // grad_out through ReLU's backward when a mask is given.
  const auto g_at = [&](int64_t r, int64_t c) {
    return relu_bits == nullptr || (relu_bits[r * words + c / 32] >> (c % 32)) & 1u ? grad_out.row(r)[c] : 0.0f;
  };
  std::vector<float> invstd(static_cast<size_t>(cols)), sum_g(static_cast<size_t>(cols)), sum_gx(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) invstd[c] = 1.0f / std::sqrt(var[c] + eps);
  std::vector<double> sums(static_cast<size_t>(cols));
  column_sums_of(x.rows, cols, [&](int64_t r, int64_t c) { return g_at(r, c); }, sums.data());
  for (int64_t c = 0; c < cols; ++c) sum_g[c] = static_cast<float>(sums[c]);
  column_sums_of(x.rows, cols, [&](int64_t r, int64_t c) {
    return g_at(r, c) * ((x.row(r)[c] - mean[c]) * invstd[c]);
  }, sums.data());
  for (int64_t c = 0; c < cols; ++c) sum_gx[c] = static_cast<float>(sums[c]);
  for (int64_t c = 0; c < cols; ++c) {
    grad_gamma[c] += sum_gx[c];
    grad_beta[c] += sum_g[c];
  }
  const float n = static_cast<float>(x.rows);
  for_rows(x.rows, cols, [&](int64_t r) {
    const float* in = x.row(r);
    float* out = grad_x.row(r);
    for (int64_t c = 0; c < cols; ++c) {
      const float xhat = (in[c] - mean[c]) * invstd[c];
      out[c] = gamma[c] * invstd[c] / n * (n * g_at(r, c) - sum_g[c] - xhat * sum_gx[c]);
    }
  });
}

void batch_norm_update_running(const float* mean, const float* var, int64_t rows, float momentum, float* running_mean,
                               float* running_var, int64_t cols) {
  const float unbias = rows > 1 ? static_cast<float>(rows) / static_cast<float>(rows - 1) : 1.0f;
  for (int64_t c = 0; c < cols; ++c) {
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean[c];
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (var[c] * unbias);
  }
}

void relu_forward(ConstMatrixView x, MatrixView out) {
  for_rows(x.rows, x.cols, [&](int64_t r) {
    const float* in = x.row(r);
    float* o = out.row(r);
    for (int64_t c = 0; c < x.cols; ++c) o[c] = in[c] > 0.0f ? in[c] : 0.0f;
  });
}

void relu_mask(ConstMatrixView y, uint32_t* bits) {
  const int64_t words = relu_mask_words(y.cols);
  for_rows(y.rows, y.cols, [&](int64_t r) {
    const float* yr = y.row(r);
    uint32_t* b = bits + r * words;
    for (int64_t w = 0; w < words; ++w) b[w] = 0;
    for (int64_t c = 0; c < y.cols; ++c) {
      if (yr[c] > 0.0f) b[c / 32] |= 1u << (c % 32);
    }
  });
}

void relu_backward_mask(ConstMatrixView grad_out, const uint32_t* bits, MatrixView grad_in) {
  const int64_t words = relu_mask_words(grad_out.cols);
  for_rows(grad_out.rows, grad_out.cols, [&](int64_t r) {
    const float* g = grad_out.row(r);
    const uint32_t* b = bits + r * words;
    float* gi = grad_in.row(r);
    for (int64_t c = 0; c < grad_out.cols; ++c) gi[c] = (b[c / 32] >> (c % 32)) & 1u ? g[c] : 0.0f;
  });
}

void relu_backward(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in) {
  for_rows(y.rows, y.cols, [&](int64_t r) {
    const float* g = grad_out.row(r);
    const float* yr = y.row(r);
    float* gi = grad_in.row(r);
    for (int64_t c = 0; c < y.cols; ++c) gi[c] = yr[c] > 0.0f ? g[c] : 0.0f;
  });
}

void elu_forward(ConstMatrixView x, MatrixView out) {
  for_rows(x.rows, x.cols, [&](int64_t r) {
    const float* in = x.row(r);
    float* o = out.row(r);
    for (int64_t c = 0; c < x.cols; ++c) o[c] = in[c] > 0.0f ? in[c] : std::expm1(in[c]);
  });
}

void elu_backward(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in) {
  for_rows(y.rows, y.cols, [&](int64_t r) {
    const float* g = grad_out.row(r);
    const float* yr = y.row(r);
    float* gi = grad_in.row(r);
    for (int64_t c = 0; c < y.cols; ++c) gi[c] = yr[c] > 0.0f ? g[c] : g[c] * (yr[c] + 1.0f);
  });
}

void dropout_forward(ConstMatrixView x, MatrixView out, float p, uint64_t key) {
  const float scale = 1.0f / (1.0f - p);
  for_rows(x.rows, x.cols, [&](int64_t r) {
    const float* in = x.row(r);
    float* o = out.row(r);
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(x.cols);
    for (int64_t c = 0; c < x.cols; ++c) o[c] = random_uniform(key, base + c) >= p ? in[c] * scale : 0.0f;
  });
}

void dropout_backward(ConstMatrixView grad_out, MatrixView grad_in, float p, uint64_t key) {
  dropout_forward(grad_out, grad_in, p, key);  // the same mask and scale
}

double softmax_cross_entropy_cpu(ConstMatrixView logits, const int32_t* labels, const int64_t* rows, int64_t n_rows,
                                 MatrixView grad, int64_t* correct, int64_t grad_over) {
  const int64_t c = logits.cols;
  if (grad.data) {
    for (int64_t r = 0; r < grad.rows; ++r) std::fill(grad.row(r), grad.row(r) + c, 0.0f);
  }
  const double inv_n = n_rows == 0 ? 0.0 : 1.0 / static_cast<double>(n_rows);
  const double grad_scale = grad_over > 0 ? 1.0 / static_cast<double>(grad_over) : inv_n;
  double loss = 0.0;
  int64_t right = 0;
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t r = rows[i];
    const float* z = logits.row(r);
    const int32_t y = labels[r];
    float mx = z[0];
    int64_t arg = 0;
    for (int64_t k = 1; k < c; ++k) {
      if (z[k] > mx) {
        mx = z[k];
        arg = k;
      }
    }
    right += arg == y;
    double sum = 0.0;
    for (int64_t k = 0; k < c; ++k) sum += std::exp(static_cast<double>(z[k]) - mx);
    const double log_sum = std::log(sum);
    loss += log_sum - (static_cast<double>(z[y]) - mx);
    if (grad.data) {
      float* g = grad.row(r);
      for (int64_t k = 0; k < c; ++k) {
        const double p = std::exp(static_cast<double>(z[k]) - mx - log_sum);
        g[k] += static_cast<float>((p - (k == y ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
  if (correct) *correct = right;
  return loss * inv_n;
}

double softmax_cross_entropy_seeds_cpu(ConstMatrixView logits, const int32_t* labels, const int64_t* label_ids,
                                       MatrixView grad, int64_t* correct, int64_t grad_over) {
  const auto n = static_cast<size_t>(logits.rows);
  std::vector<int64_t> rows(n);
  std::vector<int32_t> by_row(n);
  for (size_t i = 0; i < n; ++i) {
    rows[i] = static_cast<int64_t>(i);
    by_row[i] = labels[label_ids != nullptr ? label_ids[i] : static_cast<int64_t>(i)];
  }
  return softmax_cross_entropy_cpu(logits, by_row.data(), rows.data(), logits.rows, grad, correct, grad_over);
}

void adam_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  const float step_size = static_cast<float>(p.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 4096), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      const float grad = g[i] + p.weight_decay * w[i];
      m[i] = p.beta1 * m[i] + (1.0f - p.beta1) * grad;
      v[i] = p.beta2 * v[i] + (1.0f - p.beta2) * grad * grad;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + p.eps;
      w[i] -= step_size * m[i] / denom;
    }
  });
}

}  // namespace gale::kernels
