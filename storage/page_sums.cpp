#include "storage/page_sums.hpp"

#include <xxhash.h>

namespace gale::storage {

uint32_t page_sum(const void* data, size_t len) { return XXH32(data, len, 0); }

std::string page_sums_path(const std::string& rel) { return "pages/" + rel; }

}  // namespace gale::storage
