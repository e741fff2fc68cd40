// engine/train/read_ahead.hpp — the disk tier's look-ahead over one worker's batches, epoch after
// epoch (DESIGN.md, "Out of core"; Ginex's superbatch, with a sorted pass in place of per-row
// reads).
//
// Two threads of its own run ahead of training. The sampling thread samples the batches ahead,
// with the keys training will use (so it finds exactly the node sets the pipeline will), and
// collects the rows they miss in the host cache into windows; the reading thread reads each
// window's distinct misses in one pass sorted by offset and coalesced
// (storage::DiskFeatures::read_window) while the batches before it train, and the next window is
// sampled meanwhile. A cold page that several batches of a window need is read once.
//
// The windows' rows live in one pool of slots (storage::RowPool) that all windows share: a row
// stays in its slot after its window is done, while the pool has room, so a later window that needs
// it finds it there instead of reading it again. A window's own distinct misses fill at most a
// quarter of the pool; two windows are alive at once (the one batches read from and the next, being
// read), and the rest of the pool keeps rows for later windows. To make room for a window's new
// rows, the pool drops rows neither live window needs: first those that no window planned ahead
// needs, least recently needed first, then those needed latest (Belady's choice, over what the
// sampling thread knows of the future). The sampling thread plans up to 8 windows past the one it
// hands to the reading thread next, so their misses rank what the pool keeps, and hands the next
// one over early whenever the reading thread has nothing queued. The first window of a read-ahead
// is a sixteenth of a full one, and each next one up to `growth` times the last, so training starts
// after a short read; a window also ends after a number of batches that grows likewise (128 at
// first, 2,048 at most), so where few rows miss the cache training does not wait for the whole run
// to be sampled. And once training comes within a few batches of the end of the windows handed over
// while the reading thread has nothing to read, the window being sampled goes at once, however few
// batches it holds (read_ahead_cuts_when_caught_up). Where the GPU samples a run of several epochs,
// the sampling runs at most half an epoch past the batches prepared (read_ahead_lead), so the
// first epoch's training does not run beside the sampling of the later ones.
//
// Simulated on R-MAT 20 with the memory of a 4 GB run (bench/readahead_sim.py --pool 0.25
// --pool-horizon 8), the pool reads 0.56x the rows of two windows that keep nothing, against 0.72x
// for windows that carried half their rows from the window before (this design's predecessor) and
// 0.46x for Belady over single batches; with the memory of an 8 GB run it reads only the compulsory
// misses (0.79x), where carrying never started. GALE_READ_AHEAD_KEEP=0 keeps only the live windows'
// rows, for measuring.
//
// The pool keeps rows, but the disk reads pages: a page holding rows of two windows would be read
// by each. So when a window is handed to the reading thread, the rows of the windows planned after
// it that lie on the pages its read covers (its new rows' pages and the gaps read through between
// them), and that the pool does not hold, ride along with its read into free slots, or slots of
// rows no planned window needs (at most a window's worth): the later windows find them in the pool.
// So do their rows near those pages, chained across gaps of up to one page fewer than the disk
// tier's own (a row costs its pages and the gap now, where its own window might spend a request on
// it): on R-MAT 25 in 8 GB (one H200) that took 0.65x the requests and 10-28% less read time; in
// 4 GB it cut the requests 41% but read 1.5x the bytes, in the same time.
// GALE_READ_AHEAD_RIDE=0 turns riders off, GALE_READ_AHEAD_CHAIN=0 the chains, for measuring.
//
// A window's read may be split into parts (read_ahead_parts; off unless GALE_READ_AHEAD_PARTS is
// set): part p reads the rows first needed by the p-th run of its batches, and every row of the
// later parts (and every rider) that its read would merge, so a page is still read once; its
// batches train as soon as it is read, while the next part is read. Where one window holds most of
// an epoch's misses (R-MAT 25 in 8 GB), its batches otherwise all wait for the whole read. The
// parts share one map of the whole window's rows; a part that cannot be read leaves its batches,
// and those of the parts after it, to read their own misses.
//
// The read-ahead's memory is `bytes`, charged to the disk tier's budget: the pool's rows, and its
// bookkeeping, charged at the start (shape): a bit per node for the window being grown, the plan
// of the pool (each slot's row and when it was last needed, the free slots, the lists that choose
// what it drops), and the ids and slots of the windows planned ahead and alive. Beside `bytes`, in
// the room the pool leaves for it, the reading thread keeps one staging buffer for every window's
// read (storage::ReadStaging, registered with io_uring once).
//
// The batches run on across epochs: the next epoch's first window is sampled
// and read while this epoch's last one trains, so an epoch does not begin by waiting for a pass
// over the disk.
//
// Sampling twice costs GPU (or CPU) time that keeping the sampled batches would not; keeping W
// sampled batches would cost their blocks' memory instead, which is what a run beyond memory has
// least of. The windows change where rows come from, never which: batches see the same bits.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "kernels/cuda/budget.hpp"
#include "storage/disk_features.hpp"

