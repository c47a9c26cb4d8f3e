// See state_offload.h.
#include "parallel/zero/state_offload.h"

#include <ATen/ATen.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "optim/quantized_state.h"
#include "util/error.h"
#include "util/units.h"

namespace shardlm::parallel {
namespace {

constexpr int64_t kRegionAlign = 64;  // each tensor of a chunk starts on a cache line

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

at::Tensor view_of(char* base, int64_t off, int64_t numel, at::ScalarType dtype) {
  return at::from_blob(base + off, {numel}, at::TensorOptions().dtype(dtype));
}

}  // namespace

StateOffload::StateOffload(optim::AdamW& adam, bool separate_masters, StateOffloadOptions opts)
    : adam_(adam), separate_masters_(separate_masters), opts_(std::move(opts)) {
  if (opts_.buffer_count < 2)
    fail("zero_optimization.offload_optimizer.buffer_count = ", opts_.buffer_count, ": NVMe offload streams the states "
         "through at least 2 buffers (one read ahead while one steps); set it to 2 or more (DeepSpeed's default is 4)");
  const auto& segs = adam_.segments();
  for (size_t i = 0; i < segs.size(); ++i) {
    if (!segs[i].param.is_cpu())
      fail("internal: zero_optimization.offload_optimizer.device \"nvme\" pages host memory; the masters of ",
           segs[i].name, " are on ", segs[i].param.device(), " (a GPU run keeps them apart in host memory)");
    master_dtype_.push_back(segs[i].param.scalar_type());
    moment_dtype_.push_back(adam_.exp_avg(i).scalar_type());
  }
  plan_chunks(std::max<int64_t>(opts_.chunk_elements, 4 * optim::kQuantBlock));
  util::FileStoreOptions so;
  so.dir = opts_.dir;
  so.key = opts_.key;
  so.buffer_bytes = 512 << 10;  // staging only where a transfer cannot go straight from the chunk buffers
  so.buffer_count = 1;
  so.threads = 2;
  so.direct = opts_.direct;
  so.reserve_bytes = bytes_ + chunk_capacity_ * opts_.buffer_count;  // + the chunks being rewritten
  store_ = std::make_unique<util::FileStore>(so);
  for (size_t k = 0; k < chunks_.size(); ++k)
    chunks_[k].file = "shardlm_" + opts_.name + "." + std::to_string(::getpid()) + ".r" + std::to_string(opts_.rank) + ".c" +
                      std::to_string(k);
  for (int b = 0; b < opts_.buffer_count; ++b) {
    void* p = nullptr;
    if (::posix_memalign(&p, util::kDirectIoAlignment, static_cast<size_t>(chunk_capacity_)) != 0)
      fail("NVMe offload: cannot allocate ", opts_.buffer_count, " buffers of ", util::format_bytes(chunk_capacity_));
    std::memset(p, 0, static_cast<size_t>(chunk_capacity_));  // touched once, now
    buffers_.emplace_back(static_cast<char*>(p), std::free);
  }
  paged_in_ = true;  // the states are in the optimizer now: write them out
  page_out(/*write=*/true);
}

void StateOffload::return_freed_memory() {
  // The process keeps freed heap memory (cli/launch.h sets glibc's trim and mmap thresholds high, so
  // that steps do not fault their buffers in again); the states just written out would stay resident
  // as free heap. Give those pages back to the system.
  ::malloc_trim(0);
}

StateOffload::~StateOffload() {
  store_.reset();  // waits for I/O in flight
  for (const auto& c : chunks_)
    ::unlink((opts_.dir + "/" + c.file).c_str());
}

void StateOffload::plan_chunks(int64_t chunk_elements) {
  const auto& segs = adam_.segments();
  Chunk cur;
  int64_t used = 0, elements = 0;
  auto close = [&] {
    if (cur.pieces.empty()) return;
    cur.bytes = align_up(used, util::kDirectIoAlignment);
    bytes_ += used;
    chunk_capacity_ = std::max(chunk_capacity_, cur.bytes);
    chunks_.push_back(std::move(cur));
    cur = Chunk{};
    used = 0;
    elements = 0;
  };
  for (size_t i = 0; i < segs.size(); ++i) {
    const int64_t n = segs[i].param.numel();
    const bool int8 = adam_.format(i) == optim::StatePrecision::Int8;
    const int64_t master_b = separate_masters_ ? at::elementSize(master_dtype_[i]) : 0;
    const int64_t moment_b = at::elementSize(moment_dtype_[i]);
    int64_t pos = 0;
    while (pos < n) {
      int64_t take = std::min(n - pos, chunk_elements - elements);
      if (take < n - pos && take > 0) {  // a cut inside the segment
        if (int8) take -= (segs[i].param_offset + pos + take) % optim::kQuantBlock;
        else take -= take % 64;
      }
      if (take <= 0) {
        if (cur.pieces.empty()) fail("internal: NVMe offload chunks of ", chunk_elements, " elements hold no piece");
        close();
        continue;
      }
      PieceLayout pl{i, pos, take, int8 ? optim::blocks_touched(segs[i].param_offset + pos, take) : 0};
      auto region = [&](int64_t bytes) {
        used = align_up(used, kRegionAlign);
        const int64_t off = used;
        used += bytes;
        return off;
      };
      if (separate_masters_) pl.master_off = region(take * master_b);
      pl.m_off = region(take * moment_b);
      pl.v_off = region(take * moment_b);
      if (int8) {
        pl.a1_off = region(pl.blocks * 4);
        pl.a2_off = region(pl.blocks * 4);
      }
      if (adam_.kahan()) pl.c_off = region(take * 2);  // bf16, per element
      cur.pieces.push_back(pl);
      pos += take;
      elements += take;
    }
  }
  close();
}

util::IoPath StateOffload::io_path() const { return store_->path(); }

std::string StateOffload::describe() const {
  const bool bf16 = adam_.options().masters != optim::MasterRounding::None;
  const std::string what = std::string(separate_masters_ ? (bf16 ? "bf16 masters + " : "fp32 masters + ") : "") +
                           "moments" + (adam_.kahan() ? " + Kahan compensation" : "");
  return "optimizer states (" + what + ") " +
         util::format_bytes(static_cast<double>(bytes_)) + " on NVMe at " + opts_.dir + " (" + store_->path_detail() +
         "), " + std::to_string(chunks_.size()) + " chunks streamed through " + std::to_string(buffers_.size()) +
         " buffers of " + util::format_bytes(static_cast<double>(chunk_capacity_));
}

std::vector<optim::AdamW::Piece> StateOffload::pieces_in(const Chunk& c, char* buf) const {
  std::vector<optim::AdamW::Piece> out;
  const auto& segs = adam_.segments();
  for (const auto& pl : c.pieces) {
    optim::AdamW::Piece p;
    p.segment = pl.segment;
    p.begin = pl.begin;
    p.numel = pl.numel;
    p.param = separate_masters_ ? view_of(buf, pl.master_off, pl.numel, master_dtype_[pl.segment])
                                : segs[pl.segment].param.view({-1}).narrow(0, pl.begin, pl.numel);
    p.exp_avg = view_of(buf, pl.m_off, pl.numel, moment_dtype_[pl.segment]);
    p.exp_avg_sq = view_of(buf, pl.v_off, pl.numel, moment_dtype_[pl.segment]);
    if (pl.a1_off >= 0) {
      p.absmax1 = view_of(buf, pl.a1_off, pl.blocks, at::kFloat);
      p.absmax2 = view_of(buf, pl.a2_off, pl.blocks, at::kFloat);
    }
    if (pl.c_off >= 0) p.compensation = view_of(buf, pl.c_off, pl.numel, at::kBFloat16);
    out.push_back(std::move(p));
  }
  return out;
}

// The piece's slice of the optimizer's resident tensors: elements, and the absmax of its blocks.
namespace {
at::Tensor absmax_slice(const at::Tensor& absmax, int64_t seg_offset, int64_t begin, int64_t blocks) {
  return absmax.narrow(0, optim::first_block(seg_offset + begin) - optim::first_block(seg_offset), blocks);
}
}  // namespace

void StateOffload::fill(const Chunk& c, char* buf) const {
  const auto pieces = pieces_in(c, buf);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto& pl = c.pieces[k];
    const auto& p = pieces[k];
    const auto resident = adam_.resident_piece(pl.segment);
    const int64_t seg_off = adam_.segments()[pl.segment].param_offset;
    if (separate_masters_) p.param.copy_(resident.param.view({-1}).narrow(0, pl.begin, pl.numel));
    p.exp_avg.copy_(resident.exp_avg.view({-1}).narrow(0, pl.begin, pl.numel));
    p.exp_avg_sq.copy_(resident.exp_avg_sq.view({-1}).narrow(0, pl.begin, pl.numel));
    if (p.absmax1.defined()) {
      p.absmax1.copy_(absmax_slice(resident.absmax1, seg_off, pl.begin, pl.blocks));
      p.absmax2.copy_(absmax_slice(resident.absmax2, seg_off, pl.begin, pl.blocks));
    }
    if (p.compensation.defined()) p.compensation.copy_(resident.compensation.view({-1}).narrow(0, pl.begin, pl.numel));
  }
}

