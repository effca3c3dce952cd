#include "storage/kv_spill_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

namespace loom::storage {

namespace {

constexpr size_t kAlign = 4096;
constexpr size_t kHeaderBytes = 64;
constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'K', 'V', '1', '\0'};
constexpr uint64_t kReadTag = 1ull << 32;  // user_data of reads; writes carry their index

// One record's header, little-endian as the machine writes it (spill files
// never leave the machine that wrote them).
struct RecordHeader {
  char magic[8];
  uint64_t session;
  uint32_t layer;
  uint32_t block;
  int64_t token_begin;
  uint32_t n_tokens;
  uint32_t dtype;
  uint32_t payload_bytes;
  uint32_t reserved;
  uint64_t checksum;  ///< XXH3-64 of the header (this field zero) and the payload
  uint8_t pad[8];
};
static_assert(sizeof(RecordHeader) == kHeaderBytes);

size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

uint64_t record_checksum(const uint8_t* record, size_t payload_bytes) {
  RecordHeader h;
  std::memcpy(&h, record, sizeof h);
  h.checksum = 0;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &h, sizeof h);
  XXH3_64bits_update(st, record + kHeaderBytes, payload_bytes);
  const uint64_t sum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return sum;
}

std::string errno_text(int err) {
  return std::strerror(err);
}

}  // namespace

struct KvSpillFile::Ring {
  io_uring ring{};
  ~Ring() { io_uring_queue_exit(&ring); }
};

