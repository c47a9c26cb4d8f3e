// See param_offload.h.
#include "parallel/zero/param_offload.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/error.h"
#include "util/units.h"

namespace shardlm::parallel {
namespace {

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Aligned blocks freed by their tensors wait here for the next request they fit (the smallest that
// does): the gathers and the step ask for the same sizes every step, so the blocks are faulted in once
// and the heap does not fragment between 4096-aligned and other allocations (measured on the demo
// model: without this the peak RSS crept up by ~30 MB over six steps). release_cached_blocks() gives
// them back (after the shards were first written out, and with checkpoints).
struct BlockCache {
  std::mutex mu;
  std::multimap<size_t, void*> free;  // capacity -> block
};
BlockCache& block_cache() {
  static auto* cache = new BlockCache;  // never destroyed: tensors may free blocks during exit
  return *cache;
}
struct Block {
  void* p;
  size_t capacity;
};
void return_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  {
    auto& c = block_cache();
    const std::lock_guard<std::mutex> lock(c.mu);
    c.free.emplace(b->capacity, b->p);
  }
  delete b;
}

}  // namespace

void ParamOffload::release_cached_blocks() {
  auto& c = block_cache();
  const std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [capacity, p] : c.free) std::free(p);
  c.free.clear();
}

ParamOffload::ParamOffload(std::vector<at::Tensor> shards, ParamOffloadOptions opts) : opts_(std::move(opts)) {
  if (opts_.buffer_count < 2)
    fail("zero_optimization.offload_param.buffer_count = ", opts_.buffer_count, ": the optimizer step streams the ",
         "offloaded parameter shards through at least 2 buffers (one read ahead while one steps); set it to 2 or more "
         "(DeepSpeed's default is 5)");
  int64_t largest = 0;
  units_.resize(shards.size());
  for (size_t u = 0; u < shards.size(); ++u) {
    if (!shards[u].defined()) continue;
    auto& x = units_[u];
    if (!shards[u].is_cpu() || !shards[u].is_contiguous() || shards[u].storage_offset() != 0 ||
        static_cast<int64_t>(shards[u].storage().nbytes()) != shards[u].nbytes())
      fail("internal: parameter offload needs each shard on the CPU, owning its storage");
    x.shard = shards[u];
    x.bytes = static_cast<int64_t>(x.shard.nbytes());
    x.file = "shardlm_" + opts_.name + "." + std::to_string(::getpid()) + ".r" + std::to_string(opts_.rank) + ".u" +
             std::to_string(u);
    bytes_ += x.bytes;
    largest = std::max(largest, align_up(x.bytes, util::kDirectIoAlignment));
  }
  util::FileStoreOptions so;
  so.dir = opts_.dir;
  so.key = opts_.key;
  so.buffer_bytes = 1 << 20;  // staging only where a transfer cannot go straight from or into the memory
  so.buffer_count = 2;
  so.threads = 2;
  so.direct = opts_.direct;
  so.reserve_bytes = bytes_ + largest * opts_.buffer_count;  // + the shards being rewritten
  store_ = std::make_unique<util::FileStore>(so);
  // Written from the memory the shards hold now (copied into aligned memory of their own first).
  for (size_t u = 0; u < units_.size(); ++u) {
    auto& x = units_[u];
    if (!x.shard.defined()) continue;
    const at::Tensor initial = x.shard.clone();
    allocate(x, /*zeroed=*/false);
    x.shard.copy_(initial);
    x.state = State::Resident;
    page_out(u, /*write=*/true);
  }
  finish(/*write=*/false);
  release_cached_blocks();
}

ParamOffload::~ParamOffload() {
  store_.reset();  // waits for I/O in flight
  for (const auto& x : units_) {
    if (!x.shard.defined()) continue;
    ::unlink((opts_.dir + "/" + x.file).c_str());
  }
}

std::string ParamOffload::describe() const {
  size_t n = 0;
  for (const auto& x : units_) n += x.shard.defined() ? 1 : 0;
  return "parameters " + util::format_bytes(static_cast<double>(bytes_)) + " on NVMe at " + opts_.dir + " (" +
         store_->path_detail() + "), " + std::to_string(n) + " of " + std::to_string(units_.size()) +
         " unit shards, read ahead inside the prefetch window; the step streams them through " +
         std::to_string(opts_.buffer_count) + " buffers";
}