namespace gale::engine::train_parts {

// How many times larger each window may grow than the last, up to the full window. Faster growth
// reaches the full window sooner, so fewer of the first epoch's windows read again the pages of
// rows an earlier, smaller one had already dropped, but leaves the disk idle longer while the larger
// window is sampled. Measured on R-MAT 25 in 8 GB (one H200, GPU sampler; docs/performance.md):
// growth 16 read 13.9 GB in the first epoch against 24.4 GB at 2, and took 18.0 s against 22.7;
// on the CPU sampler (R-MAT 20) 16 read 22% fewer bytes but batches waited 4.5x as long for the
// larger windows. So 16 when the GPU samples, 2 when the CPU does; GALE_READ_AHEAD_GROWTH (>= 1.05,
// fractions too) overrides both, for measuring. With the store written `--relabel hot`, 2, 4 and 16
// gave the same 8 GB first epoch (8.75-8.85 s), 16 reading the fewest bytes; 1.25 (windows of 32
// batches at first) read 6.65 GB against 3.51 and took 13.7 s against 9.0 (thirteenth session, two H200s).
double window_growth(bool gpu_sampled);
// The least growth (GALE_READ_AHEAD_GROWTH below it is ignored).
constexpr double kMinWindowGrowth = 1.05;

// How many parts a window's read is split into, by the batches that first need each row (1: the
// whole window at once). A part's batches train once it is read, while the next part is read, so
// a window that holds most of an epoch's misses no longer waits for its whole read; the rows of
// later parts on the pages a part reads are read with it, so each page is still read once.
// GALE_READ_AHEAD_PARTS=K (>= 1) sets it, for measuring; 1 unless set. On R-MAT 25 (one H200, 8 and
// 4 GB) 4 and 8 parts read the same bytes in more requests and did not shorten the epoch: a part
// waits for its whole window to be sampled (docs/performance.md, twelfth session).
int read_ahead_parts();

// How many batches past those prepared so far the sampling thread may sample while windows are
// planned ahead and the reading thread has one queued (0: as far as its 8 windows reach). Without
// a lead, in a run of several epochs on one GPU the first epoch's training ran beside the sampling
// of nearly every later batch (R-MAT 25 in 8 GB, one H200: training 6.7-6.9 s against 4.3 s in
// memory, beside 7.5-7.7 s of sampling). Half an epoch's batches when the GPU samples a run of
// several epochs: there (R-MAT 25 in 8 GB, two runs beside one in memory on one H200, windows cut
// when training catches up) the first epoch took 8.20 s with a lead of 1,500 batches against
// 9.05-9.26 s without, reading 5.73 GB against 4.23 (the pool's choices see less of the future),
// and the three epochs together took no longer (18.4 s against 18.8-19.2); a lead of 600 took
// 8.57 s. 0 when the CPU samples (R-MAT 20: a lead of 40 read 1.2x the bytes in the first epoch and
// 1.9-2.4x in the later ones, and the epochs did not separate on 2 cores) and for one pass
// (inference). GALE_READ_AHEAD_LEAD=N (0: none) overrides it, for measuring.
int64_t read_ahead_lead(bool gpu_sampled, bool later_epochs, int64_t epoch_batches);

// Whether the window being sampled is cut and handed over as soon as training comes within a few
// batches of the end of those handed over while the reading thread has nothing to read, however
// few batches it holds (and a window planned ahead goes at once then, without waiting for the one
// after it to be planned). Without it a window waits for its rows or batches to fill it, and
// for the next window's sampling: where the host cache holds nearly every row, training waited
// for all but the first window's batches of the run. false where GALE_READ_AHEAD_CATCH_UP=0.
bool read_ahead_cuts_when_caught_up();

// Whether the pool keeps rows for later windows (the header); false where GALE_READ_AHEAD_KEEP=0.
bool read_ahead_keeps();
// Whether later windows' rows ride along with a window's read (the header); false where
// GALE_READ_AHEAD_RIDE=0.
bool read_ahead_rides_along();
// Whether rows near the pages a window reads ride along too, chained (the header); false where
// GALE_READ_AHEAD_CHAIN=0.
bool read_ahead_chains_riders();

class ReadAhead {
 public:
  // Batch b's input node ids (an empty batch: none), sampled as the pipeline will sample it.
  // Called from the sampling thread, for several batches at once.
  using SampleInputs = std::function<std::vector<int64_t>(int64_t b)>;
  // One epoch's batches [first, end), in the order training takes them.
  struct Segment {
    int64_t epoch = 0, first = 0, end = 0;
    SampleInputs sample;
  };
  // The segment of the epoch after `epoch` (its batches from 0), or none when the run has no more.
  // Called from the sampling thread.
  using NextSegment = std::function<std::optional<Segment>(int64_t epoch)>;