Result<std::unique_ptr<KvSpillFile>> KvSpillFile::open(const SpillOptions& o) {
  if (o.payload_bytes == 0 || o.queue_depth == 0 || o.queue_depth > 1024) {
    return make_error(ErrorCode::kInvalidArgument,
                      "KV spill file: payload (%zu bytes) and queue depth (%u) must be positive "
                      "(depth at most 1024)",
                      o.payload_bytes, o.queue_depth);
  }
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) {
    return make_error(ErrorCode::kIo, "KV spill folder '%s' cannot be created: %s", o.dir.c_str(),
                      ec.message().c_str());
  }
  std::unique_ptr<KvSpillFile> f(new KvSpillFile());
  f->session_ = o.session;
  f->payload_bytes_ = o.payload_bytes;
  f->record_bytes_ = round_up(kHeaderBytes + o.payload_bytes, kAlign);
  f->depth_ = o.queue_depth;
  char name[64];
  std::snprintf(name, sizeof name, "loom-kv-%016" PRIx64 ".spill", o.session);
  f->path_ = (std::filesystem::path(o.dir) / name).string();
  f->fd_ = ::open(f->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (f->fd_ < 0) {
    const int err = errno;
    return make_error(ErrorCode::kIo, "KV spill file '%s' cannot be created: %s", f->path_.c_str(),
                      errno_text(err).c_str());
  }
  // The lock says "this session is alive" to remove_stale_spill_files().
  if (::flock(f->fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    return make_error(ErrorCode::kIo, "KV spill file '%s' cannot be locked: %s", f->path_.c_str(),
                      errno_text(err).c_str());
  }

  const size_t arena_bytes = 2 * static_cast<size_t>(f->depth_) * f->record_bytes_;
  void* arena = nullptr;
  if (posix_memalign(&arena, kAlign, arena_bytes) != 0) {
    return make_error(ErrorCode::kOutOfMemory, "KV spill file: no memory for %zu staging bytes",
                      arena_bytes);
  }
  f->arena_ = static_cast<uint8_t*>(arena);
  std::memset(f->arena_, 0, arena_bytes);

  // O_DIRECT where the filesystem takes it: probe with one aligned record.
  if (o.direct) {
    const int flags = ::fcntl(f->fd_, F_GETFL);
    if (::fcntl(f->fd_, F_SETFL, flags | O_DIRECT) != 0) {
      f->direct_note_ = "O_DIRECT refused (" + errno_text(errno) + "): page-cached I/O";
    } else if (::pwrite(f->fd_, f->arena_, f->record_bytes_, 0) !=
               static_cast<ssize_t>(f->record_bytes_)) {
      f->direct_note_ =
          "this filesystem refuses O_DIRECT writes (" + errno_text(errno) + "): page-cached I/O";
      (void)::fcntl(f->fd_, F_SETFL, flags);
    } else {
      f->direct_ = true;
    }
    if (::ftruncate(f->fd_, 0) != 0) {
      const int err = errno;
      return make_error(ErrorCode::kIo, "KV spill file '%s': %s", f->path_.c_str(),
                        errno_text(err).c_str());
    }
  } else {
    f->direct_note_ = "O_DIRECT not asked for: page-cached I/O";
  }

  auto ring = std::make_unique<Ring>();
  const int rc = io_uring_queue_init(2 * f->depth_, &ring->ring, 0);
  if (rc < 0) {
    return make_error(ErrorCode::kUnsupported,
                      "KV spill file: io_uring is not available here (%s); the SSD tier needs it",
                      errno_text(-rc).c_str());
  }
  // Two registered buffers, the write and the read halves of the arena: a
  // request of several records takes consecutive records of one half.
  const size_t half = static_cast<size_t>(f->depth_) * f->record_bytes_;
  std::vector<iovec> iov = {{f->buffer(0), half}, {f->buffer(f->depth_), half}};
  // Registered buffers save the kernel a page walk per transfer; where the
  // memlock limit refuses them, plain reads and writes on the same buffers.
  f->fixed_ =
      io_uring_register_buffers(&ring->ring, iov.data(), static_cast<unsigned>(iov.size())) == 0;
  f->ring_ = std::move(ring);
  f->batch_.resize(f->depth_);
  f->read_res_.resize(f->depth_);
  f->wres_.resize(f->depth_);
  f->run_.resize(f->depth_);
  return f;
}

KvSpillFile::~KvSpillFile() {
  if (batch_n_ > 0) {
    std::vector<Status> ignored;
    finish_reads(&ignored);
  }
  (void)finish_writes();  // the kernel must be done with the staging before it goes
  ring_.reset();
  if (fd_ >= 0) {
    ::unlink(path_.c_str());
    ::close(fd_);
  }
  std::free(arena_);
}

uint64_t KvSpillFile::file_bytes() const {
  struct stat st {};
  return ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

void KvSpillFile::split_result(int res, unsigned k, int* out) const {
  const auto rec = static_cast<int64_t>(record_bytes_);
  for (unsigned r = 0; r < k; ++r)
    out[r] = res < 0 ? res : static_cast<int>(std::clamp<int64_t>(res - r * rec, 0, rec));
}

void KvSpillFile::note_read(uint64_t tag, int res) {
  const auto i = static_cast<unsigned>(tag & 0xffffffffu);
  split_result(res, run_[i], &read_res_[i]);
  --pending_reads_;
}

uint32_t KvSpillFile::take_slot(uint32_t layer) {
  if (free_.size() <= layer) free_.resize(layer + 1);
  std::vector<uint32_t>& heap = free_[layer];
  if (heap.empty()) {  // a new extent for this layer, at the end of the file
    const uint32_t first = n_slots_;
    n_slots_ += kExtentSlots;
    used_.resize(n_slots_, false);
    extent_layer_.push_back(layer);
    for (uint32_t s = first; s < n_slots_; ++s) {
      heap.push_back(s);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  }
  std::pop_heap(heap.begin(), heap.end(), std::greater<>());
  const uint32_t slot = heap.back();
  heap.pop_back();
  return slot;
}

void KvSpillFile::prep_run(bool write, unsigned first, unsigned i, size_t len, uint32_t slot) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  uint8_t* rec = buffer(first + i);
  const uint64_t off = static_cast<uint64_t>(slot) * record_bytes_;
  const auto bytes = static_cast<unsigned>(len);
  const int half = write ? 0 : 1;  // the registered buffer (open())
  if (write) {
    if (fixed_)
      io_uring_prep_write_fixed(sqe, fd_, rec, bytes, off, half);
    else
      io_uring_prep_write(sqe, fd_, rec, bytes, off);
    io_uring_sqe_set_data64(sqe, i);
    ++stats_.write_requests;
  } else {
    if (fixed_)
      io_uring_prep_read_fixed(sqe, fd_, rec, bytes, off, half);
    else
      io_uring_prep_read(sqe, fd_, rec, bytes, off);
    io_uring_sqe_set_data64(sqe, kReadTag | i);
    ++stats_.read_requests;
  }
}

// One completion, read or write, noted where finish_reads() and
// finish_writes() look for it (either may reap the other's).
void KvSpillFile::note_cqe(uint64_t tag, int res) {
  if (tag & kReadTag) {
    note_read(tag, res);
  } else {
    wres_[static_cast<size_t>(tag)] = res;
    --pending_writes_;
  }
}

// Waits for one completion; false (with the error in *err) when waiting failed.
bool KvSpillFile::reap_one(int* err) {
  io_uring_cqe* cqe = nullptr;
  int w;
  do {
    w = io_uring_wait_cqe(&ring_->ring, &cqe);
  } while (w == -EINTR);
  if (w < 0) {
    *err = w;
    return false;
  }
  note_cqe(io_uring_cqe_get_data64(cqe), cqe->res);
  io_uring_cqe_seen(&ring_->ring, cqe);
  return true;
}

Status KvSpillFile::begin_writes(std::span<const SpillWrite> writes, std::vector<uint32_t>* slots) {
  slots->clear();
  if (wbatch_n_ > 0) {
    return make_error(ErrorCode::kInternal, "KV spill file: a write batch is already in flight");
  }
  if (writes.size() > depth_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "KV spill file: %zu writes in one batch (at most %u)", writes.size(), depth_);
  }
  const auto n = static_cast<unsigned>(writes.size());
  if (n == 0) return {};
  wslots_.clear();
  std::fill(wres_.begin(), wres_.end(), 0);
  for (unsigned i = 0; i < n; ++i) {
    const SpillWrite& w = writes[i];
    const uint32_t slot = take_slot(w.key.layer);
    used_[slot] = true;
    ++n_used_;
    wslots_.push_back(slot);

    uint8_t* rec = buffer(i);
    RecordHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.session = session_;
    h.layer = w.key.layer;
    h.block = w.key.block;
    h.token_begin = w.key.token_begin;
    h.n_tokens = w.key.n_tokens;
    h.dtype = w.key.dtype;
    h.payload_bytes = static_cast<uint32_t>(payload_bytes_);
    std::memcpy(rec, &h, sizeof h);
    std::memcpy(rec + kHeaderBytes, w.payload, payload_bytes_);
    h.checksum = record_checksum(rec, payload_bytes_);
    std::memcpy(rec, &h, sizeof h);

    ++n_writes_;
    if (n_writes_ == faults_.fail_write || n_writes_ == faults_.no_space_write)
      wres_[i] = n_writes_ == faults_.fail_write ? -EIO : -ENOSPC;
  }
  // One request per run of consecutive slots; an injected failure is a nop
  // of its own, whose result replaces the nop's 0 in finish_writes().
  winjected_.assign(wres_.begin(), wres_.begin() + n);
  wrun_.assign(n, 1);
  unsigned requests = 0;
  for (unsigned i = 0; i < n; i += wrun_[i], ++requests) {
    if (winjected_[i] < 0) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, i);
      continue;
    }
    unsigned k = 1;
    while (i + k < n && winjected_[i + k] == 0 && wslots_[i + k] == wslots_[i + k - 1] + 1) ++k;
    prep_run(true, 0, i, k * record_bytes_, wslots_[i]);
    wrun_[i] = k;
  }
  std::fill(wres_.begin(), wres_.begin() + n, 0);
  wbatch_n_ = n;
  pending_writes_ = requests;
  const int rc = io_uring_submit(&ring_->ring);
  ++stats_.submissions;
  if (rc < 0) {
    // Nothing went to the kernel: the batch fails as a whole in finish_writes.
    std::fill(winjected_.begin(), winjected_.end(), rc);
    pending_writes_ = 0;
  }
  *slots = wslots_;
  return {};
}

