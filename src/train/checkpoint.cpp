// See checkpoint.h.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "comm/communicator.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/parallel_dims.h"
#include "parallel/strategy.h"
#include "train/checkpoint_reader.h"
#include "util/crc32c.h"
#include "util/error.h"

namespace shardlm::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "shardlm-sharded-checkpoint-1";
constexpr const char* kMeta = "checkpoint.json";

std::string step_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%06lld", static_cast<long long>(step));
  return b;
}

// The step of a complete checkpoint directory's name ("step-000020"), or -1.
int64_t step_of(const std::string& name) {
  if (name.size() < 6 || name.rfind("step-", 0) != 0) return -1;
  const auto digits = name.substr(5);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open '", path, "' to flush it to disk");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("cannot flush '", path, "' to disk (disk full or failing?)");
}

// Written to path.tmp, flushed, renamed over path: a reader sees the old text or the new one.
void write_durably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) fail("cannot write '", tmp, "' (disk full?)");
  }
  fsync_path(tmp);
  fs::rename(tmp, path);
}

// "/rank-00003.safetensors": world rank r's shard, relative to its checkpoint directory.
std::string shard_file_name(int rank) {
  char file[40];
  std::snprintf(file, sizeof file, "/rank-%05d.safetensors", rank);
  return file;
}

// "<name>@<first element>" (ZeRO slices) or "<name>" (whole tensors).
std::pair<std::string, int64_t> split_segment_name(const std::string& segment) {
  const auto at = segment.rfind('@');
  if (at == std::string::npos) return {segment, 0};
  return {segment.substr(0, at), std::stoll(segment.substr(at + 1))};
}

int tp_rank(const parallel::ParallelDims& dims) { return dims.tp > 1 ? dims.tp_comm->rank() : 0; }

std::map<std::string, std::vector<int64_t>> local_shapes(const model::Llama& model, const parallel::ParallelDims& dims) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : model.parameters()) out[p.name] = p.tensor.sizes().vec();
  // Expert parallelism: a rank holds E/ep experts, an element range of the whole tensor (its
  // segments are named by it: parallel/expert/expert_parallel.h), so its pieces carry the whole shape.
  if (dims.expert_parallel())
    for (auto& [name, shape] : out)
      if (name.find(".mlp.experts.") != std::string::npos) shape[0] *= dims.ep;
  return out;
}

nlohmann::json read_meta(const std::string& dir) {
  const std::string path = dir + "/" + kMeta;
  std::ifstream f(path);
  if (!f)
    fail("'", path, "' is missing: the checkpoint is incomplete (a save that did not finish, or files removed)");
  try {
    nlohmann::json meta;
    f >> meta;
    if (meta.value("format", "") != kFormat) fail("'", path, "' is not a ", kFormat, " file");
    return meta;
  } catch (const nlohmann::json::exception& e) {
    fail("'", path, "' is corrupt (", e.what(), ")");
  }
}

// World rank 0: the complete checkpoint directories' steps, newest first (logging interrupted saves
// and restoring a checkpoint a crash left set aside between a save's renames); empty: none.
std::vector<int64_t> list_checkpoints(const std::string& out_dir, const std::function<void(const std::string&)>& log) {
  const std::string root = checkpoints_root(out_dir);
  if (!fs::exists(root)) {
    if (fs::exists(out_dir + "/checkpoint/state.json"))
      fail("out_dir '", out_dir, "' holds a checkpoint in the old whole-model format (", out_dir,
           "/checkpoint/), which this shardlm does not resume; pass --resume=false to start over, or move it away");
    return {};
  }
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") {
      if (e.is_directory())
        log("shardlm: ignoring " + e.path().string() + ": a save was interrupted before it completed");
      continue;
    }
    // A crash between the two renames of a save that replaced a checkpoint of the same step.
    const std::string replaced = ".replaced";
    if (name.size() > replaced.size() && name.substr(name.size() - replaced.size()) == replaced) {
      const std::string original = root + "/" + name.substr(0, name.size() - replaced.size());
      if (!fs::exists(original)) {
        log("shardlm: recovering " + original + " from " + e.path().string() + " (a save was interrupted between renames)");
        fs::rename(e.path(), original);
        const int64_t s = step_of(fs::path(original).filename().string());
        if (s >= 0) steps.push_back(s);
      }
      continue;
    }
    const int64_t s = step_of(name);
    if (s >= 0 && e.is_directory()) steps.push_back(s);
  }
  std::sort(steps.rbegin(), steps.rend());
  if (steps.empty()) log("shardlm: " + root + " holds no complete checkpoint; starting from step 0");
  return steps;
}