  // Starts reading ahead from `first`; `bytes`: what the pool and the bookkeeping may hold
  // together; `growth`: how many times larger each window may be than the last (window_growth);
  // `keep`: whether the pool keeps rows for later windows (read_ahead_keeps); `ride_along`: whether
  // later windows' rows on the pages a window reads are read with it (read_ahead_rides_along; only
  // with keep); `chain`: whether rows near those pages ride too, chained (read_ahead_chains_riders);
  // `parts`: how many parts each window's read is split into (read_ahead_parts); `lead`: how far
  // past the batches prepared the sampling may run while windows wait ahead (read_ahead_lead);
  // `catch_up`: whether a window is cut when training catches up (read_ahead_cuts_when_caught_up).
  // Where the disk tier's budget has less room than `bytes` (and a window's staging),
  // the pool is smaller. Throws ResourceError when the budget refuses even the smallest pool.
  ReadAhead(storage::DiskFeatures& disk, uint64_t bytes, double growth, Segment first, NextSegment next,
            bool keep = read_ahead_keeps(), bool ride_along = read_ahead_rides_along(),
            bool chain = read_ahead_chains_riders(), int parts = read_ahead_parts(),
            int64_t lead = 0, bool catch_up = read_ahead_cuts_when_caught_up());
  // Stops the threads (after the read under way) and frees the windows.
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // The window holding batch b of `epoch`'s misses, once read (waits for it; the wait is counted
  // in the disk tier's read_ahead_wait_s). nullptr when the budget refused that window: b reads
  // its own misses. Rethrows the threads' error.
  std::shared_ptr<const storage::WindowRows> window_of(int64_t epoch, int64_t b);
  // Batch b of `epoch` has its rows (or is empty: then it waits for its window): a window all of
  // whose batches do is freed.
  void done(int64_t epoch, int64_t b);