Status KvSpillFile::finish_writes() {
  const unsigned n = wbatch_n_;
  if (n == 0) return {};
  int err = 0;
  while (pending_writes_ > 0 && err == 0) {
    if (!reap_one(&err)) pending_writes_ = 0;
  }
  wbatch_n_ = 0;
  Status failed;
  if (err < 0) {
    failed = make_error(ErrorCode::kIo, "KV spill file '%s': io_uring wait failed: %s",
                        path_.c_str(), errno_text(-err).c_str());
  }
  for (unsigned i = 0; i < n; i += wrun_[i]) split_result(wres_[i], wrun_[i], &wres_[i]);
  for (unsigned i = 0; i < n && failed.ok(); ++i) {
    const int r = winjected_[i] < 0 ? winjected_[i] : wres_[i];
    if (r == static_cast<int>(record_bytes_)) continue;
    const uint32_t slot = wslots_[i];
    if (r == -ENOSPC) {
      failed = make_error(ErrorCode::kNoSpace,
                          "KV spill file '%s': the disk is full (writing slot %u, %zu bytes)",
                          path_.c_str(), slot, record_bytes_);
    } else if (r < 0) {
      failed = make_error(ErrorCode::kIo, "KV spill file '%s': writing slot %u failed: %s",
                          path_.c_str(), slot, errno_text(-r).c_str());
    } else {
      failed =
          make_error(ErrorCode::kIo, "KV spill file '%s': short write to slot %u (%d of %zu bytes)",
                     path_.c_str(), slot, r, record_bytes_);
    }
  }
  if (!failed.ok()) {  // no slot of the batch stays taken
    for (uint32_t s : wslots_) release(s);
    return failed;
  }
  stats_.records_written += n;
  stats_.bytes_written += static_cast<uint64_t>(n) * record_bytes_;
  return {};
}