// The first of `steps` (newest first) whose directory `problem` finds nothing wrong with (it
// returns the reason, "" when usable), logging every one passed over; -1 when `steps` is empty.
// Fails when none is usable.
int64_t first_usable(const std::string& out_dir, const std::vector<int64_t>& steps,
                     const std::function<void(const std::string&)>& log,
                     const std::function<std::string(const std::string& dir, int64_t step)>& problem) {
  const std::string root = checkpoints_root(out_dir);
  std::string skipped;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string dir = root + "/" + step_name(steps[i]);
    const std::string why = problem(dir, steps[i]);
    if (why.empty()) {
      if (!skipped.empty()) log("shardlm: resuming from the previous good checkpoint " + dir);
      return steps[i];
    }
    skipped += "\n  " + why;
    log("shardlm: checkpoint " + dir + " is unusable: " + why +
        (i + 1 < steps.size() ? "; falling back to the previous one" : ""));
  }
  if (steps.empty()) return -1;
  fail("no usable checkpoint in '", root, "':", skipped, "\nMove '", root,
       "' away (or pass --resume=false) to start over; nothing was changed");
}

// checkpoint.json of dir, checked to record `step`.
nlohmann::json read_meta_of_step(const std::string& dir, int64_t step) {
  auto meta = read_meta(dir);
  if (meta.value("step", int64_t{-1}) != step)
    fail("'", dir, "/", kMeta, "' records step ", meta.value("step", int64_t{-1}), ", not ", step);
  return meta;
}

// Shard f of the checkpoint in dir: present, of the recorded size and CRC-32C, every floating value
// finite; fails naming the file and the problem.
void verify_shard(const std::string& dir, const nlohmann::json& meta, size_t f) {
  const auto& rec = meta.at("files").at(f);
  const std::string path = dir + "/" + rec.at("file").get<std::string>();
  if (!fs::exists(path)) fail("shard '", path, "' is missing");
  const auto bytes = static_cast<int64_t>(fs::file_size(path)), want = rec.at("bytes").get<int64_t>();
  if (bytes != want) fail("shard '", path, "' is truncated or extended: ", bytes, " bytes, ", kMeta, " records ", want);
  if (crc32c_file(path) != rec.at("crc32c").get<uint32_t>())
    fail("shard '", path, "' is corrupt: its CRC-32C does not match ", kMeta);
  CheckpointReader reader({path}, model::LlamaConfig{});
  for (const auto& p : reader.pieces_of(0)) {
    const auto t = reader.read_piece(0, p);
    if (t.is_floating_point() && !at::isfinite(t).all().item<bool>())
      fail("shard '", path, "': ", p.key, " holds inf or NaN values");
  }
}

// The reason, "" when none, that the checkpoint in dir is unusable. Collective over `world`: every
// rank verifies every world-size-th shard, so a resume reads each shard once, spread over the ranks,
// instead of all of them on one. World rank 0 returns the full reason; the others return "unusable".
std::string collective_problem(comm::Communicator& world, const std::string& dir, int64_t step) {
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  int64_t bad = kNone;  // -1: checkpoint.json; else the index of the first bad shard this rank checked
  std::string why;
  nlohmann::json meta;
  try {
    meta = read_meta_of_step(dir, step);
    for (size_t f = world.rank(); f < meta.at("files").size(); f += world.size()) {
      bad = static_cast<int64_t>(f);
      verify_shard(dir, meta, f);
      bad = kNone;
    }
  } catch (const nlohmann::json::exception& e) {
    bad = -1;
    why = std::string("'") + dir + "/" + kMeta + "' lacks its records (" + e.what() + ")";
  } catch (const std::exception& e) {  // every rank reaches the all-reduce below, whatever failed
    if (meta.is_null()) bad = -1;
    why = e.what();
  }
  auto t = at::tensor({bad}, at::kLong);
  world.all_reduce(t, comm::ReduceOp::Min);
  const int64_t first_bad = t.item<int64_t>();
  if (first_bad == kNone) return "";
  if (world.rank() != 0) return "unusable";
  if (first_bad == bad) return why;
  if (first_bad < 0) return "another rank could not read '" + dir + "/" + kMeta + "'";
  try {  // another rank found it: name the problem here too (one shard)
    verify_shard(dir, meta, static_cast<size_t>(first_bad));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "shard " + std::to_string(first_bad) + " failed verification on another rank";
}

}  // namespace