  // The pool's slots, the rows a full window may hold (a quarter of them), and the bytes charged
  // for `bytes` of read-ahead over `num_nodes` rows of `dim` features:
  // pool_bytes + bookkeeping_bytes <= bytes.
  struct Shape {
    int64_t slots = 0;
    int64_t window_rows = 0;
    uint64_t pool_bytes = 0;  // charged by the pool (storage::RowPool)
    uint64_t bookkeeping_bytes = 0;
  };
  static Shape shape(uint64_t bytes, int64_t num_nodes, int64_t dim, int parts = read_ahead_parts());

 private:
  struct Window {
    int64_t first = 0, end = 0;  // positions [first, end) in the sequence of batches
    std::shared_ptr<const storage::WindowRows> rows;
    int64_t pending = 0;  // batches not yet done
    int64_t plan = 0;     // the window's place among those handed over (its parts share it)
  };
  struct Planned {  // a window sampled, not yet read (or one part of it: read_ahead_parts)
    int64_t first = 0, end = 0;
    std::vector<int64_t> ids;    // its distinct misses, ascending
    std::vector<int32_t> slots;  // the pool slot of each; empty: it did not fit (its batches read their own)
    bool alone = false;          // placed as if no window were alive: read once none is
    std::vector<int64_t> extra_ids;    // later windows' rows read with it (ascending), and their slots
    std::vector<int32_t> extra_slots;
    int64_t plan = 0;
    // A part of a window: the whole window's rows, shared by its parts and handed to their batches
    // once the part is read (the parts are read in order, so each finds every row it needs).
    std::shared_ptr<const storage::WindowRows> whole;
    std::vector<int32_t> first_use;  // while planned, with parts: the position of the first batch needing each id
  };
  struct Placed {  // a segment's place in the sequence
    int64_t epoch = 0, first = 0, end = 0, offset = 0;  // batch b is at offset + b - first
  };

  class Handover;  // the windows planned, on their way to the reading thread
  class Batches;   // the batches in sequence, sampled ahead as their misses
  void sample_windows(Segment first, const NextSegment& next);
  // Splits window w (its rows' slots placed; fresh: those of its rows the pool does not hold yet,
  // ascending) into parts of consecutive batches, each reading the rows its batches
  // need first and the later parts' rows (and w's riders) on the pages it reads.
  std::vector<Planned> split_into_parts(Planned w, const std::vector<int64_t>& fresh) const;
  void read_windows();
  // Batch b of epoch's position; waits until the sampling thread has placed that epoch. -1: the
  // sequence ended before it.
  int64_t position(std::unique_lock<std::mutex>& lock, int64_t epoch, int64_t b);
  // The window holding batch b of epoch, once read (waits for it).
  std::deque<Window>::iterator window_at(std::unique_lock<std::mutex>& lock, int64_t epoch, int64_t b);
  void fail(std::exception_ptr e);

  storage::DiskFeatures& disk_;
  const Shape shape_;
  const double growth_;
  const bool keep_;
  const bool ride_along_;
  const bool chain_;
  const int parts_;     // read_ahead_parts
  const int64_t lead_;  // read_ahead_lead
  const bool catch_up_;  // read_ahead_cuts_when_caught_up
  const kernels::cuda::BudgetCharge bookkeeping_;
  const std::shared_ptr<storage::RowPool> pool_;
  // The reading thread's staging for every window (registered with the disk's reader), or null
  // where the budget refused it (each read then stages on its own).
  const std::unique_ptr<storage::ReadStaging> staging_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Placed> placed_;
  std::deque<Planned> planned_;   // sampled, waiting for the reading thread (at most one)
  bool sampled_all_ = false;      // the sampling thread has placed every segment and planned every window
  std::deque<Window> windows_;    // read and alive, oldest first
  int64_t prepared_ = 0;          // past the furthest position done
  bool reader_busy_ = false;      // the reading thread is reading a window
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread sampling_, reading_;  // last: started once everything above exists
};

}  // namespace gale::engine::train_parts