void StateOffload::spill(const Chunk& c, const char* buf) {
  const auto pieces = pieces_in(c, const_cast<char*>(buf));
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto& pl = c.pieces[k];
    const auto& p = pieces[k];
    const auto resident = adam_.resident_piece(pl.segment);
    const int64_t seg_off = adam_.segments()[pl.segment].param_offset;
    if (separate_masters_) resident.param.view({-1}).narrow(0, pl.begin, pl.numel).copy_(p.param);
    resident.exp_avg.view({-1}).narrow(0, pl.begin, pl.numel).copy_(p.exp_avg);
    resident.exp_avg_sq.view({-1}).narrow(0, pl.begin, pl.numel).copy_(p.exp_avg_sq);
    if (p.absmax1.defined()) {
      absmax_slice(resident.absmax1, seg_off, pl.begin, pl.blocks).copy_(p.absmax1);
      absmax_slice(resident.absmax2, seg_off, pl.begin, pl.blocks).copy_(p.absmax2);
    }
    if (p.compensation.defined()) resident.compensation.view({-1}).narrow(0, pl.begin, pl.numel).copy_(p.compensation);
  }
}

void StateOffload::page_in(const std::function<at::Tensor(size_t)>& master_for) {
  if (paged_in_) return;
  at::NoGradGuard no_grad;
  const auto& segs = adam_.segments();
  for (size_t i = 0; i < segs.size(); ++i) {
    const int64_t n = segs[i].grad.numel();
    at::Tensor master = separate_masters_ ? master_for(i) : at::Tensor();
    at::Tensor a1, a2;
    if (adam_.format(i) == optim::StatePrecision::Int8) {
      const int64_t blocks = optim::blocks_touched(segs[i].param_offset, n);
      a1 = at::zeros({blocks}, at::kFloat);
      a2 = at::zeros({blocks}, at::kFloat);
    }
    adam_.adopt_state(i, master, at::empty({n}, at::TensorOptions().dtype(moment_dtype_[i])),
                      at::empty({n}, at::TensorOptions().dtype(moment_dtype_[i])), a1, a2,
                      adam_.kahan() ? at::empty({n}, at::kBFloat16) : at::Tensor());
  }
  char* buf = buffers_[0].get();
  for (const auto& c : chunks_) {
    store_->read(c.file, buf, c.bytes);
    totals_.bytes_read += c.bytes;
    spill(c, buf);
  }
  paged_in_ = true;
}

