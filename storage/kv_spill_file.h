// The SSD tier of the KV cache: one spill file per session, written and read
// through io_uring (liburing).
//
// The file is an array of fixed-size records, one KV block each. A record is
// a 64-byte header (session, layer, block, token range, dtype, payload size,
// xxHash3 checksum of header and payload) followed by the payload, padded to a
// multiple of 4 KiB so that O_DIRECT transfers stay aligned. Records are
// staged in 4 KiB-aligned buffers registered with the ring, and a batch of
// writes or reads goes to the kernel in one submission.
//
// Slots are handed out per layer, from extents of kExtentSlots consecutive
// slots that each belong to one layer, lowest free slot first. So a layer's
// blocks, spilled oldest first, lie side by side in the file, and records of
// consecutive slots in a batch travel as one request (one read or write of
// many records) instead of one request each: fewer, larger transfers for the
// disk, and one completion per run (docs/PERFORMANCE.md has the figures).
//
// Reading back checks everything: a short read, an I/O error, a header that
// names another block, or a checksum mismatch each give an error naming the
// slot and the cause, and the caller recomputes the block; bytes are never
// used unverified. ENOSPC comes back as ErrorCode::kNoSpace.
//
// The file is `<dir>/loom-kv-<session>.spill`, created O_EXCL and held under
// an exclusive flock while its session lives; it is deleted when the object
// is destroyed. remove_stale_spill_files() deletes the files of sessions that
// died without doing so (their lock is free).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace loom::storage {

/// What a record says about the block it holds; checked again on every read.
struct SpillBlockKey {
  uint32_t layer = 0;
  uint32_t block = 0;       ///< logical block index in the sequence
  int64_t token_begin = 0;  ///< first token the block covers
  uint32_t n_tokens = 0;    ///< tokens the block covers
  uint32_t dtype = 0;       ///< loom::DType id of the payload
  bool operator==(const SpillBlockKey&) const = default;
};

/// Faults to inject (tests): each counter counts operations from 1, 0 = never.
struct SpillFaults {
  int fail_write = 0;      ///< the Nth record write fails with EIO
  int fail_read = 0;       ///< the Nth record read fails with EIO
  int short_read = 0;      ///< the Nth record read returns half the record
  int no_space_write = 0;  ///< the Nth record write fails with ENOSPC (disk full)
};

struct SpillOptions {
  std::string dir;            ///< folder for the file (created if missing)
  uint64_t session = 0;       ///< names the file and goes into every header
  size_t payload_bytes = 0;   ///< bytes of one block's payload (K or V of one layer)
  unsigned queue_depth = 32;  ///< records per submission (and registered buffers per direction)
  bool direct = true;         ///< try O_DIRECT (falls back where the filesystem refuses it)
};

struct SpillWrite {
  SpillBlockKey key;
  const void* payload = nullptr;  ///< payload_bytes bytes
};

struct SpillRead {
  uint32_t slot = 0;
  SpillBlockKey key;    ///< what the slot must hold
  void* out = nullptr;  ///< payload_bytes bytes
};

struct SpillStats {
  uint64_t bytes_written = 0, bytes_read = 0;
  uint64_t records_written = 0, records_read = 0;
  uint64_t read_failures = 0;   ///< reads that failed verification or I/O
  uint64_t submissions = 0;     ///< io_uring_submit calls
  uint64_t read_requests = 0;   ///< reads handed to the kernel (one per run of slots)
  uint64_t write_requests = 0;  ///< writes handed to the kernel (likewise)
};

/// Slots per extent: the longest run of records one request moves.
inline constexpr uint32_t kExtentSlots = 64;

class KvSpillFile {
 public:
  static Result<std::unique_ptr<KvSpillFile>> open(const SpillOptions& options);
  ~KvSpillFile();
  KvSpillFile(const KvSpillFile&) = delete;
  KvSpillFile& operator=(const KvSpillFile&) = delete;

  const std::string& path() const { return path_; }
  /// Whether transfers bypass the page cache (O_DIRECT); when not, why not.
  bool direct_io() const { return direct_; }
  const std::string& direct_io_note() const { return direct_note_; }
  /// Whether the staging buffers are registered with the ring (else plain reads/writes).
  bool fixed_buffers() const { return fixed_; }
  size_t payload_bytes() const { return payload_bytes_; }
  /// Records per submission: the most one begin_reads() takes.
  unsigned queue_depth() const { return depth_; }
  /// Bytes one record takes in the file (header + payload, 4 KiB-aligned).
  size_t record_bytes() const { return record_bytes_; }
  /// Slots in use, and the file's size in bytes.
  size_t slots_used() const { return n_used_; }
  uint64_t file_bytes() const;
  const SpillStats& stats() const { return stats_; }