std::string checkpoints_root(const std::string& out_dir) { return out_dir + "/checkpoints"; }

std::string newest_usable_checkpoint(const std::string& out_dir, const std::function<void(const std::string&)>& log) {
  const int64_t step = first_usable(out_dir, list_checkpoints(out_dir, log), log, [](const std::string& dir, int64_t s) {
    try {
      read_meta_of_step(dir, s);
      verify_checkpoint(dir);
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  });
  return step < 0 ? "" : checkpoints_root(out_dir) + "/" + step_name(step);
}

bool has_checkpoint(const std::string& out_dir) {
  return fs::exists(checkpoints_root(out_dir)) || fs::exists(out_dir + "/checkpoint/state.json");
}

nlohmann::json verify_checkpoint(const std::string& dir) {
  auto meta = read_meta(dir);
  for (size_t f = 0; f < meta.at("files").size(); ++f) verify_shard(dir, meta, f);
  return meta;
}

class PendingCheckpoint {
 public:
  const parallel::ParallelDims* dims = nullptr;
  std::string root, final_dir, tmp;
  int64_t step = 0, optimizer_steps = 0;
  int keep = 1;
  nlohmann::json state, model_config_json;
  model::LlamaConfig model_config;
  at::Tensor record = at::zeros({3}, at::kLong);  // (has a shard, bytes, CRC-32C), filled by the writer
  std::exception_ptr error;
  std::thread writer;
  ~PendingCheckpoint() {
    if (writer.joinable()) writer.join();
  }
};

void PendingCheckpointDeleter::operator()(PendingCheckpoint* p) const { delete p; }

PendingCheckpointPtr begin_checkpoint(const std::string& out_dir, int64_t step, parallel::Strategy& strategy,
                                      const model::Llama& model, const parallel::ParallelDims& dims,
                                      const nlohmann::json& state, int keep, bool fresh, bool async) {
  auto& world = *dims.world;
  PendingCheckpointPtr p(new PendingCheckpoint);
  p->dims = &dims;
  p->root = checkpoints_root(out_dir);
  p->final_dir = p->root + "/" + step_name(step);
  p->tmp = p->final_dir + ".tmp";
  p->step = step;
  p->keep = keep;
  p->state = state;
  p->model_config = model.config();
  if (world.rank() == 0) {
    if (fresh) fs::remove_all(p->root);  // another run's (this one started over: resume=false)
    fs::create_directories(p->root);
    std::vector<fs::path> stale;  // interrupted saves; set-aside copies whose replacement is in place
    for (const auto& e : fs::directory_iterator(p->root))
      if ((e.path().extension() == ".tmp" && e.is_directory()) ||
          (e.path().extension() == ".replaced" && fs::exists(p->root + "/" + e.path().stem().string())))
        stale.push_back(e.path());
    for (const auto& path : stale) fs::remove_all(path);
    fs::create_directories(p->tmp);
  }
  world.barrier();

  // One view per optimizer: expert parallelism under ZeRO adds the experts' (parallel/expert/expert_zero.h).
  auto top = strategy.checkpoint_view();
  p->optimizer_steps = top.optimizer->steps_taken();
  std::vector<parallel::CheckpointView> views{top};
  views.insert(views.end(), top.more.begin(), top.more.end());
  if (std::none_of(views.begin(), views.end(), [](const parallel::CheckpointView& v) { return v.saves; })) {
    for (auto& view : views)
      if (view.release) view.release();
    return p;
  }
  // This rank's pieces, copied into host memory of their own: training may change the originals
  // while the writer works. Every rank checksums its own shard (while it is in the page cache) and
  // world rank 0 collects (has a shard, bytes, CRC-32C) of each, so no rank reads the others' back.
  const auto shapes = local_shapes(model, dims);
  io::NamedTensors tensors;
  std::vector<CheckpointPiece> pieces;
  for (const auto& view : views) {
    if (!view.saves) continue;
    const auto& segments = view.optimizer->segments();
    for (size_t k = 0; k < segments.size(); ++k) {
      const auto [name, begin] = split_segment_name(segments[k].name);
      auto add = [&](const std::string& kind, const at::Tensor& t) {
        CheckpointPiece piece{kind + "/" + name + "@" + std::to_string(begin), kind, name, begin, t.numel(),
                              tp_rank(dims), dims.tp, shapes.at(name)};
        const auto flat = t.detach().reshape({-1});
        tensors.emplace_back(piece.key, async ? flat.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true) : flat);
        pieces.push_back(std::move(piece));
      };
      add("master", segments[k].param);
      add("exp_avg", view.optimizer->exp_avg(k));
      add("exp_avg_sq", view.optimizer->exp_avg_sq(k));
      // bf16 masters with Kahan summation: the compensation is optimizer state, saved like the moments.
      if (view.optimizer->compensation(k).defined()) add("compensation", view.optimizer->compensation(k));
      if (view.optimizer->format(k) == optim::StatePrecision::Int8) {
        // 8-bit moments are saved as they are held: codes by element range (above) and one absmax
        // per quantization block, indexed by block. A block that a shard boundary cuts is held by
        // several ranks (alike, adamw.h set_shared_blocks); the one holding its first element saves it.
        const int64_t n = segments[k].param.numel(), b0 = optim::first_block(begin);
        const int64_t from = (begin + optim::kQuantBlock - 1) / optim::kQuantBlock, to = (begin + n - 1) / optim::kQuantBlock + 1;
        int64_t param_numel = 1;
        for (auto d : shapes.at(name)) param_numel *= d;
        const std::vector<int64_t> blocks{optim::blocks_touched(0, param_numel)};
        for (bool second : {false, true}) {
          if (from >= to) break;
          const std::string kind = second ? "exp_avg_sq.absmax" : "exp_avg.absmax";
          CheckpointPiece piece{kind + "/" + name + "@" + std::to_string(from), kind, name, from, to - from,
                                tp_rank(dims), dims.tp, blocks};
          const auto t = view.optimizer->absmax(k, second).slice(0, from - b0, to - b0).contiguous();
          tensors.emplace_back(piece.key, async ? t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true) : t);
          pieces.push_back(std::move(piece));
        }
      }
      if (k < view.working.size() && view.working[k].defined()) add("param", view.working[k]);
    }
  }
  const std::string path = p->tmp + shard_file_name(world.rank());
  PendingCheckpoint* pending = p.get();
  auto write = [pending, path, tensors = std::move(tensors), pieces = std::move(pieces)] {
    try {
      io::save_safetensors(path, tensors, {{"format", kFormat}, {"pieces", pieces_to_json(pieces)}});
      auto* rec = pending->record.data_ptr<int64_t>();
      rec[0] = 1;
      rec[1] = static_cast<int64_t>(fs::file_size(path));
      rec[2] = static_cast<int64_t>(crc32c_file(path));
    } catch (...) {
      pending->error = std::current_exception();
    }
  };
  if (async) pending->writer = std::thread(std::move(write));
  else write();
  for (auto& view : views)
    if (view.release) view.release();  // paged-in offloaded states: copied (async) or written by now
  return p;
}