void StateOffload::page_out(bool write) {
  if (!paged_in_) return;
  at::NoGradGuard no_grad;
  if (write) {
    // Two buffers in turn: one filled while the other is written.
    std::vector<Pending> in_flight(2);
    try {
      for (size_t k = 0; k < chunks_.size(); ++k) {
        auto& slot = in_flight[k % 2];
        land(slot, nullptr);
        fill(chunks_[k], buffers_[k % 2].get());
        start_write(slot, k, buffers_[k % 2].get());
      }
      for (auto& w : in_flight) land(w, nullptr);
    } catch (...) {
      for (auto& w : in_flight) try { w.ticket.wait(); } catch (...) {}
      throw;
    }
  }
  for (size_t i = 0; i < adam_.segments().size(); ++i) adam_.drop_state(i, separate_masters_);
  paged_in_ = false;
}

// A chunk is written back over its file in place (util/direct_file_store.h: the blocks are reused, so
// no allocation and no discard of freed blocks per step); its read has landed before the step used it.
void StateOffload::start_write(Pending& w, size_t k, const char* buf) {
  w.ticket = store_->write_async(chunks_[k].file, buf, chunks_[k].bytes);  // in place: its read has landed
  w.chunk = static_cast<int64_t>(k);
  totals_.bytes_written += chunks_[k].bytes;
}