  /// Writes blocks into free slots of their layers (the lowest first), in
  /// batches of queue_depth records per submission. On success `slots` gets
  /// one slot per write, in order. On failure no slot stays taken and the
  /// error names the cause (kNoSpace when the disk is full, kIo otherwise).
  Status write(std::span<const SpillWrite> writes, std::vector<uint32_t>* slots);

  /// Write-behind: stages up to queue_depth blocks (their payloads may change
  /// or go once this returns), takes their slots (`slots`, in order), submits
  /// them and returns at once. One batch may be in flight, beside a read
  /// batch; finish_writes() completes it.
  Status begin_writes(std::span<const SpillWrite> writes, std::vector<uint32_t>* slots);
  /// Waits for the batch begun by begin_writes. On failure none of its slots
  /// stays taken and the error names the cause, as write()'s does.
  Status finish_writes();
  bool writes_in_flight() const { return wbatch_n_ > 0; }

  /// Starts reading up to queue_depth records (read-ahead): returns at once.
  /// Only one batch may be in flight; finish_reads() completes it.
  Status begin_reads(std::span<const SpillRead> reads);
  /// Waits for the batch begun by begin_reads, verifies each record and copies
  /// its payload to `out`. `results` gets one Status per read, in order: a
  /// failed read says why (I/O error, short read, wrong block, bad checksum);
  /// its `out` is left untouched.
  void finish_reads(std::vector<Status>* results);
  bool reads_in_flight() const { return batch_n_ > 0; }

  /// begin_reads + finish_reads for any number of records.
  void read(std::span<const SpillRead> reads, std::vector<Status>* results);

  /// Gives a slot back (its block was promoted or dropped).
  void release(uint32_t slot);

  void set_faults(const SpillFaults& faults) { faults_ = faults; }

 private:
  KvSpillFile() = default;
  struct Ring;
  void note_read(uint64_t tag, int res);
  void note_cqe(uint64_t tag, int res);
  bool reap_one(int* err);
  uint32_t take_slot(uint32_t layer);
  /// Records [i, i + k) of a batch (buffers `first` + i ...) in one request
  /// from slot `slot` on: a write, or a read tagged as one.
  void prep_run(bool write, unsigned first, unsigned i, size_t len, uint32_t slot);
  /// A run's result `res` as each of its k records' own, into out[0, k).
  void split_result(int res, unsigned k, int* out) const;
  uint8_t* buffer(unsigned i) const { return arena_ + static_cast<size_t>(i) * record_bytes_; }

  std::string path_;
  int fd_ = -1;
  bool direct_ = false, fixed_ = false;
  std::string direct_note_;
  uint64_t session_ = 0;
  size_t payload_bytes_ = 0, record_bytes_ = 0;
  unsigned depth_ = 0;
  uint8_t* arena_ = nullptr;  ///< 2 * depth records: writes [0, depth), reads [depth, 2 depth)
  std::unique_ptr<Ring> ring_;
  std::vector<std::vector<uint32_t>> free_;  ///< per layer: its extents' free slots (min-heap)
  std::vector<uint32_t> extent_layer_;       ///< the layer each extent belongs to
  std::vector<bool> used_;
  std::vector<unsigned> run_;  ///< per batch index: the records its read request covers
  size_t n_used_ = 0;
  uint32_t n_slots_ = 0;          ///< slots the file has ever had (its size / record_bytes)
  std::vector<SpillRead> batch_;  ///< the reads begun by begin_reads
  unsigned batch_n_ = 0;          ///< reads in that batch
  unsigned pending_reads_ = 0;    ///< of which not yet completed
  std::vector<int> read_res_;     ///< each read's completion result
  std::vector<int> injected_;     ///< results fixed before submission (faults, empty slots)
  // The write batch begun by begin_writes (records in buffers [0, depth)).
  std::vector<uint32_t> wslots_;  ///< its slots
  std::vector<unsigned> wrun_;    ///< per batch index: the records its write request covers
  std::vector<int> wres_;         ///< each write's completion result
  std::vector<int> winjected_;    ///< results fixed before submission (faults)
  unsigned wbatch_n_ = 0;         ///< writes in that batch
  unsigned pending_writes_ = 0;   ///< of which requests not yet completed
  SpillStats stats_;
  SpillFaults faults_;
  int n_writes_ = 0, n_reads_ = 0;
};

/// Deletes spill files in `dir` whose session is gone (no process holds their
/// lock). Returns how many were removed; files it cannot open are left alone.
int remove_stale_spill_files(const std::string& dir);

}  // namespace loom::storage