Status KvSpillFile::write(std::span<const SpillWrite> writes, std::vector<uint32_t>* slots) {
  slots->clear();
  LOOM_TRY(finish_writes());  // a write-behind batch first: its staging is reused
  Status failed;
  std::vector<uint32_t> part;
  for (size_t done = 0; done < writes.size() && failed.ok();) {
    const size_t n = std::min<size_t>(depth_, writes.size() - done);
    failed = begin_writes(writes.subspan(done, n), &part);
    if (failed.ok()) failed = finish_writes();
    if (failed.ok()) slots->insert(slots->end(), part.begin(), part.end());
    done += n;
  }
  if (!failed.ok()) {
    for (uint32_t s : *slots) release(s);
    slots->clear();
  }
  return failed;
}

Status KvSpillFile::begin_reads(std::span<const SpillRead> reads) {
  if (batch_n_ > 0) {
    return make_error(ErrorCode::kInternal, "KV spill file: a read batch is already in flight");
  }
  if (reads.size() > depth_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "KV spill file: %zu reads in one batch (at most %u)", reads.size(), depth_);
  }
  const auto n = static_cast<unsigned>(reads.size());
  // Whether a record is read whole, with no injected fault (its read being
  // the nth): only such records join a run.
  auto plain = [&](uint32_t slot, int nth) {
    return slot < n_slots_ && used_[slot] && nth != faults_.fail_read && nth != faults_.short_read;
  };
  unsigned requests = 0;
  for (unsigned i = 0; i < n; ++i) {
    const SpillRead& r = reads[i];
    batch_[i] = r;
    read_res_[i] = 0;
    run_[i] = 1;
    ++n_reads_;
    if (r.slot >= n_slots_ || !used_[r.slot] || n_reads_ == faults_.fail_read) {
      // Nothing to read (or an injected failure): the nop completes with the
      // error set below.
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
      io_uring_sqe_set_data64(sqe, kReadTag | i);
      io_uring_prep_nop(sqe);
      read_res_[i] = r.slot >= n_slots_ || !used_[r.slot] ? -ENOENT : -EIO;
      ++requests;
      continue;
    }
    // A run of consecutive slots is one request; a record with an injected
    // fault is a request of its own.
    const bool short_read = n_reads_ == faults_.short_read;
    unsigned k = 1;
    while (!short_read && i + k < n && reads[i + k].slot == reads[i + k - 1].slot + 1 &&
           plain(reads[i + k].slot, n_reads_ + static_cast<int>(k)))
      ++k;
    prep_run(false, depth_, i, short_read ? record_bytes_ / 2 : k * record_bytes_, r.slot);
    run_[i] = k;
    ++requests;
    for (unsigned j = 1; j < k; ++j) {
      batch_[i + j] = reads[i + j];
      read_res_[i + j] = 0;
      ++n_reads_;
    }
    i += k - 1;
  }
  batch_n_ = n;
  pending_reads_ = requests;
  // Injected results survive the nops' completions (note_read keeps the first error).
  injected_.assign(read_res_.begin(), read_res_.begin() + n);
  const int rc = io_uring_submit(&ring_->ring);
  ++stats_.submissions;
  if (rc < 0) {
    // Nothing went to the kernel: the batch fails as a whole in finish_reads.
    for (unsigned i = 0; i < n; ++i) injected_[i] = rc;
    pending_reads_ = 0;
  }
  return {};
}