void StateOffload::land(Pending& w, double* wait_seconds) {
  if (w.chunk < 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  w.chunk = -1;
  w.ticket.wait();
  if (wait_seconds) *wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool StateOffload::shares(const PieceLayout& pl) const {
  optim::AdamW::Piece p;
  p.segment = pl.segment;
  p.begin = pl.begin;
  p.numel = pl.numel;
  return adam_.shares_blocks(p);
}

bool StateOffload::shares_blocks() const {
  for (const auto& c : chunks_)
    for (const auto& pl : c.pieces)
      if (shares(pl)) return true;
  return false;
}

std::vector<std::vector<OffloadPiece>> StateOffload::chunk_pieces() const {
  std::vector<std::vector<OffloadPiece>> out;
  for (const auto& c : chunks_) {
    out.emplace_back();
    for (const auto& pl : c.pieces) out.back().push_back({pl.segment, pl.begin, pl.numel});
  }
  return out;
}

void StateOffload::step(double lr, const std::vector<double>* grad_multipliers,
                        const std::function<void(const optim::AdamW::Piece&)>& on_piece,
                        const std::function<void(const std::vector<size_t>&)>& before_chunk) {
  if (paged_in_) fail("internal: an optimizer step while the offloaded states are paged in");
  at::NoGradGuard no_grad;
  using Clock = std::chrono::steady_clock;
  auto waited = [&](util::FileStore::Ticket& t) {
    const auto t0 = Clock::now();
    t.wait();
    totals_.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  };
  adam_.begin_step();
  const size_t K = chunks_.size(), B = buffers_.size();
  // 8-bit blocks shared with other ranks: their absmax must be agreed before any piece steps.
  if (shares_blocks()) {
    for (const auto& c : chunks_) {
      bool has = false;
      for (const auto& pl : c.pieces) has = has || shares(pl);
      if (!has) continue;
      store_->read(c.file, buffers_[0].get(), c.bytes);
      totals_.bytes_read += c.bytes;
      adam_.collect_shared_maxima(pieces_in(c, buffers_[0].get()), grad_multipliers);
    }
  }
  adam_.reduce_shared_maxima();
  // Reads run `ahead` chunks in front of the step; a buffer is reused once its write has landed.
  const size_t ahead = std::max<size_t>(1, B - 2);
  std::vector<util::FileStore::Ticket> reads(K);
  std::vector<Pending> writes(B);
  size_t issued = 0;
  auto issue_reads = [&](size_t upto) {
    for (; issued < K && issued <= upto; ++issued) {
      const size_t slot = issued % B;
      land(writes[slot], &totals_.wait_seconds);
      reads[issued] = store_->read_async(chunks_[issued].file, buffers_[slot].get(), chunks_[issued].bytes);
      totals_.bytes_read += chunks_[issued].bytes;
    }
  };
  try {
    for (size_t k = 0; k < K; ++k) {
      issue_reads(k + ahead);
      waited(reads[k]);
      const size_t slot = k % B;
      if (before_chunk) {
        std::vector<size_t> segments;
        for (const auto& pl : chunks_[k].pieces) segments.push_back(pl.segment);
        before_chunk(segments);
      }
      const auto pieces = pieces_in(chunks_[k], buffers_[slot].get());
      adam_.step_pieces(lr, grad_multipliers, pieces);
      for (const auto& p : pieces) on_piece(p);
      start_write(writes[slot], k, buffers_[slot].get());
    }
    for (auto& w : writes) land(w, &totals_.wait_seconds);
  } catch (...) {
    // No buffer may be freed while the store still moves it.
    for (auto& r : reads) try { r.wait(); } catch (...) {}
    for (auto& w : writes) try { w.ticket.wait(); } catch (...) {}
    throw;
  }
}

}  // namespace shardlm::parallel
