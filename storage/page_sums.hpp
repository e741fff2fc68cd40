// storage/page_sums.hpp — a checksum per 4 KiB page of every array file of a store, so that any
// byte read from the store, whole or a page at a time, is checked before it is used.
//
// The sums of file F (a path relative to the store, such as "graph/indices.npy") are the sidecar
// "pages/F" (e.g. "pages/graph/indices.npy"): a 1-D u32 .npy with one entry per 4096-byte page
// of F, page p covering bytes [4096 p, min(4096 (p + 1), size)), the header page included. Each
// entry is XXH32 (seed 0) of the page's bytes. The manifest lists every sidecar like any other
// file (size and xxHash64, so `gale info --verify` covers them) and carries "page_size": 4096;
// a store without that key has no page sums (written before them; `gale info --add-page-sums`
// adds them in place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gale::storage {

constexpr size_t kPageSumPage = 4096;

// XXH32 (seed 0) of one page's bytes (len <= kPageSumPage; the last page of a file may be short).
uint32_t page_sum(const void* data, size_t len);

// The sidecar's path inside the store for the array file `rel` ("pages/" + rel).
std::string page_sums_path(const std::string& rel);

// Number of pages of a file of `size` bytes.
inline uint64_t page_count(uint64_t size) { return (size + kPageSumPage - 1) / kPageSumPage; }

}  // namespace gale::storage