void KvSpillFile::finish_reads(std::vector<Status>* results) {
  results->clear();
  while (pending_reads_ > 0) {
    int err = 0;
    if (!reap_one(&err)) {
      for (unsigned i = 0; i < batch_n_; ++i) injected_[i] = err;
      pending_reads_ = 0;
      if (pending_writes_ > 0) std::fill(winjected_.begin(), winjected_.end(), err);
      pending_writes_ = 0;  // (finish_writes then fails the write batch with it)
      break;
    }
  }
  for (unsigned i = 0; i < batch_n_; ++i) {
    const SpillRead& r = batch_[i];
    const int res = injected_[i] < 0 ? injected_[i] : read_res_[i];
    const uint8_t* rec = buffer(depth_ + i);
    Status s;
    RecordHeader h;
    std::memcpy(&h, rec, sizeof h);
    if (res == -ENOENT) {
      s = make_error(ErrorCode::kInternal, "KV spill file '%s': slot %u holds no block",
                     path_.c_str(), r.slot);
    } else if (res < 0) {
      s = make_error(ErrorCode::kIo, "KV spill file '%s': reading slot %u failed: %s",
                     path_.c_str(), r.slot, errno_text(-res).c_str());
    } else if (res != static_cast<int>(record_bytes_)) {
      s = make_error(ErrorCode::kIo,
                     "KV spill file '%s': short read of slot %u (%d of %zu bytes): truncated?",
                     path_.c_str(), r.slot, res, record_bytes_);
    } else if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.session != session_ ||
               h.payload_bytes != payload_bytes_) {
      s = make_error(ErrorCode::kFormat,
                     "KV spill file '%s': slot %u has no record of this session (bad header)",
                     path_.c_str(), r.slot);
    } else if (!(SpillBlockKey{h.layer, h.block, h.token_begin, h.n_tokens, h.dtype} == r.key)) {
      s = make_error(ErrorCode::kFormat,
                     "KV spill file '%s': slot %u holds layer %u block %u, expected layer %u "
                     "block %u",
                     path_.c_str(), r.slot, h.layer, h.block, r.key.layer, r.key.block);
    } else if (record_checksum(rec, payload_bytes_) != h.checksum) {
      s = make_error(ErrorCode::kFormat,
                     "KV spill file '%s': checksum mismatch in slot %u (layer %u block %u): the "
                     "bytes on disk changed",
                     path_.c_str(), r.slot, r.key.layer, r.key.block);
    } else {
      std::memcpy(r.out, rec + kHeaderBytes, payload_bytes_);
      ++stats_.records_read;
      stats_.bytes_read += record_bytes_;
    }
    if (!s.ok()) ++stats_.read_failures;
    results->push_back(std::move(s));
  }
  batch_n_ = 0;
}

void KvSpillFile::read(std::span<const SpillRead> reads, std::vector<Status>* results) {
  results->clear();
  std::vector<Status> part;
  for (size_t done = 0; done < reads.size();) {
    const size_t n = std::min<size_t>(depth_, reads.size() - done);
    Status s = begin_reads(reads.subspan(done, n));
    if (!s.ok()) {
      for (size_t i = 0; i < n; ++i) results->push_back(s);
    } else {
      finish_reads(&part);
      for (auto& p : part) results->push_back(std::move(p));
    }
    done += n;
  }
}

void KvSpillFile::release(uint32_t slot) {
  if (slot >= n_slots_ || !used_[slot]) return;
  used_[slot] = false;
  --n_used_;
  std::vector<uint32_t>& heap = free_[extent_layer_[slot / kExtentSlots]];
  heap.push_back(slot);
  std::push_heap(heap.begin(), heap.end(), std::greater<>());
}

int remove_stale_spill_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("loom-kv-", 0) != 0 || name.size() < 6 ||
        name.compare(name.size() - 6, 6, ".spill") != 0) {
      continue;
    }
    const std::string path = (std::filesystem::path(dir) / name).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    // A live session holds the lock; a crashed one left it free.
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(path.c_str()) == 0) ++removed;
    ::close(fd);
  }
  ::closedir(d);
  return removed;
}

}  // namespace loom::storage