double finish_checkpoint(PendingCheckpointPtr p) {
  auto& world = *p->dims->world;
  const auto t0 = std::chrono::steady_clock::now();
  if (p->writer.joinable()) p->writer.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A rank whose writer failed tells the others (a negative record), so every rank stops together.
  if (p->error) p->record.fill_(-1);
  auto records = at::empty({3 * world.size()}, at::kLong);
  world.all_gather(p->record, records);
  if (p->error) std::rethrow_exception(p->error);
  const int64_t* all = records.data_ptr<int64_t>();
  for (int r = 0; r < world.size(); ++r)
    if (all[3 * r] < 0) fail("rank ", r, " could not write its checkpoint shard of step ", p->step, " (see its message); ",
                             "the previous checkpoint is intact");
  const std::string &root = p->root, &final_dir = p->final_dir, &tmp = p->tmp;
  if (world.rank() == 0) {
    nlohmann::json meta = p->state;
    meta["format"] = kFormat;
    meta["step"] = p->step;
    meta["optimizer_steps"] = p->optimizer_steps;
    meta["model_config"] = model::to_hf_json(p->model_config);
    auto files = nlohmann::json::array();
    const int64_t* rec = all;
    for (int r = 0; r < world.size(); ++r, rec += 3)
      if (rec[0]) files.push_back({{"file", shard_file_name(r).substr(1)}, {"bytes", rec[1]},
                                   {"crc32c", static_cast<uint32_t>(rec[2])}});
    meta["files"] = files;
    model::write_hf_config(tmp + "/config.json", p->model_config);  // for export and inspection
    write_durably(tmp + "/" + kMeta, meta.dump(2) + "\n");
    fsync_path(tmp);
    // Into place. A checkpoint of the same step (one a resume passed over) is set aside until the
    // new one is in: a crash between the renames leaves step-N.replaced, which a resume restores.
    const std::string replaced = final_dir + ".replaced";
    fs::remove_all(replaced);
    if (fs::exists(final_dir)) fs::rename(final_dir, replaced);
    fs::rename(tmp, final_dir);
    fsync_path(root);
    fs::remove_all(replaced);
    write_durably(root + "/latest", step_name(p->step) + "\n");
    fsync_path(root);
    std::vector<int64_t> steps;
    for (const auto& e : fs::directory_iterator(root))
      if (const int64_t s = step_of(e.path().filename().string()); s >= 0 && e.is_directory()) steps.push_back(s);
    std::sort(steps.rbegin(), steps.rend());
    for (size_t i = static_cast<size_t>(std::max(p->keep, 1)); i < steps.size(); ++i)
      fs::remove_all(root + "/" + step_name(steps[i]));
  }
  world.barrier();
  return waited;
}