void ParamOffload::set_aligned_storage(const at::Tensor& t, size_t bytes, bool zeroed) {
  size_t capacity = static_cast<size_t>(align_up(static_cast<int64_t>(bytes), util::kDirectIoAlignment));
  void* p = nullptr;
  {
    auto& c = block_cache();
    const std::lock_guard<std::mutex> lock(c.mu);
    const auto it = c.free.lower_bound(capacity);
    if (it != c.free.end()) {
      capacity = it->first;
      p = it->second;
      c.free.erase(it);
    }
  }
  if (!p && ::posix_memalign(&p, util::kDirectIoAlignment, capacity) != 0)
    fail("parameter offload: cannot allocate ", util::format_bytes(static_cast<double>(capacity)));
  auto* c = static_cast<char*>(p);
  if (zeroed) std::memset(c, 0, capacity);
  else std::memset(c + bytes, 0, align_up(static_cast<int64_t>(bytes), util::kDirectIoAlignment) - bytes);
  auto* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(p, new Block{p, capacity}, &return_block, c10::Device(c10::kCPU)));
  storage->set_nbytes(bytes);
}

// The shard's storage points at fresh 4096-aligned memory (so O_DIRECT moves it without a copy);
// the tail up to the next 4096 bytes is zero and written with it.
void ParamOffload::allocate(Unit& x, bool zeroed) { set_aligned_storage(x.shard, static_cast<size_t>(x.bytes), zeroed); }

void ParamOffload::free_memory(Unit& x) {
  auto* storage = x.shard.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
  storage->set_nbytes(0);
}

util::FileStore::Ticket ParamOffload::read_into(size_t u, void* dst) {
  auto& x = units_.at(u);
  if (x.state == State::Writing) land(u);  // the file is complete once its write landed
  totals_.bytes_read += x.bytes;
  return store_->read_async(x.file, dst, x.bytes);
}

size_t ParamOffload::in_memory() const {
  size_t n = 0;
  for (const auto& x : units_) n += x.shard.defined() && x.state != State::OnDisk ? 1 : 0;
  return n;
}

void ParamOffload::make_room(size_t budget) {
  while (!writes_.empty() && in_memory() >= budget) land(writes_.front());
}

void ParamOffload::land(size_t u) {
  auto& x = units_[u];
  if (x.state == State::Reading) {
    x.ticket.wait();
    x.state = State::Resident;
  } else if (x.state == State::Writing) {
    writes_.erase(std::find(writes_.begin(), writes_.end(), u));
    x.state = State::OnDisk;
    try {
      x.ticket.wait();
    } catch (...) {
      free_memory(x);  // the store no longer moves it
      throw;
    }
    free_memory(x);
  }
}

void ParamOffload::page_in(size_t u, bool read) {
  auto& x = units_.at(u);
  if (!x.shard.defined()) return;
  if (x.state == State::Writing) land(u);
  if (x.state == State::Reading) land(u);
  if (x.state == State::OnDisk) {
    make_room(static_cast<size_t>(opts_.buffer_count));
    allocate(x, /*zeroed=*/!read);
    x.state = State::Resident;
    if (read) {
      store_->read(x.file, x.shard.data_ptr(), x.bytes);
      totals_.bytes_read += x.bytes;
    }
  }
  if (!read) return;
  for (size_t v = u + 1; v < units_.size() && in_memory() < static_cast<size_t>(opts_.buffer_count); ++v) {
    auto& y = units_[v];
    if (!y.shard.defined() || y.state != State::OnDisk) continue;
    allocate(y, /*zeroed=*/false);
    y.ticket = store_->read_async(y.file, y.shard.data_ptr(), y.bytes);
    y.state = State::Reading;
    totals_.bytes_read += y.bytes;
  }
}

void ParamOffload::page_out(size_t u, bool write) {
  auto& x = units_.at(u);
  if (!x.shard.defined()) return;
  if (x.state == State::Reading) land(u);
  if (x.state != State::Resident) return;
  if (!write) {
    free_memory(x);
    x.state = State::OnDisk;
    return;
  }
  // In place (util/direct_file_store.h): no read of this file is in flight (paged in above).
  x.ticket = store_->write_async(x.file, x.shard.data_ptr(), align_up(x.bytes, util::kDirectIoAlignment));
  x.state = State::Writing;
  writes_.push_back(u);
  totals_.bytes_written += x.bytes;
  make_room(static_cast<size_t>(opts_.buffer_count));
}

void ParamOffload::finish(bool write) {
  for (size_t u = 0; u < units_.size(); ++u) page_out(u, write);
  while (!writes_.empty()) land(writes_.front());
}

}  // namespace shardlm::parallel