void save_checkpoint(const std::string& out_dir, int64_t step, parallel::Strategy& strategy, const model::Llama& model,
                     const parallel::ParallelDims& dims, const nlohmann::json& state, int keep, bool fresh) {
  finish_checkpoint(begin_checkpoint(out_dir, step, strategy, model, dims, state, keep, fresh, /*async=*/false));
}

std::optional<LoadedCheckpoint> load_checkpoint(const std::string& out_dir, parallel::Strategy& strategy,
                                                model::Llama& model, const parallel::ParallelDims& dims,
                                                const std::function<void(const std::string&)>& log) {
  auto& world = *dims.world;
  // World rank 0 lists the candidates (it alone renames a set-aside checkpoint back); every rank
  // then takes part in verifying each, newest first.
  std::vector<int64_t> steps;
  std::string error;
  if (world.rank() == 0) {
    try {
      steps = list_checkpoints(out_dir, log);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  auto count = at::tensor({error.empty() ? static_cast<int64_t>(steps.size()) : int64_t{-1}}, at::kLong);
  world.broadcast(count, 0);
  if (count.item<int64_t>() < 0) fail(world.rank() == 0 ? error : "world rank 0 could not list the checkpoints (see its message)");
  auto list = world.rank() == 0 ? at::tensor(steps, at::kLong) : at::empty({count.item<int64_t>()}, at::kLong);
  if (list.numel() > 0) world.broadcast(list, 0);
  steps.assign(list.data_ptr<int64_t>(), list.data_ptr<int64_t>() + list.numel());
  int64_t chosen = -1;
  try {
    chosen = first_usable(out_dir, steps, log,
                          [&world](const std::string& dir, int64_t s) { return collective_problem(world, dir, s); });
  } catch (const Error& e) {
    fail(world.rank() == 0 ? std::string(e.what()) : "world rank 0 found no usable checkpoint (see its message)");
  }
  if (chosen < 0) return std::nullopt;

  LoadedCheckpoint out{checkpoints_root(out_dir) + "/" + step_name(chosen), chosen, {}};
  out.meta = read_meta(out.dir);
  if (out.meta.at("model_config") != model::to_hf_json(model.config()))
    fail("checkpoint '", out.dir, "' was written for another model shape (its ", kMeta,
         " model_config); resume with the same model config or use another out_dir");
  std::vector<std::string> files;
  for (const auto& f : out.meta.at("files")) files.push_back(out.dir + "/" + f.at("file").get<std::string>());
  CheckpointReader reader(files, model.config());
  const auto shapes = local_shapes(model, dims);
  auto top = strategy.checkpoint_view();
  std::vector<parallel::CheckpointView> views{top};  // one per optimizer (see begin_checkpoint)
  views.insert(views.end(), top.more.begin(), top.more.end());
  at::NoGradGuard no_grad;
  for (const auto& view : views) {
    const auto& segments = view.optimizer->segments();
    for (size_t k = 0; k < segments.size(); ++k) {
      const auto [name, begin] = split_segment_name(segments[k].name);
      const int64_t n = segments[k].param.numel();
      auto read = [&](const std::string& kind) {
        return reader.read(kind, name, dims.tp, tp_rank(dims), shapes.at(name), begin, n);
      };
      const auto master = read("master");
      // fp32 and bf16 masters do not convert into each other silently (rounding fp32 masters to bf16,
      // or widening bf16 ones, would change the run); the saved dtype names the key.
      if (master.scalar_type() != segments[k].param.scalar_type())
        fail("checkpoint '", out.dir, "' holds ", name, "'s master weights as ", master.scalar_type(), ", this run keeps ",
             segments[k].param.scalar_type(), ": resume with the optimizer.master_precision the checkpoint was written "
             "with");
      segments[k].param.view({-1}).copy_(master);
      if (view.optimizer->compensation(k).defined()) {
        if (!reader.has("compensation", name))
          fail("checkpoint '", out.dir, "' holds no Kahan compensation for ", name, ": it was written without ",
               "optimizer.master_rounding \"kahan\"; resume with the optimizer.master_rounding it was written with");
        view.optimizer->compensation(k).view({-1}).copy_(read("compensation"));
      }
      for (bool second : {false, true}) {
        const auto& into = second ? view.optimizer->exp_avg_sq(k) : view.optimizer->exp_avg(k);
        const auto saved = read(second ? "exp_avg_sq" : "exp_avg");
        // fp32 and bf16 moments convert into each other; 8-bit codes mean nothing as numbers.
        if ((saved.scalar_type() == at::kByte) != (into.scalar_type() == at::kByte))
          fail("checkpoint '", out.dir, "' holds ", name, "'s Adam moments as ",
               saved.scalar_type() == at::kByte ? "8-bit codes" : "numbers", ", this run keeps them ",
               into.scalar_type() == at::kByte ? "8-bit" : "as numbers",
               ": resume with the optimizer.state_precision (and optimizer.min_8bit_size) the checkpoint was written with");
        into.view({-1}).copy_(saved);
      }
      if (view.optimizer->format(k) == optim::StatePrecision::Int8) {
        int64_t param_numel = 1;
        for (auto d : shapes.at(name)) param_numel *= d;
        const std::vector<int64_t> blocks{optim::blocks_touched(0, param_numel)};
        for (bool second : {false, true}) {
          const auto& into = view.optimizer->absmax(k, second);
          into.copy_(reader.read(second ? "exp_avg_sq.absmax" : "exp_avg.absmax", name, dims.tp, tp_rank(dims), blocks,
                                 optim::first_block(begin), into.numel()));
        }
      }
    }
    view.loaded(out.meta.at("optimizer_steps").get<int64_t>(), chosen);
  }
  return out;
}

}  // namespace shardlm::train
